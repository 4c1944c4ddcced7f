# Copyright The Lightning AI team.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
import torch

from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.demos.boring_classes import BoringModel
from tests_pytorch.helpers.runif import RunIf

# `torch.compiler.config.dynamic_sources` matched as regular expressions
pytestmark = RunIf(min_torch="2.8")


class CountingBackend:
    def __init__(self):
        self.graphs = 0
        self.calls = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1

        def run(*args):
            self.calls += 1
            return gm.forward(*args)

        return run

    def __deepcopy__(self, memo):
        return self  # Lightning keeps a deep copy of the arguments of `torch.compile`


class CurriculumModel(BoringModel):
    def training_step(self, batch, batch_idx):
        loss = self.step(batch)
        if self.current_epoch == 0:
            loss = loss * 2
        return loss * min(1.0, 0.1 + self.global_step / 50)


def test_current_epoch_and_global_step_compile_once(tmp_path):
    seed_everything(0)
    backend = CountingBackend()
    model = CurriculumModel()
    trainer = Trainer(
        default_root_dir=tmp_path,
        use_compile={"backend": backend, "dynamic_loop_counters": True},
        max_epochs=10,
        limit_train_batches=4,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    original = torch.compiler.config.dynamic_sources
    trainer.fit(model)
    # every step ran compiled: epoch 0 and the epochs after it compile once each
    assert backend.calls == 10 * 4
    assert backend.graphs == 2
    assert torch.compiler.config.dynamic_sources == original
