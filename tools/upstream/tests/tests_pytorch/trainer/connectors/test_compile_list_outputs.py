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

from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.demos.boring_classes import BoringModel
from tests_pytorch.helpers.runif import RunIf

# `Trainer(use_compile=...)` needs torch 2.6
pytestmark = RunIf(min_torch="2.6", dynamo=True)

EPOCHS, BATCHES = 10, 4


class CountingBackend:
    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward

    def __deepcopy__(self, memo):
        return self


class Record(Callback):
    """The loss of each batch, and the graphs compiled by the end of each epoch."""

    def __init__(self, backend=None):
        self.backend, self.losses, self.graphs = backend, [], []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(outputs["loss"].item())

    def on_train_epoch_end(self, trainer, pl_module):
        self.graphs.append(self.backend.graphs if self.backend else 0)


def _fit(model_cls, key=None):
    seed_everything(0)
    backend = CountingBackend() if key else None
    record = Record(backend)
    trainer = Trainer(
        use_compile={"backend": backend, key: True} if key else None,
        max_epochs=EPOCHS,
        limit_train_batches=BATCHES,
        limit_val_batches=0,
        callbacks=[record],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model_cls())
    return record


def _assert_compiles_once_and_trains_as_eager(model_cls, key):
    eager, compiled = _fit(model_cls), _fit(model_cls, key)
    torch.testing.assert_close(compiled.losses, eager.losses)
    assert compiled.graphs[1:] == [compiled.graphs[1]] * (EPOCHS - 1), compiled.graphs  # nothing compiled again


class StepOutputs(BoringModel):
    def __init__(self):
        super().__init__()
        self.outputs = []

    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        self.outputs.append(out["loss"].detach())
        return out

    def on_train_epoch_end(self):
        self.log("epoch_mean", torch.stack(self.outputs).mean())
        self.outputs.clear()


def test_a_list_the_step_appends_to_does_not_recompile_it():
    _assert_compiles_once_and_trains_as_eager(StepOutputs, "list_outputs")
