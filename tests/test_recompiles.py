"""Graph and recompile budgets, with margin below Dynamo's recompile limit, and no silent fallback to eager.

Why these budgets: every code object we compile holds at most one cache entry per combination of

* grad mode: training steps run with grad, evaluation steps under inference mode (DDP routes both through the same
  redirected forward while fitting, so that one code object sees both);
* batch shape: the last, partial batch changes the batch size once; automatic dynamic shapes then recompile that code
  once as dynamic, and the dynamic entry serves every later size.

That is at most 2 x 2 = 4 entries per code object, half of Dynamo's default limit of 8.
"""

import logging

import pytest
from torch.utils.data import DataLoader

from helpers import QUIET, LoggingModel, dynamo_stats
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import RandomDataset

MAX_ENTRIES_PER_CODE = 4  # see the module docstring; Dynamo's limit is 8
COMPILE = {"backend": "eager"}


class PartialBatches(LoggingModel):
    """Every dataloader ends with a partial batch (60 = 7 x 8 + 4 and 20 = 2 x 8 + 4)."""

    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 60), batch_size=8)

    def val_dataloader(self):
        return DataLoader(RandomDataset(32, 20), batch_size=8)

    test_dataloader = predict_dataloader = val_dataloader


@pytest.mark.parametrize(
    ("strategy", "max_graphs", "max_recompiles"),
    [
        # fit: train + val, each static then dynamic (4); validate: the inference-mode batch (1); test, predict: 2 each
        ("auto", 9, 5),
        # fit through DDP: the redirected forward is one code object for train and val (2 x 2), plus contextlib frames
        # that Dynamo compiles around DDP's intended graph break (8 on torch 2.13); torch 2.14 also compiles the frame
        # that wraps DDP's forward, once per grad mode x shape (+3); validate/test/predict run without the wrapper
        ("ddp", 10, 11),
    ],
)
def test_fit_validate_test_predict_stay_within_budget(strategy, max_graphs, max_recompiles, caplog):
    model = PartialBatches()
    trainer = Trainer(strategy=strategy, use_compile={"backend": "eager"}, max_epochs=2, **QUIET)
    with caplog.at_level(logging.WARNING, logger="torch._dynamo"):
        trainer.fit(model)
        trainer.validate(model, verbose=False)
        trainer.test(model, verbose=False)
        trainer.predict(model)
    stats = dynamo_stats()
    assert stats.graphs <= max_graphs
    assert stats.recompiles <= max_recompiles
    assert stats.max_entries_per_code <= MAX_ENTRIES_PER_CODE
    assert stats.unintended_breaks == 0
    assert "recompile_limit" not in caplog.text


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_fit_with_validation_within_budget(strategy):
    trainer = Trainer(strategy=strategy, use_compile={"backend": "eager"}, max_epochs=3, **QUIET)
    trainer.fit(PartialBatches())
    stats = dynamo_stats()
    # a third epoch adds nothing: every shape and grad mode was seen in the first
    assert stats.graphs <= 4
    assert stats.max_entries_per_code <= MAX_ENTRIES_PER_CODE


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_new_trainers_and_models_reuse_the_compiled_graphs(strategy):
    graphs = []
    for _ in range(3):
        trainer = Trainer(strategy=strategy, use_compile=COMPILE, max_steps=3, limit_val_batches=2, **QUIET)
        trainer.fit(LoggingModel())
        graphs.append(dynamo_stats().graphs)
    stats = dynamo_stats()
    assert graphs[0] > 0
    assert graphs == [graphs[0]] * 3
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
    assert trainer._compile_connector.last_summary.recompile_limit_hits
