"""What ``import lightning_compile_patch`` costs a run that does not use it (``use_compile=None``).

    python benchmarks/zero_cost.py
    python benchmarks/zero_cost.py --rounds 5 --out /tmp/x   # quick

Measured as a ratio within one process, so that machine noise hits both sides alike: ``Trainer(...)`` construction and
a tiny ``fit`` (Lightning's ``BoringModel``, a few steps, no logger, checkpointing or progress bar) with the patch
applied, against the same with the patch removed (``lightning_compile_patch.remove()`` / ``apply()``), alternating A/B
and B/A round by round. A ratio of 1.00 is no cost.

Writes ``zero_cost.json`` and ``zero_cost.md`` into ``--out`` (default ``docs/benchmarks/``).

"""

import argparse
import gc
import inspect
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lightning_compile_patch
from common import (
    RESULTS_DIR,
    command_line,
    fmt,
    machine_info,
    markdown_table,
    now,
    ratio,
    report_header,
    update_index,
    write_report,
)
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

QUIET = {
    "accelerator": "cpu",
    "devices": 1,
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "limit_val_batches": 0,
    "num_sanity_val_steps": 0,
}
SIDES = ("patched", "removed")


def set_side(side: str) -> None:
    """Applies or removes the patch, and checks that the Trainer really changed."""
    if side == "patched":
        lightning_compile_patch.apply()
    else:
        lightning_compile_patch.remove()
    has_argument = "use_compile" in inspect.signature(Trainer.__init__).parameters
    if has_argument != (side == "patched") or lightning_compile_patch.is_applied() != (side == "patched"):
        raise RuntimeError(f"the patch did not toggle: side {side}, use_compile argument present: {has_argument}")


def one_round(side: str, steps: int) -> dict[str, float]:
    """Times ``Trainer(...)`` and ``fit`` once on one side."""
    set_side(side)
    kwargs: dict[str, Any] = {"use_compile": None} if side == "patched" else {}
    model = BoringModel()
    gc.collect()
    start = time.perf_counter()
    trainer = Trainer(max_steps=steps, **QUIET, **kwargs)
    constructed = time.perf_counter()
    trainer.fit(model)
    done = time.perf_counter()
    return {"construct_ms": 1000 * (constructed - start), "fit_ms": 1000 * (done - constructed)}


def summarize(samples: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Medians, quartiles and the patched/removed ratio of each timing."""
    summary: dict[str, Any] = {}
    for key in ("construct_ms", "fit_ms"):
        per_side = {}
        for side in SIDES:
            values = [s[key] for s in samples[side]]
            quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
            per_side[side] = {"median": statistics.median(values), "q1": quartiles[0], "q3": quartiles[2]}
        # paired ratios (round by round) are robust to drift in the machine's load over the run
        paired = [a[key] / b[key] for a, b in zip(samples["patched"], samples["removed"], strict=True)]
        summary[key] = {
            **per_side,
            "ratio_of_medians": ratio(per_side["patched"]["median"], per_side["removed"]["median"]),
            "median_paired_ratio": statistics.median(paired),
        }
    return summary


def markdown(data: dict[str, Any]) -> str:
    rows = []
    for key, label in (("construct_ms", "`Trainer(...)`"), ("fit_ms", f"`fit` ({data['steps']} steps, BoringModel)")):
        s = data["summary"][key]
        rows.append(
            [
                label,
                f"{fmt(s['patched']['median'], '.2f')} ms ({fmt(s['patched']['q1'], '.2f')} to "
                f"{fmt(s['patched']['q3'], '.2f')})",
                f"{fmt(s['removed']['median'], '.2f')} ms ({fmt(s['removed']['q1'], '.2f')} to "
                f"{fmt(s['removed']['q3'], '.2f')})",
                fmt(s["ratio_of_medians"], ".3f", "x"),
                fmt(s["median_paired_ratio"], ".3f", "x"),
            ]
        )
    headers = ("what", "patched, `use_compile=None`", "patch removed", "ratio of medians", "median paired ratio")
    return "\n\n".join(
        [
            report_header("Zero cost: the patch with `use_compile=None` against no patch", data),
            f"One process, {data['rounds']} rounds per side, alternating (A/B, then B/A), after one warm-up round each;"
            " `lightning_compile_patch.remove()` / `apply()` switch between the sides, and each switch is checked"
            " (the Trainer's signature has `use_compile` only when patched). Medians with the interquartile range;"
            " ratios are patched / removed (1.00 = no cost). The paired ratio compares the two runs of the same round."
            f" {data['threads']} torch thread(s).",
            markdown_table(headers, rows),
        ]
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=60, help="timed runs per side")
    parser.add_argument("--steps", type=int, default=5, help="fit steps of BoringModel")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # no per-fit info lines
    machine = machine_info()  # before the rounds: the load average at the start
    samples: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    for side in SIDES:  # warm-up: imports, first-call caches
        one_round(side, args.steps)
    for i in range(args.rounds):
        order = SIDES if i % 2 == 0 else SIDES[::-1]
        for side in order:
            samples[side].append(one_round(side, args.steps))
    lightning_compile_patch.apply()
    data = {
        "benchmark": "zero_cost",
        "stem": "zero_cost",
        "rounds": args.rounds,
        "steps": args.steps,
        "threads": torch.get_num_threads(),
        "command": command_line(argv),
        "machine": machine,
        "date": now(),
        "samples": samples,
        "summary": summarize(samples),
    }
    write_report(args.out, "zero_cost", data, markdown(data))
    print(markdown(data))
    if args.out.resolve() == RESULTS_DIR.resolve():
        print(f"updated {update_index()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
