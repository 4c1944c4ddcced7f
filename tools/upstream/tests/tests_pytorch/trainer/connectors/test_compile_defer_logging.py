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
from torch._dynamo.utils import counters

from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from tests_pytorch.helpers.runif import RunIf

# `Trainer(use_compile=...)` needs torch 2.6
pytestmark = RunIf(min_torch="2.6")


class LoggingModel(BoringModel):
    def training_step(self, batch, batch_idx):
        loss = self.step(batch)
        self.log("train_loss", loss)
        self.log_dict({"twice": 2 * loss})
        return loss


@RunIf(dynamo=True)
def test_log_under_use_compile_keeps_one_graph(tmp_path):
    torch._dynamo.reset()
    counters.clear()
    trainer = Trainer(
        default_root_dir=tmp_path,
        use_compile={"backend": "eager", "fullgraph": True, "defer_logging": True},
        max_steps=2,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    model = LoggingModel()
    trainer.fit(model)
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]
    assert set(trainer.callback_metrics) == {"train_loss", "twice"}
    assert torch.allclose(2 * trainer.callback_metrics["train_loss"], trainer.callback_metrics["twice"])
    assert not {"log", "log_dict"} & set(model.__dict__)
