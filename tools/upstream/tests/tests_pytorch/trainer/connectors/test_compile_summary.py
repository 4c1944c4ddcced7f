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
import logging

import pytest
import torch

from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from tests_pytorch.helpers.runif import RunIf

# `Trainer(use_compile=...)` needs torch 2.6
pytestmark = RunIf(min_torch="2.6")

_TRAINER_KWARGS = {
    "max_steps": 2,
    "limit_val_batches": 0,
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "accelerator": "cpu",
}


@RunIf(dynamo=True)
def test_run_summary_is_logged(tmp_path, caplog):
    torch._dynamo.reset()
    trainer = Trainer(default_root_dir=tmp_path, use_compile={"backend": "eager", "summary": True}, **_TRAINER_KWARGS)
    with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
        trainer.fit(BoringModel())
    assert "compiling the first training step" in caplog.text
    assert "the first compiled training step took" in caplog.text
    assert "`use_compile` (fit, SingleDeviceStrategy, eager): 1 graph, 0 recompiles, 0 graph breaks" in caplog.text


class ShapeShifter(BoringModel):
    """Each step has a new batch size, so that the step recompiles each time."""

    def training_step(self, batch, batch_idx):
        return super().training_step(batch[: batch_idx + 1], batch_idx)


@RunIf(dynamo=True)
def test_recompile_limit_hit_warns(tmp_path):
    import torch._dynamo.config as dynamo_config

    torch._dynamo.reset()
    limit = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    trainer = Trainer(
        default_root_dir=tmp_path,
        use_compile={"backend": "eager", "dynamic": False, "summary": True},
        **{**_TRAINER_KWARGS, "max_steps": 4},
    )
    # `config.patch`, not `monkeypatch.setattr`: Dynamo's config module does not take an attribute set back that way
    with dynamo_config.patch(**{limit: 2}), pytest.warns(UserWarning, match="hit Dynamo's recompile limit"):
        trainer.fit(ShapeShifter())
    # the filter on Dynamo's logger is gone after the run
    assert not logging.getLogger("torch._dynamo.convert_frame").filters
