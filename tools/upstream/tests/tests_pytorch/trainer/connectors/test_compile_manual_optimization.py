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

# `Trainer(use_compile=...)` needs torch 2.2 (`nn.Module.compile`)
pytestmark = RunIf(min_torch="2.2")


class BackwardTwice(BoringModel):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss = self.step(batch)
        opt.zero_grad()
        self.manual_backward(loss, retain_graph=True)
        self.manual_backward(loss)
        opt.step()


def _fit(tmp_path, use_compile):
    seed_everything(1)
    model = BackwardTwice()
    trainer = Trainer(
        default_root_dir=tmp_path,
        use_compile=use_compile,
        max_steps=3,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(model)
    return model


@RunIf(min_torch="2.6", dynamo=True)
def test_manual_optimization_runs_the_backward_twice_compiled(tmp_path, caplog):
    import torch._functorch.config as functorch_config

    eager = _fit(tmp_path, None)
    compiled = _fit(tmp_path, {"backend": "aot_eager"})  # donated buffers would refuse the second backward
    for expected, actual in zip(eager.parameters(), compiled.parameters(), strict=True):
        torch.testing.assert_close(actual, expected)
    assert functorch_config.donated_buffer  # restored after the run
