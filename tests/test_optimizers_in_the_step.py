"""What a compiled step sees of its optimizers and schedulers, and what the run changes of them (`dynamic_lr`,
`eager_optimizer_steps`, both on by default).

The step gets what eager code gets: a `LightningOptimizer` from `self.optimizers()`, the configured schedulers, and
mocks that count every call. No class that other code shares is changed during the run, no hook of the module runs that
the step did not call, and a scheduler that does not follow torch's interface trains as eagerly.
"""

from unittest import mock

import torch
from torch.optim.lr_scheduler import LRScheduler, StepLR

from helpers import QUIET, CountingBackend, last_summary
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.demos.boring_classes import BoringModel


class ManualWithScheduler(BoringModel):
    """Manual optimization as the docs write it: two optimizers, a scheduler stepped in the step."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.seen = []

    def training_step(self, batch, batch_idx):
        first, second = self.optimizers()
        self.seen.append((isinstance(first, LightningOptimizer), isinstance(second, LightningOptimizer)))
        loss = self.step(batch)
        first.zero_grad()
        second.zero_grad()
        self.manual_backward(loss)
        first.step()
        second.step()
        self.lr_schedulers().step()
        return loss

    def configure_optimizers(self):
        first = torch.optim.SGD(self.layer.parameters(), lr=0.1)
        second = torch.optim.Adam(self.layer.parameters(), lr=0.1)
        return [first, second], [StepLR(first, step_size=1)]


#: Every class attribute the run could change: what the optimizers' and the schedulers' steps resolve to.
SHARED = [(cls, name) for cls in (LightningOptimizer, StepLR, LRScheduler) for name in ("step", "zero_grad")]


def shared_state():
    return {(cls.__name__, name): vars(cls).get(name) for cls, name in SHARED}


class SharedStateProbe(Callback):
    def __init__(self):
        self.during = None

    def on_train_batch_end(self, trainer, *args):
        self.during = shared_state()


def fit(model, **kwargs):
    trainer = Trainer(max_epochs=1, limit_train_batches=4, limit_val_batches=0, **QUIET, **kwargs)
    trainer.fit(model)
    return trainer


def test_the_step_gets_lightning_optimizers_from_self_optimizers():
    model, backend = ManualWithScheduler(), CountingBackend()
    trainer = fit(model, use_compile={"backend": backend})
    assert model.seen == [(True, True)] * 4
    assert last_summary(trainer).compiled_steps == {"training": 4}, last_summary(trainer)


def test_manual_optimization_changes_no_class_that_other_code_shares():
    before, probe = shared_state(), SharedStateProbe()
    fit(ManualWithScheduler(), use_compile={"backend": "eager"}, callbacks=[probe])
    assert probe.during == before
    assert shared_state() == before


def test_a_mock_of_the_optimizers_class_sees_every_call_of_a_manual_step():
    with (
        mock.patch.multiple(torch.optim.SGD, zero_grad=mock.DEFAULT, step=mock.DEFAULT) as sgd,
        mock.patch.multiple(torch.optim.Adam, zero_grad=mock.DEFAULT, step=mock.DEFAULT) as adam,
        mock.patch.object(StepLR, "step") as scheduler_step,
    ):
        fit(ManualWithScheduler(), use_compile={"backend": "eager"})
    assert [sgd["step"].call_count, sgd["zero_grad"].call_count] == [4, 4]
    assert [adam["step"].call_count, adam["zero_grad"].call_count] == [4, 4]
    assert scheduler_step.call_count == 1 + 4  # `StepLR.__init__` steps it once


def test_the_schedulers_class_is_its_own_again_after_the_run():
    model = ManualWithScheduler()
    trainer = fit(model, use_compile={"backend": "eager"})
    assert type(trainer.lr_scheduler_configs[0].scheduler) is StepLR


class CountsOptimizersCalls(BoringModel):
    """A module that wraps its `optimizers` on the instance, as Lightning's own hook tests do."""

    def __init__(self):
        super().__init__()
        self.optimizers_calls = 0
        optimizers = self.optimizers

        def counted(*args, **kwargs):
            self.optimizers_calls += 1
            return optimizers(*args, **kwargs)

        self.optimizers = counted


def test_no_hook_of_the_module_runs_that_the_step_did_not_call():
    model = CountsOptimizersCalls()
    fit(model, use_compile={"backend": "eager"})
    assert model.optimizers_calls == 0


class IncompatibleScheduler:
    """A scheduler that does not follow torch's interface, which manual optimization allows."""

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def state_dict(self):
        return {}

    def load_state_dict(self, _):
        pass


class ManualWithIncompatibleScheduler(BoringModel):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        optimizer.zero_grad()
        loss = self.step(batch)
        self.manual_backward(loss)
        optimizer.step()
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.layer.parameters(), lr=0.1)
        return [optimizer], [IncompatibleScheduler(optimizer)]


def test_manual_optimization_takes_a_scheduler_without_step():
    trainer = fit(ManualWithIncompatibleScheduler(), use_compile={"backend": "eager"})
    assert trainer.global_step == 4
