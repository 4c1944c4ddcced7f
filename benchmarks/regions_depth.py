"""Cold start of whole-model against regional compilation, as the model gets deeper.

    python benchmarks/regions_depth.py                     # depths 6, 12, 24 on the CPU
    python benchmarks/regions_depth.py --depths 2,4 --steps 4 --out /tmp/x

For each depth, ``Trainer(use_compile=True)`` and ``Trainer(use_compile={"regions": "auto"})`` train the demo GPT
(narrow, so that it is feasible on a CPU) on one device, each in a fresh process with a fresh inductor cache.
Whole-model compilation traces and compiles every block inside one graph; regional compilation compiles one block and
reuses it, so its cold first step should grow much more slowly with depth.

Each configuration runs twice (``--toolchain both``, the default): once from an empty inductor cache, and once from a
cache that a small unrelated compile has warmed first (``common.warm_toolchain``). The second still compiles every
graph of the model cold, but not the one-time cost per cache directory that any first compile pays; that is the cold
start of a user whose machine has compiled anything before.

Writes ``regions_depth.json`` and ``regions_depth.md`` into ``--out`` (default ``docs/benchmarks/``).

"""

import argparse
import itertools
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    RESULTS_DIR,
    RunSpec,
    command_line,
    fmt,
    machine_info,
    markdown_table,
    now,
    ratio,
    report_header,
    run_fresh,
    update_index,
    write_report,
)

MODEL = {"n_head": 4, "n_embd": 64, "block_size": 64, "vocab_size": 256, "batch_size": 8}
PATHS = {"whole": True, "regional": {"regions": "auto"}}


#: Each inductor cache a run can start from: whether the toolchain is warmed first.
TOOLCHAINS = {"empty": False, "warm": True}


def _key(path: str, depth: int, toolchain: str) -> str:
    """The name of one run in the results: ``whole-12``, ``regional-12-warm``."""
    return f"{path}-{depth}" + ("-warm" if TOOLCHAINS[toolchain] else "")


def markdown(data: dict[str, Any]) -> str:
    """The table: for each depth and cache state, first and steady step of whole against regional."""

    def get(r: dict[str, Any], key: str) -> Optional[float]:
        return r.get(key) if r.get("status") == "ok" else None

    rows = []
    for depth in data["depths"]:
        for toolchain in data["toolchains"]:
            whole = data["results"].get(_key("whole", depth, toolchain), {})
            regional = data["results"].get(_key("regional", depth, toolchain), {})
            rows.append(
                [
                    depth,
                    "toolchain warmed" if TOOLCHAINS[toolchain] else "empty",
                    fmt((get(whole, "parameters") or get(regional, "parameters") or 0) / 1e6, ".2f", "M"),
                    fmt(get(whole, "first_step_s"), ".1f", " s") if whole.get("status") == "ok" else "failed",
                    fmt(get(regional, "first_step_s"), ".1f", " s") if regional.get("status") == "ok" else "failed",
                    fmt(ratio(get(regional, "first_step_s"), get(whole, "first_step_s")), ".2f", "x"),
                    fmt(get(whole, "steady_step_ms"), ".1f", " ms"),
                    fmt(get(regional, "steady_step_ms"), ".1f", " ms"),
                    fmt(ratio(get(regional, "steady_step_ms"), get(whole, "steady_step_ms")), ".2f", "x"),
                    f"{get(whole, 'graphs')} / {get(regional, 'graphs')}",
                    f"{get(whole, 'graph_breaks_other')} / {get(regional, 'graph_breaks_other')}",
                    f"{get(whole, 'recompiles')} / {get(regional, 'recompiles')}",
                    " / ".join(fmt(get(r, "python_calls_per_step"), ",.0f") for r in (whole, regional)),
                ]
            )
    headers = (
        "depth",
        "inductor cache",
        "params",
        "first step, whole",
        "first step, regional",
        "first step regional / whole",
        "steady, whole",
        "steady, regional",
        "steady regional / whole",
        "graphs (w / r)",
        "other breaks (w / r)",
        "recompiles (w / r)",
        "Python calls per step (w / r)",
    )
    model = ", ".join(f"{k} {v}" for k, v in MODEL.items())
    return "\n\n".join(
        [
            report_header("Regional against whole-model compilation, by depth", data),
            f'The demo GPT ({model}), fp32, one device (`strategy="auto"`), backend inductor, {data["steps"]} steps,'
            f" steady step = median after the first {data['warmup']}, {data['threads']} torch thread(s) per process."
            ' Whole: `Trainer(use_compile=True)`; regional: `Trainer(use_compile={"regions": "auto"})`. Each run in a'
            " fresh process with a new inductor cache, so the first step is a cold compile of the model. Cache"
            " `empty`: nothing at all in it; `toolchain warmed`: a small unrelated function was compiled into it"
            " first, in another process, so that the one-time cost of a first compile on this machine is left out."
            " first step regional / whole below 1: regional starts sooner (the goal: at most 0.33 at 12 blocks);"
            " steady regional / whole above 1: regional steps are slower (the goal: at most 1.05). Python calls per"
            " step: the function calls of the host's Python in one training step (median of 2 extra, untimed steps"
            " after the timed ones): the work that each compiled region's call and backward adds around its kernels.",
            markdown_table(headers, rows),
        ]
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", default="6,12,24", help="comma-separated n_layer values")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (0: torch's default)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument(
        "--toolchain", choices=("empty", "warm", "both"), default="both", help="the inductor cache each run starts from"
    )
    args = parser.parse_args(argv)
    depths = [int(d) for d in args.depths.split(",")]
    toolchains = list(TOOLCHAINS) if args.toolchain == "both" else [args.toolchain]
    data: dict[str, Any] = {
        "benchmark": "regions_depth",
        "stem": "regions_depth",
        "model": MODEL,
        "depths": depths,
        "toolchains": toolchains,
        "steps": args.steps,
        "warmup": args.warmup,
        "threads": args.threads or None,
        "command": command_line(argv),
        "machine": machine_info(),
        "date": now(),
        "results": {},
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lcp-regions-") as tmp:
        for depth, toolchain, (path, use_compile) in itertools.product(depths, toolchains, PATHS.items()):
            key = _key(path, depth, toolchain)
            spec = RunSpec(
                name=key,
                model={**MODEL, "n_layer": depth},
                steps=args.steps,
                warmup=args.warmup,
                use_compile=use_compile,
                threads=args.threads or None,
                count_python_calls=2,
            )
            print(f"{key}: {args.steps} steps in a fresh process, inductor cache {toolchain}", flush=True)
            result = run_fresh(spec, Path(tmp) / key, warm_toolchain_first=TOOLCHAINS[toolchain])
            data["results"][key] = result
            if result["status"] == "ok":
                print(
                    f"    first step {result['first_step_s']:.1f} s, steady {result['steady_step_ms']:.1f} ms",
                    flush=True,
                )
            else:
                print(f"    FAILED: {result['error'][:300]}", flush=True)
            data["total_s"] = time.perf_counter() - started
            write_report(args.out, "regions_depth", data, markdown(data))
    print()
    print(markdown(data))
    if args.out.resolve() == RESULTS_DIR.resolve():
        print(f"updated {update_index()}")
    return 0 if all(r["status"] == "ok" for r in data["results"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
