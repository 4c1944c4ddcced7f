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
from unittest import mock

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


class ManualScheduled(BoringModel):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        loss = self.step(batch)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        if self.trainer.is_last_batch and (self.current_epoch + 1) % 2 == 0:
            scheduler.step()
        return {"loss": loss}

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=0.01)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]


def test_manual_optimization_with_a_scheduler_trains_as_eager_and_compiles_once():
    _assert_compiles_once_and_trains_as_eager(ManualScheduled, "eager_optimizer_steps")


class TwoOptimizers(BoringModel):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        first, second = self.optimizers()
        loss = self.step(batch)
        first.zero_grad()
        second.zero_grad()
        self.manual_backward(loss)
        first.step()
        second.step()
        self.lr_schedulers().step()
        return {"loss": loss}

    def configure_optimizers(self):
        first = torch.optim.SGD(self.layer.parameters(), lr=0.1)
        second = torch.optim.Adam(self.layer.parameters(), lr=0.1)
        return [first, second], [torch.optim.lr_scheduler.StepLR(first, step_size=1)]


def _shared_classes():
    classes = (LightningOptimizer, torch.optim.lr_scheduler.StepLR, torch.optim.lr_scheduler.LRScheduler)
    return {(cls, name): vars(cls).get(name) for cls in classes for name in ("step", "zero_grad")}


class SharedClassesProbe(Callback):
    def on_train_batch_end(self, *args):
        self.during = _shared_classes()


def test_manual_optimization_changes_no_shared_class_and_mocks_see_every_call():
    probe = SharedClassesProbe()
    trainer = Trainer(
        use_compile={"backend": "eager", "eager_optimizer_steps": True},
        max_epochs=1,
        limit_train_batches=BATCHES,
        limit_val_batches=0,
        callbacks=[probe],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with (
        mock.patch.multiple(torch.optim.SGD, zero_grad=mock.DEFAULT, step=mock.DEFAULT) as sgd,
        mock.patch.object(torch.optim.lr_scheduler.StepLR, "step") as scheduler_step,
    ):
        before = _shared_classes()
        trainer.fit(TwoOptimizers())
        after = _shared_classes()
    assert probe.during == before
    assert after == before
    assert type(trainer.lr_scheduler_configs[0].scheduler) is torch.optim.lr_scheduler.StepLR
    assert [sgd["step"].call_count, sgd["zero_grad"].call_count] == [BATCHES, BATCHES]
    assert scheduler_step.call_count == 1 + BATCHES  # `StepLR.__init__` steps it once


class IncompatibleScheduler:
    def __init__(self, optimizer):
        self.optimizer = optimizer

    def state_dict(self):
        return {}

    def load_state_dict(self, _):
        pass


class ManualWithIncompatibleScheduler(ManualScheduled):
    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        loss = self.step(batch)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return {"loss": loss}

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.layer.parameters(), lr=0.1)
        return [optimizer], [IncompatibleScheduler(optimizer)]


def test_manual_optimization_takes_a_scheduler_without_step():
    """Manual optimization allows a scheduler that does not follow PyTorch's interface."""
    record = _fit(ManualWithIncompatibleScheduler, "eager_optimizer_steps")
    assert len(record.losses) == EPOCHS * BATCHES
