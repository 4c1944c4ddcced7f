"""Graph and recompile budgets, with margin below Dynamo's recompile limit, and no silent fallback to eager.

Why these budgets: every code object we compile holds at most one cache entry per combination of

* grad mode: training steps run with grad, evaluation steps without; a standalone `validate` feeds inference tensors
  (made under inference mode), another dispatch state for a code object that `fit` validated with;
* batch shape: the last, partial batch changes the batch size once; automatic dynamic shapes then recompile that code
  once as dynamic, and the dynamic entry serves every later size.

That is at most 2 x 2 = 4 entries per code object, half of Dynamo's default limit of 8. Each stage's graphs follow from
which code objects it runs (see `GRAPHS`), and every graph after the first of its code object is a recompile.
"""

import logging

import pytest
from torch._dynamo.utils import get_compilation_metrics
from torch.utils.data import DataLoader

from helpers import QUIET, CountingBackend, LoggingModel, dynamo_stats, last_summary
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.demos.boring_classes import RandomDataset

MAX_ENTRIES_PER_CODE = 4  # see the module docstring; Dynamo's limit is 8


class PartialBatches(LoggingModel):
    """Every dataloader ends with a partial batch (60 = 7 x 8 + 4 and 20 = 2 x 8 + 4)."""

    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 60), batch_size=8)

    def val_dataloader(self):
        return DataLoader(RandomDataset(32, 20), batch_size=8)

    test_dataloader = predict_dataloader = val_dataloader


#: The graphs each stage may compile, derived from the module docstring, and the code objects that hold them.
GRAPHS = {
    # one device: each step method is a code object of its own. fit: training_step and validation_step, each static
    # for the batches of 8, then dynamic after the partial batch; validate: validation_step once more, for inference
    # tensors, with the batch size already dynamic; test, predict: a new code object each, static then dynamic
    "auto": {"fit": 2 + 2, "validate": 1, "test": 2, "predict": 2},
    # DDP: its call runs the same step methods, compiled on the module, as on one device
    "ddp": {"fit": 2 + 2, "validate": 1, "test": 2, "predict": 2},
}
CODE_OBJECTS = {"auto": 4, "ddp": 4}  # the 4 step methods


def graph_recompiles():
    """Recompiles of frames that made a graph (Dynamo also compiles graphless frames around DDP's graph break)."""
    return sum(1 for m in get_compilation_metrics() if m.cache_size and m.backend_compile_time_s is not None)


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_fit_validate_test_predict_stay_within_budget(strategy, caplog):
    model = PartialBatches()
    backend = CountingBackend(f"budget-{strategy}")
    trainer = Trainer(strategy=strategy, use_compile={"backend": backend}, max_epochs=2, **QUIET)
    stages = {
        "fit": lambda: trainer.fit(model),
        "validate": lambda: trainer.validate(model, verbose=False),
        "test": lambda: trainer.test(model, verbose=False),
        "predict": lambda: trainer.predict(model),
    }
    graphs, calls = {}, {}
    with caplog.at_level(logging.WARNING, logger="torch._dynamo"):
        for stage, run in stages.items():
            graphs_before, calls_before = backend.graphs, backend.calls
            run()
            graphs[stage], calls[stage] = backend.graphs - graphs_before, backend.calls - calls_before
    assert all(n > 0 for n in calls.values()), calls  # every stage ran compiled code
    assert all(graphs[stage] <= budget for stage, budget in GRAPHS[strategy].items()), graphs
    assert graph_recompiles() <= sum(GRAPHS[strategy].values()) - CODE_OBJECTS[strategy]
    stats = dynamo_stats()
    assert stats.max_entries_per_code <= MAX_ENTRIES_PER_CODE
    assert stats.unintended_breaks == 0
    assert "recompile_limit" not in caplog.text


class PerEpoch(Callback):
    """Records the backend's graphs and graph runs at the end of every training epoch (after its validation)."""

    def __init__(self, backend):
        self.backend = backend
        self.graphs, self.calls = [], []

    def on_train_epoch_end(self, trainer, pl_module):
        self.graphs.append(self.backend.graphs)
        self.calls.append(self.backend.calls)


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_fit_with_validation_within_budget(strategy):
    backend = CountingBackend(f"epochs-{strategy}")
    epochs = PerEpoch(backend)
    trainer = Trainer(strategy=strategy, use_compile={"backend": backend}, max_epochs=3, callbacks=[epochs], **QUIET)
    trainer.fit(PartialBatches())
    stats = dynamo_stats()
    assert 0 < stats.graphs <= 4
    assert stats.max_entries_per_code <= MAX_ENTRIES_PER_CODE
    # a third epoch adds nothing: every shape and grad mode was seen in the first
    assert epochs.graphs == [epochs.graphs[0]] * 3
    assert epochs.graphs[0] > 0
    # and every epoch ran compiled graphs: 8 training and 3 validation batches each, one graph run or more per step
    runs = [after - before for before, after in zip([0, *epochs.calls[:-1]], epochs.calls, strict=True)]
    assert len(runs) == 3
    assert all(n >= 8 + 3 for n in runs), runs


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_new_trainers_and_models_reuse_the_compiled_graphs(strategy):
    backend = CountingBackend(f"reuse-{strategy}")
    graphs, calls = [], []
    for _ in range(3):
        trainer = Trainer(
            strategy=strategy, use_compile={"backend": backend}, max_steps=3, limit_val_batches=2, **QUIET
        )
        calls_before = backend.calls
        trainer.fit(LoggingModel())
        graphs.append(dynamo_stats().graphs)
        calls.append(backend.calls - calls_before)
    stats = dynamo_stats()
    assert graphs[0] > 0
    assert graphs == [graphs[0]] * 3  # under DDP too: its call is not compiled, so a new wrapper guards nothing
    assert calls == [calls[0]] * 3  # each later run ran the same compiled code, none of it went eager
    assert calls[0] >= 3 + 2  # 3 training steps and 2 validation steps, each through a compiled graph
    assert stats.max_entries_per_code <= 2


def test_hitting_the_recompile_limit_warns(monkeypatch):
    """A frame over the limit runs eagerly from then on; the user hears about it, with what to do."""

    class ChangingShapes(LoggingModel):
        def train_dataloader(self):
            # every batch a new size, with static shapes forced: one recompile per batch
            return DataLoader(RandomDataset(32, 45), batch_sampler=[list(range(n)) for n in range(1, 10)])

    trainer = Trainer(use_compile={"backend": "eager", "dynamic": False}, max_epochs=1, limit_val_batches=0, **QUIET)
    with pytest.warns(UserWarning, match="hit Dynamo's recompile limit.*TORCH_LOGS=recompiles"):
        trainer.fit(ChangingShapes())
    assert last_summary(trainer).recompile_limit_hits
