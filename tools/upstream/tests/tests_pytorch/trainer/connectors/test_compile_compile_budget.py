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
import torch
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


def _trainer(backend, **kwargs):
    options = {
        "use_compile": {"backend": backend, "compile_budget": True},
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "accelerator": "cpu",
        "devices": 1,
        "num_sanity_val_steps": 0,
    }
    return Trainer(**{**options, **kwargs})


def test_the_runs_of_one_trainer_share_their_compiled_steps():
    backend = CountingBackend()
    # `inference_mode=False`: `validate` runs under `no_grad`, as fit's validation does, so one graph serves both
    options = {"max_steps": 2, "val_check_interval": 2, "limit_val_batches": 2}
    trainer, model = _trainer(backend, inference_mode=False, **options), SizedModel(8)
    trainer.fit(model)
    _trainer(CountingBackend(), **options).fit(SizedModel(9))  # another Trainer in between
    compiled = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    trainer.validate(model)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == compiled  # fit's validation step, kept
    assert backend.calls >= 2 + 2 + 2  # and it ran: two training, two validation steps in fit, two in validate


def _raising_at(batch):
    class Raises(SizedModel):  # a new class per trial, the same code
        def validation_step(self, batch_, batch_idx):
            if self.current_epoch == 1 and batch_idx == batch:
                raise ValueError("stop this trial")
            return super().validation_step(batch_, batch_idx)

    return Raises(8)


def test_trials_that_raise_in_their_step_each_compile_that_step():
    # Dynamo marks a step "skip" when it traces a `raise`, keeping its entries: without a reset, from the third trial
    # on the validation step ran uncompiled
    for batch in [0, 1, 2, 0, 1]:
        backend = CountingBackend()
        trainer = _trainer(backend, max_epochs=2, limit_train_batches=1, limit_val_batches=3)
        with pytest.raises(ValueError, match="stop this trial"):
            trainer.fit(_raising_at(batch))
        # two training steps, three validation steps in the first epoch and `batch` in the second, each compiled
        assert backend.calls >= 2 + 3 + batch, batch
