"""The table of docs/benchmarks/compiled_autograd.md: `use_compile=True` with and without `compiled_autograd`.

    python benchmarks/compiled_autograd.py                      # CPU, gloo: 2 ranks and 1 (DDP)
    python benchmarks/compiled_autograd.py --accelerator cuda --world-sizes 1 --strategy auto --repeats 1  # one GPU
    python benchmarks/compiled_autograd.py --steps 4 --layers 1 --width 64 --repeats 1 --out /tmp/x  # quick

Eager, ``use_compile=True`` (the backward run by autograd's engine, DDP's C++ reducer all-reducing its buckets) and
``{"compiled_autograd": True}`` (the backward compiled, DDP's python reducer all-reducing inside it) train the demo GPT,
each configuration in fresh processes, interleaved: steady step, first step and the graphs compiled (forward and
backward).
"""

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from harness import (
    RESULTS_DIR,
    RunSpec,
    fmt,
    markdown_table,
    new_report,
    ratio,
    report_header,
    run_interleaved,
    spread,
)

CONFIGS: dict[str, Any] = {"eager": None, "whole": True, "compiled_autograd": {"compiled_autograd": True}}


def _row(results: dict[str, Any], ranks: int, name: str) -> list[Any]:
    r = results[f"{name}@{ranks}"]
    if r["status"] != "ok":
        return [ranks, f"`{name}`", f"failed: {r['error'].splitlines()[0][:120]}", *[""] * 5]
    whole = results.get(f"whole@{ranks}") or {}
    notes = ((r.get("compile_summary") or {}).get("notes")) or []
    return [
        ranks,
        f"`{name}`",
        spread(r, "steady_step_ms", ".1f", " ms"),
        fmt(
            ratio(r["steady_step_ms"], whole.get("steady_step_ms") if whole.get("status") == "ok" else None), ".3f", "x"
        ),
        spread(r, "first_step_s", ".1f", " s"),
        r["graphs"],
        "; ".join(notes) or "—",
        fmt(r.get("final_loss"), ".4f"),
    ]


def markdown(data: dict[str, Any]) -> str:
    results = data["results"]
    headers = (
        "ranks",
        "configuration",
        "steady step",
        "vs whole",
        "first step",
        "graphs",
        "summary note",
        "final loss",
    )
    rows = [_row(results, w, name) for w in data["world_sizes"] for name in CONFIGS if f"{name}@{w}" in results]
    return "\n\n".join(
        [
            report_header("`compiled_autograd`: the backward compiled, DDP's all-reduce inside it", data),
            f'The demo GPT ({", ".join(f"{k} {v}" for k, v in data["model"].items())}), `strategy="{data["strategy"]}"`'
            f" on {data['accelerator']}, inductor, {data['steps']} steps per rank, steady step = median after the"
            f" first {data['warmup']}, 1 torch thread per rank. Each configuration {data['repeats']} time(s) in a fresh"
            " process with an empty inductor cache, interleaved: the median over them, their range in brackets."
            " *graphs*: every graph Dynamo compiled on rank 0, the backward graphs of compiled autograd included.",
            markdown_table(headers, rows),
        ]
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="training steps per rank")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256, help="n_embd")
    parser.add_argument("--world-sizes", default="2,1", help="comma-separated devices values")
    parser.add_argument("--strategy", default="ddp", help="ddp, or auto for one device")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per configuration")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    model = {"n_layer": args.layers, "n_head": 4, "n_embd": args.width, "block_size": 32, "vocab_size": 256}
    model["batch_size"] = 4
    world_sizes = [int(w) for w in args.world_sizes.split(",")]
    data = new_report("compiled_autograd", argv, model=model, world_sizes=world_sizes, results={}, runs=[])
    data.update(steps=args.steps, warmup=args.warmup, repeats=args.repeats, strategy=args.strategy)
    data["accelerator"] = args.accelerator

    def spec_for(name: str, world_size: int) -> RunSpec:
        spec = RunSpec(name, model=model, steps=args.steps, warmup=args.warmup, devices=world_size)
        spec.strategy, spec.use_compile, spec.accelerator = args.strategy, CONFIGS[name], args.accelerator
        spec.threads = 1 if args.accelerator == "cpu" else None
        return spec

    with tempfile.TemporaryDirectory(prefix="lcp-compiled-autograd-") as tmp:
        run_interleaved(data, list(CONFIGS), world_sizes, args.repeats, spec_for, Path(tmp), args.out, markdown)
    print(markdown(data))
    return 0 if all(r["status"] == "ok" for r in data["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
