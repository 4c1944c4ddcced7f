"""What the package wraps or patches on the user's objects still pickles and deep-copies, during a run and after it.

Checkpoints pickle the hyperparameters (a metric among them), EMA and SWA callbacks deep-copy the model, and a callback
may copy the optimizers, the schedulers or the Trainer's state. Each object below is copied with every default feature
on, in a compiled training step's hooks (where the features' wrappers, views and classes are in place) and after the
run, and the copy must work like the original.
"""

import copy
import pickle

import pytest
import torch
import torchmetrics

from helpers import QUIET, last_summary
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import RandomDataset
from lightning.pytorch.trainer.states import TrainerState


class MetricInHyperparameters(LightningModule):
    """A metric among the `save_hyperparameters()` arguments, a list the step appends to, manual optimization."""

    def __init__(self, metric: torchmetrics.Metric) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.metric = metric
        self.layer = torch.nn.Linear(32, 2)
        self.outputs: list[torch.Tensor] = []
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt, sch = self.optimizers(), self.lr_schedulers()
        loss = self.layer(batch).sum()
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        sch.step()
        self.metric(loss.detach())
        self.outputs.append(loss.detach())
        self.log("lr", opt.param_groups[0]["lr"])
        self.log("mean", self.metric)
        return loss

    def on_train_epoch_end(self):
        self.outputs.clear()

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1)]

    def train_dataloader(self):
        return torch.utils.data.DataLoader(RandomDataset(32, 8), batch_size=2)


def the_objects(trainer: Trainer, model: MetricInHyperparameters) -> dict[str, object]:
    return {
        "model": model,
        "metric": model.metric,
        "hparams": model.hparams,
        "outputs": model.outputs,
        "optimizer": trainer.optimizers[0],
        "lightning_optimizer": model.optimizers(),
        "scheduler": trainer.lr_scheduler_configs[0].scheduler,
        "trainer_state": trainer.state,
    }


#: What fails in stock Lightning too: each `LightningOptimizer` has a class of its own that pickle cannot find by name.
STOCK_FAILURES = {"lightning_optimizer (pickle)"}


def plain(name: str, copied: object) -> None:
    """The copy is the object as it was before the run: nothing of the run's is on it, and it works on its own."""
    if name == "model":
        assert copied._compiler_ctx is None
        assert not {"forward", "log", "__getstate__", "training_step", "toggle_optimizer"} & set(vars(copied))
        # its submodules too: `in_parts` binds a compiled `forward` to each during the run
        assert not any({"forward", "__getstate__"} & set(vars(sub)) for sub in copied.modules())
        x = torch.ones(1, 32)
        torch.testing.assert_close(
            copied.layer(x), torch.nn.functional.linear(x, copied.layer.weight, copied.layer.bias)
        )
    if name == "metric":
        assert not {"forward", "__getstate__"} & set(vars(copied))
        copied.reset()
        copied(torch.tensor(3.0))
        assert float(copied.compute()) == 3.0
    if name == "scheduler":
        assert type(copied) is torch.optim.lr_scheduler.StepLR
    if name == "trainer_state":
        assert type(copied) is TrainerState


def copy_each(objects: dict[str, object]) -> set[str]:
    """Each object through `pickle` and `copy.deepcopy`: those that failed, by object and way."""
    failed = set()
    for name, value in objects.items():
        for how, copier in (("pickle", lambda v: pickle.loads(pickle.dumps(v))), ("deepcopy", copy.deepcopy)):
            try:
                copied = copier(value)
            except Exception:
                failed.add(f"{name} ({how})")
                continue
            plain(name, copied)
    return failed


class CopiesInTheRun(Callback):
    def __init__(self):
        self.failed: set[str] = set()

    def on_train_batch_end(self, trainer, pl_module, *args):
        self.failed |= copy_each(the_objects(trainer, pl_module))


@pytest.mark.parametrize("use_compile", [None, {"backend": "aot_eager"}], ids=["stock", "compiled"])
def test_what_the_package_wraps_pickles_and_deep_copies_during_the_run_and_after(tmp_path, use_compile):
    # bugs: `eager_metrics` set `forward` on each metric to a compiler-disabled copy, which pickle refused ("it's not
    # the same object as torchmetrics.metric.Metric.forward"), so a checkpoint of a model with a metric among its
    # hyperparameters failed at the end of the first epoch, and a deep copy's `forward` updated the original; the
    # model's deferred `log` and compiled steps, and the scheduler's class of the run, could not be pickled
    model = MetricInHyperparameters(torchmetrics.MeanMetric())
    copies = CopiesInTheRun()
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer = Trainer(
        use_compile=use_compile, max_epochs=2, callbacks=[copies, checkpoint], **{**QUIET, "enable_checkpointing": True}
    )
    trainer.fit(model)
    assert copies.failed == STOCK_FAILURES
    assert copy_each(the_objects(trainer, model)) == STOCK_FAILURES
    if use_compile is not None:
        summary = last_summary(trainer)
        assert summary.compiled_steps["training"] == 8
        assert summary.eager_steps.get("training", 0) == 0
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert isinstance(saved["hyper_parameters"]["metric"], torchmetrics.MeanMetric)


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_a_metric_copied_during_a_compiled_run_runs_eagerly_like_the_original(how):
    # the copy is a metric of its own, with no `forward` of the run on it: after the run it is as a plain metric
    model = MetricInHyperparameters(torchmetrics.SumMetric())
    copies = []

    class CopyTheMetric(Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            metric = pl_module.metric
            copies.append(pickle.loads(pickle.dumps(metric)) if how == "pickle" else copy.deepcopy(metric))

    trainer = Trainer(use_compile={"backend": "aot_eager"}, max_steps=2, callbacks=[CopyTheMetric()], **QUIET)
    trainer.fit(model)
    for copied in copies:
        assert "forward" not in vars(copied)
        copied.reset()
        copied(torch.tensor(2.0))
        assert float(copied.compute()) == 2.0
