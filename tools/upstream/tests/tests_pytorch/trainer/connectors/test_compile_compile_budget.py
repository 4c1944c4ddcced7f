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
import pytest
from torch import nn

from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from tests_pytorch.helpers.runif import RunIf

# `Trainer(use_compile=...)` needs torch 2.6
pytestmark = RunIf(min_torch="2.6", dynamo=True)


class CountingBackend:
    def __init__(self):
        self.calls = 0

    def __call__(self, gm, example_inputs):
        def run(*args):
            self.calls += 1
            return gm.forward(*args)

        return run


class SizedModel(BoringModel):
    def __init__(self, width):
        super().__init__()
        self.layer = nn.Sequential(nn.Linear(32, width), nn.Linear(width, 2))


@pytest.mark.parametrize("strategy", ["auto", pytest.param("ddp", marks=RunIf(skip_windows=True))])
def test_every_trainer_of_a_sweep_compiles_every_step(tmp_path, strategy):
    for width in range(8, 20):  # 12 trials of one model class in one process, more than the recompile limit
        backend = CountingBackend()
        trainer = Trainer(
            default_root_dir=tmp_path,
            strategy=strategy,
            use_compile={"backend": backend, "compile_budget": True},
            max_steps=2,
            limit_val_batches=0,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
            devices=1,
        )
        trainer.fit(SizedModel(width))
        assert backend.calls >= 2, width  # both steps ran compiled graphs
