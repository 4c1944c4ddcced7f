"""Tables of what compiled in real Lightning programs: the step patterns of Lightning's docs, a sweep, the tuner.

Run from the repository root, in the dev environment (torch 2.13 CPU, ``backend="aot_eager"`` or a counting one)::

    python tools/real_programs_report.py patterns   # each pattern 10 epochs of 10 batches, against eager
    python tools/real_programs_report.py sweep      # 10 trials of other widths and depths in one process
    python tools/real_programs_report.py tuner      # lr_find and scale_batch_size

The models and checks are the tests' own (``tests/test_step_patterns.py``, ``test_compile_budget.py``,
``test_tuner.py``): the tests assert the outcome, and this prints it as markdown tables for the docs.

"""

import logging
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import torch  # noqa: E402

import lightning_compile_patch  # noqa: E402, F401
import test_step_patterns as patterns  # noqa: E402
from helpers import QUIET, CountingBackend, last_summary  # noqa: E402
from lightning.pytorch import Trainer  # noqa: E402
from lightning.pytorch.tuner import Tuner  # noqa: E402
from test_compile_budget import Sized  # noqa: E402
from test_tuner import TunableModel  # noqa: E402

PATTERNS = [
    *((pattern, strategy) for pattern in ("Curriculum", "Annealing") for strategy in ("auto", "ddp")),
    ("EpochScaled", "auto"),
    ("LoggedLearningRate", "auto"),
    ("LoggedLearningRate", "ddp"),
    ("EveryOtherBatch", "auto"),
    ("StepOutputs", "auto"),
    ("StepOutputs", "ddp"),
    *((pattern, "auto") for pattern in ("ManualScheduled", "MemoryBank", "GAN", "PerClassMetrics")),
]


def counts(steps: dict) -> str:
    """``{"training": 3}`` as "training 3"."""
    return ", ".join(f"{kind} {n}" for kind, n in sorted(steps.items())) or "0"


def table(header: str) -> None:
    """Prints a markdown table's header row and its rule."""
    print(header)
    print("|" + "---|" * header.count(" | ") + "---|")


def step_patterns() -> None:
    """Each pattern trained eager, then compiled: steps compiled, eager steps by cause, graphs, the loss difference."""
    table("| pattern | strategy | steps compiled | eager (cause) | graphs after epoch 2 / 10 | max loss diff |")
    for name, strategy in PATTERNS:
        pattern = getattr(patterns, name)
        eager, _ = patterns.train(pattern, strategy)
        compiled, trainer = patterns.train(pattern, strategy, CountingBackend(f"report-{name}-{strategy}"))
        summary = last_summary(trainer)
        diff = max(abs(a - b) for a, b in zip(compiled.losses, eager.losses, strict=True))
        eager_steps = f"{counts(summary.eager_steps)} ({counts(summary.eager_causes)})" if summary.eager_steps else "0"
        graphs = compiled.graphs_per_epoch
        print(
            f"| {name} | {strategy} | {counts(summary.compiled_steps)} | {eager_steps} | {graphs[1]} / {graphs[-1]} |"
            f" {diff:.1e} |"
        )


def sweep() -> None:
    """Trials of other widths and depths in one process, with `use_compile` and with a compiled model passed in."""
    table("| strategy | how | trials | each trial: training steps compiled / eager, or graph runs |")
    for strategy in ("auto", "ddp"):
        trials = []
        for n in range(10):
            trainer = Trainer(
                strategy=strategy,
                use_compile={"backend": "aot_eager"},
                max_steps=3,
                limit_val_batches=2,
                val_check_interval=3,
                num_sanity_val_steps=0,
                **QUIET,
            )
            trainer.fit(Sized(8 + n, 1 + n % 3))
            summary = last_summary(trainer)
            trials.append(f"{summary.compiled_steps.get('training', 0)}/{summary.eager_steps.get('training', 0)}")
        print(f"| {strategy} | `use_compile` | 10 | {' '.join(trials)} |")
        backend, runs = CountingBackend(f"report-sweep-{strategy}"), []
        for n in range(12):
            before = backend.calls
            model = torch.compile(Sized(8 + n, 1), backend=backend)
            Trainer(strategy=strategy, max_steps=2, limit_val_batches=0, **QUIET).fit(model)
            runs.append(str(backend.calls - before))
        print(f"| {strategy} | `fit(torch.compile(model))`, graph runs in 2 steps | 12 | {' '.join(runs)} |")


def tuner() -> None:
    """The LR finder's and the batch-size finder's trials, counted."""
    table("| tuner | trials' training steps compiled / eager | graph runs per trial batch |")
    model = TunableModel(backend=CountingBackend("report-lr"))
    trainer = Trainer(use_compile={"backend": model.backend}, max_epochs=1, **QUIET)
    Tuner(trainer).lr_find(model, num_training=6, early_stop_threshold=None)
    summary = last_summary(trainer)
    steps = f"{summary.compiled_steps.get('training', 0)} / {summary.eager_steps.get('training', 0)}"
    print(f"| `lr_find` (6 trials) | {steps} | {model.per_batch} |")
    model = TunableModel(batch_size=2, backend=CountingBackend("report-bs"))
    trainer = Trainer(use_compile={"backend": model.backend}, max_epochs=1, **QUIET)
    found = Tuner(trainer).scale_batch_size(model, mode="power", steps_per_trial=2, max_trials=3)
    summary = last_summary(trainer)
    steps = f"{summary.compiled_steps.get('training', 0)} / {summary.eager_steps.get('training', 0)}"
    print(f"| `scale_batch_size` (found {found}) | {steps} | {model.per_batch} |")


if __name__ == "__main__":
    {"patterns": step_patterns, "sweep": sweep, "tuner": tuner}[sys.argv[1]]()
