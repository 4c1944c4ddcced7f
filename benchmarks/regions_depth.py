"""The table of docs/benchmarks/regions_depth.md: whole-model against regional compilation as the model gets deeper.

    python benchmarks/regions_depth.py --depths 6,12,24
    python benchmarks/regions_depth.py --depths 2 --steps 3 --toolchain empty --out /tmp/x   # quick

For each depth, ``Trainer(use_compile=True)`` and ``Trainer(use_compile={"regions": "auto"})`` train the narrow demo
GPT on one device, each in a fresh process with a fresh inductor cache: once from an empty cache, once from one that
an unrelated compile warmed first (``--toolchain``), which leaves out the one-time cost of a first compile.
"""

import argparse
import itertools
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from harness import RESULTS_DIR, RunSpec, fmt, markdown_table, new_report, ratio, report_header, run_fresh, write_report

MODEL = {"n_head": 4, "n_embd": 64, "block_size": 64, "vocab_size": 256, "batch_size": 8}
PATHS = {"whole": True, "regional": {"regions": "auto"}}
TOOLCHAINS = {"empty": False, "warm": True}  # whether an unrelated compile warms the inductor cache first


def _row(data: dict[str, Any], depth: int, toolchain: str) -> list[Any]:
    suffix = "-warm" if TOOLCHAINS[toolchain] else ""
    whole, regional = (data["results"].get(f"{path}-{depth}{suffix}", {}) for path in PATHS)
    w, r = ({key: v for key, v in x.items() if x.get("status") == "ok"} for x in (whole, regional))

    def pair(key: str) -> str:
        return f"{w.get(key)} / {r.get(key)}"

    return [
        depth,
        "toolchain warmed" if TOOLCHAINS[toolchain] else "empty",
        fmt((w.get("parameters") or r.get("parameters") or 0) / 1e6, ".2f", "M"),
        *(fmt(x.get("first_step_s"), ".1f", " s") if x else "failed" for x in (w, r)),
        fmt(ratio(r.get("first_step_s"), w.get("first_step_s")), ".2f", "x"),
        *(fmt(x.get("steady_step_ms"), ".1f", " ms") for x in (w, r)),
        fmt(ratio(r.get("steady_step_ms"), w.get("steady_step_ms")), ".2f", "x"),
        pair("graphs"),
        pair("graph_breaks_other"),
        pair("recompiles"),
        " / ".join(fmt(x.get("python_calls_per_step"), ",.0f") for x in (w, r)),
    ]


def markdown(data: dict[str, Any]) -> str:
    headers = ("depth", "inductor cache", "params", "first step, whole", "first step, regional")
    headers += ("first step regional / whole", "steady, whole", "steady, regional", "steady regional / whole")
    headers += ("graphs (w / r)", "other breaks (w / r)", "recompiles (w / r)", "Python calls per step (w / r)")
    rows = [_row(data, depth, toolchain) for depth in data["depths"] for toolchain in data["toolchains"]]
    notes = sorted(
        {
            note
            for key, result in data["results"].items()
            if key.startswith("regional")
            for note in (result.get("compile_summary") or {}).get("notes", [])
        }
    )
    return "\n\n".join(
        [
            report_header("Regional against whole-model compilation, by depth", data),
            f"The demo GPT ({', '.join(f'{k} {v}' for k, v in MODEL.items())}), fp32, one device, inductor,"
            f" {data['steps']} steps, steady step = median after the first {data['warmup']}, {data['threads']} torch"
            ' thread(s). Whole: `use_compile=True`; regional: `use_compile={"regions": "auto"}`'
            + (', both with `"fullgraph": True`' if data.get("fullgraph") else "")
            + ". Each run in a fresh"
            " process with a new inductor cache, so the first step is a cold compile of the model: `empty`, or"
            " `toolchain warmed` by an unrelated compile first, which leaves out the one-time cost of a first compile"
            " on this machine. Goals: first step regional / whole at most 0.5 at 12 blocks, steady at most 1.05."
            " Python calls per step: the host's function calls in one step (median of 2 extra, untimed steps), the"
            " work each compiled region's call and backward adds around its kernels."
            + (f" How the regional runs compiled the blocks (summary lines): {'; '.join(notes)}." if notes else ""),
            markdown_table(headers, rows),
        ]
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", default="6,12,24", help="comma-separated n_layer values")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (0: torch's default)")
    parser.add_argument(
        "--toolchain", choices=("empty", "warm", "both"), default="both", help="the cache to start from"
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--stem", default="regions_depth", help="the name of the result files (another torch's run)")
    parser.add_argument(
        "--fullgraph", action="store_true", help="both paths with fullgraph=True (regions nest where torch allows)"
    )
    args = parser.parse_args(argv)
    depths = [int(d) for d in args.depths.split(",")]
    toolchains = list(TOOLCHAINS) if args.toolchain == "both" else [args.toolchain]
    data = new_report(args.stem, argv, model=MODEL, depths=depths, toolchains=toolchains, results={})
    data.update(steps=args.steps, warmup=args.warmup, threads=args.threads or None, fullgraph=args.fullgraph)
    with tempfile.TemporaryDirectory(prefix="lcp-regions-") as tmp:
        for depth, toolchain, (path, use_compile) in itertools.product(depths, toolchains, PATHS.items()):
            key = f"{path}-{depth}" + ("-warm" if TOOLCHAINS[toolchain] else "")
            spec = RunSpec(key, model={**MODEL, "n_layer": depth}, steps=args.steps, warmup=args.warmup)
            if args.fullgraph:
                use_compile = {"fullgraph": True, **({} if use_compile is True else use_compile)}
            spec.use_compile, spec.threads, spec.count_python_calls = use_compile, args.threads or None, 2
            print(f"{key}: {args.steps} steps in a fresh process, inductor cache {toolchain}", flush=True)
            result = data["results"][key] = run_fresh(spec, Path(tmp) / key, warm_toolchain=TOOLCHAINS[toolchain])
            print(f"    {result.get('first_step_s') or result.get('error', '')[:300]}", flush=True)
            write_report(args.out, data, markdown(data))
    print(markdown(data))
    return 0 if all(r["status"] == "ok" for r in data["results"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
