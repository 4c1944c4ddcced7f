"""Step patterns from Lightning's docs, trained long enough to pass Dynamo's recompile limit (8).

Each pattern trains 10 epochs of 10 batches, eagerly and with `use_compile`, and must give the same losses and logged
values, with every step compiled (its own graphs ran during it) and nothing compiled again after the second epoch.
"""

import pytest
import torch
from packaging.version import Version
from torch.utils.data import DataLoader

from helpers import QUIET, CountingBackend, last_summary
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset

EPOCHS, BATCHES = 10, 10
#: torch 2.8+ marks sources dynamic by pattern (`torch.compiler.config.dynamic_sources`); older torch guards the
#: counters by value.
DYNAMIC_SOURCES = Version(torch.__version__.split("+")[0]) >= Version("2.8")


class Pattern(BoringModel):
    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 64 * BATCHES), batch_size=64)

    def training_step(self, batch, batch_idx):
        loss = self.objective(batch, batch_idx)
        self.log("train_loss", loss)
        return loss

    def objective(self, batch, batch_idx):
        return self.step(batch)


class Curriculum(Pattern):
    """`if self.current_epoch == 0:` (common/lightning_module.rst): the first epoch weighs the loss differently."""

    def objective(self, batch, batch_idx):
        loss = self.step(batch)
        if self.current_epoch == 0:
            return loss * 2
        return loss


class Annealing(Pattern):
    """A KL-style annealing weight that grows with `self.global_step`."""

    def objective(self, batch, batch_idx):
        weight = min(1.0, 0.1 + self.global_step / 50)
        return self.step(batch) * weight


class EpochScaled(Pattern):
    """A warm-up read as arithmetic on `self.current_epoch`."""

    def objective(self, batch, batch_idx):
        return self.step(batch) * (1 + self.current_epoch) / EPOCHS


class EveryOtherBatch(Pattern):
    """A branch on `batch_idx`, as in "log images every N batches" without the image."""

    def objective(self, batch, batch_idx):
        loss = self.step(batch)
        if batch_idx % 2 == 0:
            self.log("even_batch_loss", loss)
        return loss


class Recorder(Callback):
    """Per training batch: the loss, and how often the compiled graphs ran; per epoch, the graphs compiled so far."""

    def __init__(self, backend=None):
        self.backend = backend
        self.losses, self.graph_runs, self.graphs_per_epoch = [], [], []

    def on_train_batch_start(self, *args):
        self._calls = self.backend.calls if self.backend else 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(outputs["loss"].item())
        if self.backend:
            self.graph_runs.append(self.backend.calls - self._calls)

    def on_train_epoch_end(self, trainer, pl_module):
        if self.backend:
            self.graphs_per_epoch.append(self.backend.graphs)


def train(pattern, strategy, backend=None):
    seed_everything(0)
    model, recorder = pattern(), Recorder(backend)
    trainer = Trainer(
        strategy=strategy,
        use_compile={"backend": backend} if backend else None,
        max_epochs=EPOCHS,
        limit_val_batches=0,
        callbacks=[recorder],
        **QUIET,
    )
    trainer.fit(model)
    return recorder, trainer


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
@pytest.mark.parametrize(
    "pattern",
    [
        pytest.param(Curriculum, marks=pytest.mark.skipif(not DYNAMIC_SOURCES, reason="needs dynamic_sources")),
        pytest.param(Annealing, marks=pytest.mark.skipif(not DYNAMIC_SOURCES, reason="needs dynamic_sources")),
        pytest.param(EpochScaled, marks=pytest.mark.skipif(not DYNAMIC_SOURCES, reason="needs dynamic_sources")),
        EveryOtherBatch,
    ],
)
def test_the_pattern_trains_as_eager_with_every_step_compiled(pattern, strategy):
    eager, _ = train(pattern, strategy)
    backend = CountingBackend(f"{pattern.__name__}-{strategy}")
    compiled, trainer = train(pattern, strategy, backend)
    assert len(compiled.losses) == EPOCHS * BATCHES
    torch.testing.assert_close(compiled.losses, eager.losses)
    # every step ran graphs of its own, and nothing compiled again after the second epoch
    assert all(runs > 0 for runs in compiled.graph_runs), compiled.graph_runs
    assert compiled.graphs_per_epoch[1:] == [compiled.graphs_per_epoch[1]] * (EPOCHS - 1), compiled.graphs_per_epoch
    summary = last_summary(trainer)
    assert summary.compiled_steps == {"training": EPOCHS * BATCHES}, summary
    assert summary.eager_steps == {}, summary
    assert summary.recompile_limit_hits == []
