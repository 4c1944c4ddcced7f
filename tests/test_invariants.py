"""What compiling after the wrap must not change: types, Lightning's DDP paths, checkpoints, and the model after."""

import pickle

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from helpers import (
    QUIET,
    CountingBackend,
    LoggingModel,
    ManualModel,
    StateProbe,
    leftovers,
    no_sync_counter,
    state_dict_keys,
)
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

COMPILE = {"backend": "eager"}


def test_ddp_keeps_its_type_so_lightning_isinstance_checks_hold():
    probe = StateProbe()
    trainer = Trainer(strategy="ddp", use_compile=COMPILE, max_steps=2, callbacks=[probe], **QUIET)
    trainer.fit(LoggingModel())
    assert seen_type(probe, "train") is DistributedDataParallel
    assert probe.seen["train"]["compiled_steps"]  # compiled, inside the wrapper


def seen_type(probe, stage):
    return probe.seen[stage]["model_type"]


@pytest.mark.parametrize("use_compile", [None, COMPILE])
def test_gradient_accumulation_still_uses_no_sync(use_compile):
    trainer = Trainer(strategy="ddp", use_compile=use_compile, max_steps=2, accumulate_grad_batches=2, **QUIET)
    with no_sync_counter(trainer) as entered:
        trainer.fit(BoringModel())
    # two optimizer steps of two batches each: the first batch of each step skips the all-reduce
    assert entered[0] == 2


def test_teardown_unwraps_ddp():
    model = LoggingModel()
    trainer = Trainer(strategy="ddp", use_compile=COMPILE, max_steps=2, **QUIET)
    trainer.fit(model)
    assert trainer.strategy.model is model


def train_weights(model_cls, strategy, use_compile, steps=3, **kwargs):
    seed_everything(1)
    model = model_cls()
    trainer = Trainer(
        strategy=strategy, use_compile=use_compile, max_steps=steps, limit_val_batches=0, **QUIET, **kwargs
    )
    trainer.fit(model)
    return model, trainer


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_manual_optimization_trains_as_eager(strategy):
    eager, _ = train_weights(ManualModel, strategy, None)
    backend = CountingBackend("manual")
    compiled, _ = train_weights(ManualModel, strategy, {"backend": backend})
    assert backend.calls > 0
    for ours, theirs in zip(compiled.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_checkpoint_keys_match_an_eager_run(strategy, tmp_path):
    keys = {}
    for name, use_compile in (("eager", None), ("compiled", COMPILE)):
        checkpoint = ModelCheckpoint(dirpath=tmp_path / name, save_last=True)
        options = {**QUIET, "enable_checkpointing": True}
        trainer = Trainer(strategy=strategy, use_compile=use_compile, max_steps=2, callbacks=[checkpoint], **options)
        trainer.fit(LoggingModel())
        saved = torch.load(tmp_path / name / "last.ckpt", weights_only=False)
        keys[name] = sorted(saved["state_dict"])
    assert keys["compiled"] == keys["eager"] == ["layer.bias", "layer.weight"]


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_every_module_is_uncompiled_after_each_stage(strategy):
    model = LoggingModel()
    keys = state_dict_keys(model)
    trainer = Trainer(strategy=strategy, use_compile=COMPILE, max_steps=2, limit_val_batches=1, **QUIET)
    for run in (trainer.fit, trainer.validate, trainer.test, trainer.predict):
        run(model)
        assert leftovers(model) == [], run.__name__
        assert state_dict_keys(model) == keys
    assert trainer.strategy.model._compiled_call_impl is None


def test_the_model_can_be_fit_again_pickled_and_exported():
    model = LoggingModel()
    Trainer(use_compile=COMPILE, max_steps=2, **QUIET).fit(model)
    Trainer(use_compile=COMPILE, max_steps=4, **QUIET).fit(model)
    assert leftovers(model) == []
    restored = pickle.loads(pickle.dumps(model))
    torch.testing.assert_close(restored.layer.weight, model.layer.weight)
    exported = torch.export.export(model, (torch.randn(2, 32),))
    x = torch.randn(2, 32)
    torch.testing.assert_close(exported.module()(x), model(x))


def test_an_exception_inside_the_step_leaves_the_model_uncompiled():
    class Failing(LoggingModel):
        def training_step(self, batch, batch_idx):
            if batch_idx == 1:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    model = Failing()
    trainer = Trainer(strategy="ddp", use_compile=COMPILE, max_steps=3, **QUIET)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(model)
    assert leftovers(model) == []
    assert leftovers(trainer.strategy.model) == []
