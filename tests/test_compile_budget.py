"""A sweep in one process: every trial compiles every step, however many trials compiled before it.

One model class, a new Trainer and another width and depth per trial, as Optuna, Ray Tune and notebooks run it. Dynamo
counts its recompile limit per code object for the life of the process: without a budget per Trainer, the trials ran
eagerly from the 9th on one device and from the 5th under DDP (Lightning's forward redirection is shared by every
model).
"""

import pytest
import torch
from torch import nn

from helpers import QUIET, TORCH_2_13, CountingBackend, LoopedValidation, last_summary
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

TRIALS = 10


class Sized(BoringModel):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        hidden = [nn.Linear(32, 32) for _ in range(depth - 1)]
        self.layer = nn.Sequential(*hidden, nn.Linear(32, width), nn.Linear(width, 2))


class OwnStep(Sized):
    """A training step of the user's own: its code is the model class's, outside torch and Lightning."""

    def training_step(self, batch, batch_idx):
        return {"loss": self.layer(batch).sum()}


def trial(strategy, width, depth, **kwargs):
    options = {**QUIET, "max_steps": 3, "limit_val_batches": 2, "val_check_interval": 3, "num_sanity_val_steps": 0}
    trainer = Trainer(strategy=strategy, use_compile={"backend": "eager"}, **{**options, **kwargs})
    model = Sized(width, depth)
    trainer.fit(model)
    return trainer, model


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_every_trial_of_a_sweep_compiles_every_step(strategy):
    for number in range(TRIALS):
        trainer, _ = trial(strategy, width=8 + number, depth=1 + number % 3)
        summary = last_summary(trainer)
        assert summary.compiled_steps == {"training": 3, "evaluation": 2}, (number, summary)
        assert summary.eager_steps == {}, (number, summary)
        assert summary.recompile_limit_hits == [], (number, summary)


@pytest.mark.parametrize("model_class", [Sized, OwnStep])
@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_a_sweep_of_compiled_models_passed_in_compiles_every_fit(strategy, model_class):
    """Without `use_compile` (no feature, no summary): the seam resets the code its runs crowded, at each run's end."""
    backend = CountingBackend(f"sweep-input-{strategy}")
    options = {**QUIET, "max_steps": 2, "limit_val_batches": 0}
    for number in range(TRIALS):
        calls = backend.calls
        Trainer(strategy=strategy, **options).fit(torch.compile(model_class(8 + number, 1), backend=backend))
        assert backend.calls - calls >= 2, number  # each training step ran a compiled graph: 0 once the limit is hit


@pytest.mark.parametrize("use_compile", [None, {"backend": "eager"}])
def test_a_function_the_user_compiled_keeps_its_entries_through_a_fit(use_compile):
    # bug: the reset at a run's end took any code the run grew past half of the recompile limit, so a function the
    # user compiled and called during `fit` with 6 shapes compiled all 6 again afterwards
    backend = CountingBackend("users-own-function")
    double = torch.compile(lambda x: x * 2, backend=backend, dynamic=False)
    shapes = range(1, 7)

    class CallsIt(Callback):
        def on_train_start(self, trainer, pl_module):
            for n in shapes:
                double(torch.ones(n))

    model = Sized(8, 1) if use_compile else torch.compile(Sized(8, 1), backend="eager")
    options = {**QUIET, "max_steps": 2, "limit_val_batches": 0}
    Trainer(use_compile=use_compile, callbacks=CallsIt(), **options).fit(model)
    assert backend.graphs == len(shapes)
    for n in shapes:
        double(torch.ones(n))
    assert backend.graphs == len(shapes)  # no shape compiled again


def test_the_runs_of_one_trainer_share_their_compiled_steps():
    trainer, model = trial("auto", width=8, depth=1)
    trial("auto", width=9, depth=2)  # another Trainer in between
    trainer.validate(model)
    assert last_summary(trainer).compiled_steps == {"evaluation": 2}
    assert last_summary(trainer).graphs == 0  # the validation step compiled in its fit, kept through the other's run


@pytest.mark.skipif(not TORCH_2_13, reason="the cause is read as torch 2.13 words it")
def test_each_trial_names_the_cause_of_a_step_dynamo_skipped_from_its_own_run():
    # bug: Dynamo's "skip" mark outlived the first trial, so later trials found no failure of their own and guessed
    # "an earlier error in this process" (as neuralforecast's evaluation steps did, from the second model on)
    causes = []
    for _ in range(3):  # a new Trainer each: the same model class, as a sweep's trials
        trainer = Trainer(use_compile={"backend": "eager"}, **{**QUIET, "max_steps": 1, "limit_val_batches": 2})
        with pytest.warns(UserWarning, match=r"ran compiled in parts \("):  # the step calls the model's `forward`
            trainer.fit(LoopedValidation())
        causes.append(last_summary(trainer).parts_causes)
    assert causes == [{"skipped: graph break in loop": 2}] * 3


def stops_at(batch: int) -> Sized:
    """A trial that raises in the validation step of its second epoch: Lightning's test of a restarted fit loop."""

    class Stops(Sized):  # a new class per trial, the same code
        def validation_step(self, batch_, batch_idx):
            if self.current_epoch == 1 and batch_idx == batch:
                raise ValueError("stop this trial")
            return super().validation_step(batch_, batch_idx)

    return Stops(width=8, depth=1)


def test_trials_that_raise_in_their_step_each_compile_that_step():
    # bug: Dynamo marked the step "skip" when it traced a `raise`, keeping its entries; from the third trial on the
    # step ran eagerly, warned with a guess (Lightning's test_loop_restart_progress_multiple_dataloaders, one process)
    options = {**QUIET, "max_epochs": 2, "limit_train_batches": 1, "limit_val_batches": 3, "num_sanity_val_steps": 0}
    for batch in [0, 1, 2, 0, 1]:
        trainer = Trainer(use_compile={"backend": "eager"}, **options)
        with pytest.raises(ValueError, match="stop this trial"):
            trainer.fit(stops_at(batch))
        summary = last_summary(trainer)
        assert summary.eager_steps == {}, (batch, summary)
