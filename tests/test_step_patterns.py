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
ONLY_2_13 = pytest.mark.skipif(Version(torch.__version__.split("+")[0]) < Version("2.13"), reason="seen on 2.13")
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


class LoggedLearningRate(Pattern):
    """The learning rate logged in the step, under a scheduler stepped every batch (OneCycleLR moves the betas too)."""

    def training_step(self, batch, batch_idx):
        self.log("lr", self.optimizers().param_groups[0]["lr"])
        return super().training_step(batch, batch_idx)

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=EPOCHS * BATCHES)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class StepOutputs(Pattern):
    """`self.outputs.append(...)` in the step, read and cleared in `on_train_epoch_end`, as the docs show."""

    def __init__(self):
        super().__init__()
        self.outputs = []

    def objective(self, batch, batch_idx):
        loss = self.step(batch)
        self.outputs.append(loss.detach())
        self.log("last_output", self.outputs[-1])  # the step reads what it appended
        return loss

    def on_train_epoch_end(self):
        self.log("epoch_mean", torch.stack(self.outputs).mean())
        self.outputs.clear()


class MemoryBank(Pattern):
    """A queue of the last outputs, concatenated in the step: torch takes only a real list."""

    def __init__(self):
        super().__init__()
        self.queue = []

    def objective(self, batch, batch_idx):
        out = self.layer(batch)
        self.queue.append(out.detach())
        if len(self.queue) > 3:
            self.queue.pop(0)
        return out.sum() + torch.cat(self.queue).mean()


class ManualScheduled(Pattern):
    """Manual optimization, with a scheduler stepped in the step every second epoch."""

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
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=0.01)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]


class GAN(Pattern):
    """Two optimizers, each toggled in turn (`self.toggle_optimizer`), as in the docs' GAN."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.critic = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        generator_optimizer, critic_optimizer = self.optimizers()
        fake = self.layer(batch)
        self.toggle_optimizer(generator_optimizer)
        generator_loss = self.critic(fake).mean()
        generator_optimizer.zero_grad()
        self.manual_backward(generator_loss)
        generator_optimizer.step()
        self.untoggle_optimizer(generator_optimizer)
        self.toggle_optimizer(critic_optimizer)
        critic_loss = self.critic(fake.detach()).pow(2).mean()
        critic_optimizer.zero_grad()
        self.manual_backward(critic_loss)
        critic_optimizer.step()
        self.untoggle_optimizer(critic_optimizer)
        self.log_dict({"generator_loss": generator_loss, "critic_loss": critic_loss})
        return generator_loss + critic_loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.layer.parameters(), lr=1e-3), torch.optim.Adam(self.critic.parameters(), lr=1e-3)


class PerClassMetrics(Pattern):
    """A name per class, each logged as a Python number: `.item()` in the loop leaves the helper uncompiled."""

    def objective(self, batch, batch_idx):
        out = self.layer(batch)
        self.log_per_class(out)
        return out.sum()

    def log_per_class(self, out):
        for index in range(12):
            self.log(f"class_{index}", out[:, index % 2].mean().item())


class Recorder(Callback):
    """Per training batch: the loss, and how often the compiled graphs ran; per epoch, the graphs compiled so far."""

    def __init__(self, backend=None):
        self.backend = backend
        self.losses, self.logged, self.graph_runs, self.graphs_per_epoch = [], [], [], []

    def on_train_batch_start(self, *args):
        self._calls = self.backend.calls if self.backend else 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(outputs["loss"].item())
        self.logged.append({name: value.item() for name, value in trainer.callback_metrics.items()})
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


NEEDS_DYNAMIC_SOURCES = pytest.mark.skipif(not DYNAMIC_SOURCES, reason="needs dynamic_sources")
#: A float read in a step is compiled for a symbolic value after its first change only where Dynamo does not
#: specialize floats (`torch._dynamo.config.specialize_float`, False on the torch this is developed on).
NEEDS_SYMBOLIC_FLOATS = pytest.mark.skipif(
    torch._dynamo.config.specialize_float, reason="Dynamo specializes floats on this torch"
)
STRATEGIES = ("auto", "ddp")
#: Each pattern on one device and under DDP (a 1-process gloo group); those whose fix does not depend on the strategy,
#: on one device only.
CASES = [
    *(
        pytest.param(pattern, strategy, marks=NEEDS_DYNAMIC_SOURCES)
        for pattern in (Curriculum, Annealing, EpochScaled)
        for strategy in STRATEGIES
    ),
    *(pytest.param(LoggedLearningRate, strategy, marks=NEEDS_SYMBOLIC_FLOATS) for strategy in STRATEGIES),
    *((pattern, strategy) for pattern in (EveryOtherBatch, StepOutputs) for strategy in STRATEGIES),
    # on torch 2.6 the scheduler's second change compiles the optimizer's step once more (checked on 2.13)
    *(pytest.param(ManualScheduled, strategy, marks=ONLY_2_13) for strategy in STRATEGIES),
    (MemoryBank, "auto"),
    (GAN, "auto"),
    (PerClassMetrics, "auto"),
]


@pytest.mark.parametrize(("pattern", "strategy"), CASES)
def test_the_pattern_trains_as_eager_with_every_step_compiled(pattern, strategy):
    eager, _ = train(pattern, strategy)
    backend = CountingBackend(f"{pattern.__name__}-{strategy}")
    compiled, trainer = train(pattern, strategy, backend)
    assert len(compiled.losses) == EPOCHS * BATCHES
    torch.testing.assert_close(compiled.losses, eager.losses)
    torch.testing.assert_close(compiled.logged, eager.logged)
    # every step ran graphs of its own, and nothing compiled again after the second epoch
    assert all(runs > 0 for runs in compiled.graph_runs), compiled.graph_runs
    assert compiled.graphs_per_epoch[1:] == [compiled.graphs_per_epoch[1]] * (EPOCHS - 1), compiled.graphs_per_epoch
    summary = last_summary(trainer)
    assert summary.compiled_steps == {"training": EPOCHS * BATCHES}, summary
    assert summary.eager_steps == {}, summary
    assert summary.recompile_limit_hits == []
