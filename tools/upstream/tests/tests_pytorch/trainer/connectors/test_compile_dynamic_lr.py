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
from lightning.pytorch.core.optimizer import LightningOptimizer
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


class LoggedLearningRate(BoringModel):
    def training_step(self, batch, batch_idx):
        # read in the step, as `self.log("lr", ...)` does (returned, since the 2.6 series' `self.log` needs a key)
        lr = self.optimizers().param_groups[0]["lr"]
        return {**super().training_step(batch, batch_idx), "lr": torch.tensor(lr)}

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=EPOCHS * BATCHES)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def test_the_learning_rate_logged_in_the_step_does_not_recompile_it():
    _assert_compiles_once_and_trains_as_eager(LoggedLearningRate, "dynamic_lr")


def _fit_one_epoch(model, backend="eager"):
    trainer = Trainer(
        use_compile={"backend": backend, "dynamic_lr": True},
        max_epochs=1,
        limit_train_batches=BATCHES,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model)


class ChecksItsOptimizer(BoringModel):
    def __init__(self):
        super().__init__()
        self.seen = []

    def training_step(self, batch, batch_idx):
        self.seen.append(isinstance(self.optimizers(), LightningOptimizer))
        return super().training_step(batch, batch_idx)


def test_the_step_gets_a_lightning_optimizer():
    model, backend = ChecksItsOptimizer(), CountingBackend()
    _fit_one_epoch(model, backend)
    assert backend.graphs > 0
    assert model.seen == [True] * BATCHES


class CountsOptimizersCalls(BoringModel):
    """Sets its own `optimizers` on the instance, as `test_fx_validator_integration`'s model does."""

    def __init__(self):
        super().__init__()
        self.calls = 0
        optimizers = self.optimizers

        def counted(*args, **kwargs):
            self.calls += 1
            return optimizers(*args, **kwargs)

        self.optimizers = counted


def test_no_hook_of_the_module_runs_that_the_step_did_not_call():
    model = CountsOptimizersCalls()
    _fit_one_epoch(model)
    assert model.calls == 0
