"""What `use_compile` adds to each step on the host: the Python its features run, counted in calls.

On a tiny model a step is almost all host time, and there the package's own work shows (`benchmarks/host_cost.py`).
Its time varies from process to process on a shared machine by far more than that work; the Python calls a step makes
barely vary (a call or two with what ran before in the process). So these tests count them (``sys.setprofile``), with
the features on and with them off.

The features' calls per training step of a `BoringModel`, every feature on against every one off:

| torch | first | then | now |
|-------|-------|------|-----|
| 2.13  | 71    | 16   | 10  |
| 2.15  |       | 16   | 10  |
| 2.6   |       | 21   | 11  |

First, the summary looked up each frame between a graph and its step in sets of code objects (hashing each code, and
through Dynamo's own tracker), the keyed Trainer state read ``fn`` and ``stage`` through properties (13 reads a step,
``trainer.training`` among them), and the optimizers' views were looked up again through the Trainer's properties.
Then, each feature that wraps the compiled call did so for every module, with or without something to do for it (a
list to watch, the optimizers to view), the summary's graph wrapper called the backend's own ``disable`` wrapper inside
Dynamo's, and its walk from each graph to its step passed through every other feature's wrapper.
"""

import sys
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import pytest

from helpers import QUIET
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

#: The package's default keys (`optimize_ddp` aside: DDP only): those that act on every compiled step, then the others.
KEYS = ("summary", "compile_errors", "defer_logging", "list_outputs", "dynamic_lr", "stage_guards")
KEYS += ("eager_metrics", "dynamic_loop_counters", "compile_budget", "no_grad_evaluation", "check_tensor_parallel")
KEYS += ("eager_optimizer_steps", "in_parts")
COUNTED = range(10, 30)  # steps, after the first compile


class CountCalls(Callback):
    """Counts the Python function calls of the steps in ``COUNTED``, each step from its batch's start to the next's."""

    def __init__(self) -> None:
        self.calls = 0
        #: By the name of the file of the code called.
        self.files: Counter[str] = Counter()

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            self.calls += 1
            self.files[Path(frame.f_code.co_filename).name] += 1

    def on_train_batch_start(self, trainer: Trainer, *args: Any) -> None:
        if trainer.global_step == COUNTED.start:
            sys.setprofile(self._profile)
        elif trainer.global_step == COUNTED.stop:
            sys.setprofile(None)


def counted_steps(*keys_on: str, model: Optional[LightningModule] = None) -> CountCalls:
    """The Python calls of the steps in ``COUNTED`` with ``keys_on`` on and every other key of ``KEYS`` off."""
    counter = CountCalls()
    use_compile = {"backend": "aot_eager", **{key: key in keys_on for key in KEYS}}
    trainer = Trainer(
        use_compile=use_compile, max_steps=COUNTED.stop + 1, limit_val_batches=0, callbacks=[counter], **QUIET
    )
    try:
        trainer.fit(model or BoringModel())
    finally:
        sys.setprofile(None)
    assert trainer.global_step == COUNTED.stop + 1
    return counter


def calls_per_step(*keys_on: str) -> float:
    """Python calls per training step with ``keys_on`` on and every other key of ``KEYS`` off."""
    return counted_steps(*keys_on).calls / len(COUNTED)


def test_the_features_add_few_python_calls_to_a_compiled_step():
    # bug: the features cost 71 calls a step, 16% of what Lightning's loop adds on a tiny model; then 16
    off, on = calls_per_step(), calls_per_step(*KEYS)
    assert on - off <= 13, f"the features add {on - off:.1f} Python calls to each step (with them off: {off:.1f})"


def test_the_keyed_trainer_state_is_read_without_a_call():
    # bug: `fn` and `stage` were properties of the keyed state, and Lightning reads them 13 times a step; the count of
    # a run differs by a call or two with the runs before it in the process
    off, on = calls_per_step(), calls_per_step("stage_guards")
    assert abs(on - off) <= 3, f"the keyed state adds {on - off:.1f} Python calls to each step"


class OwnOptimizers(BoringModel):
    """A module with its own ``optimizers``: the step gets what it returns, and no view of Lightning's."""

    def optimizers(self, use_pl_optimizer: bool = True) -> Any:
        return super().optimizers(use_pl_optimizer)


class CollectsOutputs(BoringModel):
    """The docs' pattern: each step's loss collected in a list of the module."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().training_step(batch, batch_idx)
        self.outputs.append(out["loss"].detach())
        return out


@pytest.mark.parametrize(
    ("key", "idle", "busy"),
    [
        ("list_outputs", BoringModel, CollectsOutputs),  # no list in the module's code; a list the step appends to
        ("dynamic_lr", OwnOptimizers, BoringModel),  # its own `optimizers`; Lightning's
    ],
)
def test_a_feature_runs_on_each_step_only_where_it_has_something_to_do(key, idle, busy):
    # bug: each feature put its wrapper around every compiled call, a call on every step, with nothing to do in it
    assert counted_steps(key, model=idle()).files[f"{key}.py"] == 0, f"`{key}` runs on each step of {idle.__name__}"
    assert counted_steps(key, model=busy()).files[f"{key}.py"] >= len(COUNTED)
