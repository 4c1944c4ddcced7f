"""The tuner's trials run compiled: the model is compiled right after the strategy's setup, before `on_fit_start`.

`Tuner.lr_find` and `Tuner.scale_batch_size` (and the `LearningRateFinder` and `BatchSizeFinder` callbacks) run their
trials from `on_fit_start`. Compiled any later, the learning rate and the batch size found would come from an
uncompiled run, whose speed and memory are not those of the training that follows.
"""

import pytest
import torch
from torch.utils.data import DataLoader

from helpers import QUIET, CountingBackend, last_summary
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import LearningRateFinder
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from lightning.pytorch.tuner import Tuner


class TunableModel(BoringModel):
    """Records, for each training batch, how often the graphs of ``backend`` ran during it.

    In the model, not a callback: the tuner runs its trials with callbacks of its own in place of the Trainer's.
    """

    def __init__(self, batch_size: int = 2, lr: float = 0.1, backend: CountingBackend = None) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.lr = lr
        self.backend = backend
        self.per_batch: list[int] = []

    def on_train_batch_start(self, *args):
        self._calls = self.backend.calls if self.backend is not None else 0

    def on_train_batch_end(self, *args):
        if self.backend is not None:
            self.per_batch.append(self.backend.calls - self._calls)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 64), batch_size=self.batch_size)


def test_lr_find_trials_run_compiled():
    backend = CountingBackend("lr_find")
    model = TunableModel(backend=backend)
    trainer = Trainer(use_compile={"backend": backend}, max_epochs=1, **QUIET)
    finder = Tuner(trainer).lr_find(model, num_training=6, early_stop_threshold=None)
    assert len(finder.results["lr"]) == 6
    assert len(model.per_batch) == 6
    assert all(calls > 0 for calls in model.per_batch), model.per_batch
    summary = last_summary(trainer)
    assert summary.compiled_steps.get("training", 0) >= 6, summary
    assert summary.eager_steps == {}, summary


def test_scale_batch_size_trials_run_compiled():
    def scale(use_compile, backend=None):
        model = TunableModel(batch_size=2, backend=backend)
        trainer = Trainer(use_compile=use_compile, max_epochs=1, **QUIET)
        found = Tuner(trainer).scale_batch_size(model, mode="power", steps_per_trial=2, max_trials=3)
        return found, model, trainer

    eager_found, _, _ = scale(None)
    backend = CountingBackend("scale_batch_size")
    found, model, trainer = scale({"backend": backend}, backend)
    assert found == eager_found == 8  # trials at 2, 4 and 8: none runs out of memory on a CPU
    assert len(model.per_batch) == 3 * 2
    assert all(calls > 0 for calls in model.per_batch), model.per_batch
    assert last_summary(trainer).eager_steps == {}


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_a_compiled_model_runs_compiled_in_the_lr_finder_callback(strategy):
    """Without `use_compile`: a `torch.compile`-d model is compiled again after the wrap, before `on_fit_start`."""
    backend = CountingBackend(f"finder_{strategy}")
    model = TunableModel(backend=backend)
    finder = LearningRateFinder(num_training_steps=5, early_stop_threshold=None)
    trainer = Trainer(strategy=strategy, max_steps=2, callbacks=[finder], **QUIET)
    trainer.fit(torch.compile(model, backend=backend))
    assert finder.optimal_lr is not None
    assert len(model.per_batch) == 5 + 2  # the finder's trials, then the training
    assert all(calls > 0 for calls in model.per_batch), model.per_batch
