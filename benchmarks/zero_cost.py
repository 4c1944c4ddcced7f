"""The table of docs/benchmarks/zero_cost.md: what the patch costs a run that does not use it (``use_compile=None``).

    python benchmarks/zero_cost.py
    python benchmarks/zero_cost.py --rounds 3 --out /tmp/x   # quick

A ratio within one process, so that machine noise hits both sides alike: ``Trainer(...)`` and a tiny ``fit``
(``BoringModel``) with the patch applied, against the same with it removed (``lightning_compile_patch.remove()`` /
``apply()``), alternating A/B and B/A round by round. 1.00 is no cost.
"""

import argparse
import gc
import inspect
import logging
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import torch

import lightning_compile_patch
from harness import QUIET, RESULTS_DIR, fmt, markdown_table, new_report, ratio, report_header, write_report
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

SIDES = ("patched", "removed")


def one_round(side: str, steps: int) -> dict[str, float]:
    """Applies or removes the patch, checks that the Trainer changed, and times ``Trainer(...)`` and ``fit`` once."""
    (lightning_compile_patch.apply if side == "patched" else lightning_compile_patch.remove)()
    has_argument = "use_compile" in inspect.signature(Trainer.__init__).parameters
    if has_argument != (side == "patched") or lightning_compile_patch.is_applied() != (side == "patched"):
        raise RuntimeError(f"the patch did not toggle: side {side}, use_compile argument present: {has_argument}")
    model, kwargs = BoringModel(), {"use_compile": None} if side == "patched" else {}
    gc.collect()
    start = time.perf_counter()
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=steps, **QUIET, **kwargs)
    constructed = time.perf_counter()
    trainer.fit(model)
    return {"construct_ms": 1000 * (constructed - start), "fit_ms": 1000 * (time.perf_counter() - constructed)}


def summarize(samples: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Medians, quartiles and the patched / removed ratios of each timing (paired: round by round)."""
    summary: dict[str, Any] = {}
    for key in ("construct_ms", "fit_ms"):
        per_side = {}
        for side in SIDES:
            values = [s[key] for s in samples[side]]
            q1, _, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
            per_side[side] = {"median": statistics.median(values), "q1": q1, "q3": q3}
        paired = [a[key] / b[key] for a, b in zip(samples["patched"], samples["removed"], strict=True)]
        ratios = {"ratio_of_medians": ratio(per_side["patched"]["median"], per_side["removed"]["median"])}
        summary[key] = {**per_side, **ratios, "median_paired_ratio": statistics.median(paired)}
    return summary


def markdown(data: dict[str, Any]) -> str:
    rows = []
    for key, label in (("construct_ms", "`Trainer(...)`"), ("fit_ms", f"`fit` ({data['steps']} steps, BoringModel)")):
        s = data["summary"][key]
        sides = [f"{s[x]['median']:.2f} ms ({s[x]['q1']:.2f} to {s[x]['q3']:.2f})" for x in SIDES]
        rows.append([label, *sides, fmt(s["ratio_of_medians"], ".3f", "x"), fmt(s["median_paired_ratio"], ".3f", "x")])
    headers = ("what", "patched, `use_compile=None`", "patch removed", "ratio of medians", "median paired ratio")
    return "\n\n".join(
        [
            report_header("Zero cost: the patch with `use_compile=None` against no patch", data),
            f"One process, {data['rounds']} rounds per side, alternating (A/B, then B/A), after one warm-up round"
            " each; `lightning_compile_patch.remove()` / `apply()` switch between the sides, and each switch is"
            " checked (the Trainer's signature has `use_compile` only when patched). Medians with the interquartile"
            " range; ratios are patched / removed (1.00 = no cost). The paired ratio compares the two runs of the same"
            f" round. {data['threads']} torch thread(s).",
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
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # no per-fit info lines
    data = new_report("zero_cost", argv, rounds=args.rounds, steps=args.steps, threads=1)  # the load before the rounds
    samples: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    for side in SIDES:  # warm-up: imports, first-call caches
        one_round(side, args.steps)
    for i in range(args.rounds):
        for side in SIDES if i % 2 == 0 else SIDES[::-1]:
            samples[side].append(one_round(side, args.steps))
    lightning_compile_patch.apply()
    data.update(samples=samples, summary=summarize(samples))
    write_report(args.out, data, markdown(data))
    print(markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
