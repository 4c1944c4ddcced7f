"""Checkpoints written with `use_compile` are those of an eager run: they resume either way, on the same loss curve."""

import pytest
import torch

from helpers import QUIET, demo_gpt, leftovers
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

COMPILED = {"backend": "aot_eager"}


def gpt_model():
    gpt = demo_gpt()
    return gpt.GPTModule(gpt.GPTConfig(n_layer=2, n_embd=16, block_size=8, vocab_size=32, samples=16, batch_size=8))


class EpochLosses(Callback):
    def __init__(self):
        self.values = []

    def on_train_batch_end(self, trainer, pl_module, outputs, *args):
        self.values.append(float(outputs["loss"]))


def run(tmp_path, use_compile, epochs, ckpt_path=None, strategy="auto", name="run"):
    """Trains `epochs` epochs of 2 batches, saving `last.ckpt`; returns the losses, the model and the checkpoint."""
    seed_everything(0)
    model = gpt_model()
    losses = EpochLosses()
    checkpoint = ModelCheckpoint(dirpath=tmp_path / name, save_last=True)
    trainer = Trainer(
        strategy=strategy,
        use_compile=use_compile,
        max_epochs=epochs,
        limit_val_batches=0,
        callbacks=[losses, checkpoint],
        **{**QUIET, "enable_checkpointing": True},
    )
    trainer.fit(model, ckpt_path=ckpt_path)
    assert leftovers(model) == []
    return losses.values, model, tmp_path / name / "last.ckpt"


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
@pytest.mark.parametrize(
    ("first", "then"),
    [(COMPILED, None), (None, COMPILED), (COMPILED, COMPILED)],
    ids=["compiled>eager", "eager>compiled", "compiled>compiled"],
)
def test_resume_continues_the_same_loss_curve(tmp_path, strategy, first, then):
    straight, _, _ = run(tmp_path, None, epochs=3, strategy=strategy, name="straight")
    before, _, checkpoint = run(tmp_path, first, epochs=1, strategy=strategy, name="first")
    after, model, resumed = run(tmp_path, then, epochs=3, ckpt_path=checkpoint, strategy=strategy, name="then")
    assert len(before) == 2
    assert len(after) == 4  # epochs 2 and 3
    torch.testing.assert_close(before + after, straight, rtol=1e-5, atol=1e-6)
    keys = sorted(torch.load(checkpoint, weights_only=False)["state_dict"])
    assert keys == sorted(torch.load(resumed, weights_only=False)["state_dict"]) == sorted(model.state_dict())


def test_resume_from_last_with_regions(tmp_path):
    straight, _, _ = run(tmp_path, None, epochs=2, name="straight")
    regions = {**COMPILED, "regions": "auto"}
    before, _, checkpoint = run(tmp_path, regions, epochs=1, name="first")
    after, _, _ = run(tmp_path, regions, epochs=2, ckpt_path=checkpoint, name="then")
    torch.testing.assert_close(before + after, straight, rtol=1e-5, atol=1e-6)


def test_ckpt_path_last_picks_up_the_run(tmp_path):
    """`ckpt_path="last"` finds the last checkpoint of the same Trainer's checkpoint callback."""
    seed_everything(0)
    model = gpt_model()
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    options = {**QUIET, "enable_checkpointing": True, "limit_val_batches": 0}
    Trainer(use_compile=COMPILED, max_epochs=1, callbacks=[checkpoint], **options).fit(model)
    losses = EpochLosses()
    trainer = Trainer(
        use_compile=COMPILED,
        max_epochs=2,
        callbacks=[losses, ModelCheckpoint(dirpath=tmp_path, save_last=True)],
        **options,
    )
    trainer.fit(model, ckpt_path="last")
    assert trainer.current_epoch == 2
    assert len(losses.values) == 2  # only the second epoch ran
