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
import torch._dynamo.config as dynamo_config

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from tests_pytorch.helpers.runif import RunIf

# `Trainer(use_compile=...)` needs torch 2.6
pytestmark = RunIf(min_torch="2.6")


class RecordOptimizeDDP(Callback):
    def on_train_batch_start(self, *_):
        self.value = dynamo_config.optimize_ddp


@RunIf(dynamo=True, skip_windows=True)
@pytest.mark.parametrize(
    ("choice", "during_run"), [("auto", False), (True, True), ("no_optimization", "no_optimization")]
)
def test_optimize_ddp_is_set_for_the_run_and_restored(tmp_path, choice, during_run):
    before = dynamo_config.optimize_ddp
    record = RecordOptimizeDDP()
    trainer = Trainer(
        default_root_dir=tmp_path,
        strategy="ddp",
        devices=1,
        accelerator="cpu",
        use_compile={"backend": "eager", "optimize_ddp": choice},
        callbacks=[record],
        max_steps=1,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(BoringModel())
    assert record.value == during_run  # "auto": no split with a single process
    assert dynamo_config.optimize_ddp == before


@pytest.mark.parametrize("value", [1, "fast"])
def test_optimize_ddp_rejects_unknown_values(value):
    with pytest.raises(ValueError, match="Choose one of"):
        Trainer(use_compile={"optimize_ddp": value})
