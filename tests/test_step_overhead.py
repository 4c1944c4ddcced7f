"""What `use_compile` adds to each step on the host: the Python its features run, counted in calls.

On a tiny model a step is almost all host time, and there the package's own work shows (`benchmarks/host_cost.py`).
Its time varies from process to process on a shared machine by far more than that work; the Python calls a step makes
barely vary (a call or two with what ran before in the process). So these tests count them (``sys.setprofile``), with
the features on and with them off.

The features' calls per training step of a `BoringModel`, every feature on against every one off:

| torch | before | now |
|-------|--------|-----|
| 2.13  | 71     | 16  |
| 2.15  |        | 16  |
| 2.6   |        | 21  |

Before, the summary looked up each frame between a graph and its step in sets of code objects (hashing each code, and
through Dynamo's own tracker), the keyed Trainer state read ``fn`` and ``stage`` through properties (13 reads a step,
``trainer.training`` among them), and the optimizers' views were looked up again through the Trainer's properties.
"""

import sys
from typing import Any

from helpers import QUIET
from lightning.pytorch import Callback, Trainer
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

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            self.calls += 1

    def on_train_batch_start(self, trainer: Trainer, *args: Any) -> None:
        if trainer.global_step == COUNTED.start:
            sys.setprofile(self._profile)
        elif trainer.global_step == COUNTED.stop:
            sys.setprofile(None)


def calls_per_step(*keys_on: str) -> float:
    """Python calls per training step with ``keys_on`` on and every other key of ``KEYS`` off."""
    counter = CountCalls()
    use_compile = {"backend": "aot_eager", **{key: key in keys_on for key in KEYS}}
    trainer = Trainer(
        use_compile=use_compile, max_steps=COUNTED.stop + 1, limit_val_batches=0, callbacks=[counter], **QUIET
    )
    try:
        trainer.fit(BoringModel())
    finally:
        sys.setprofile(None)
    assert trainer.global_step == COUNTED.stop + 1
    return counter.calls / len(COUNTED)


def test_the_features_add_few_python_calls_to_a_compiled_step():
    # bug: the features cost 71 calls a step, 16% of what Lightning's loop adds on a tiny model
    off, on = calls_per_step(), calls_per_step(*KEYS)
    assert on - off <= 25, f"the features add {on - off:.1f} Python calls to each step (with them off: {off:.1f})"


def test_the_keyed_trainer_state_is_read_without_a_call():
    # bug: `fn` and `stage` were properties of the keyed state, and Lightning reads them 13 times a step; the count of
    # a run differs by a call or two with the runs before it in the process
    off, on = calls_per_step(), calls_per_step("stage_guards")
    assert abs(on - off) <= 3, f"the keyed state adds {on - off:.1f} Python calls to each step"
