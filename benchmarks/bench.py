"""The tables of docs/benchmarks/cpu.md and cuda.md: the demo GPT under every compile path, each in a fresh process.

    python benchmarks/bench.py --mode cpu     # a small GPT on the CPU, inductor
    python benchmarks/bench.py --mode cuda    # GPT-2 small (124M), sequence 1024, batch 16, bf16-mixed
    python benchmarks/bench.py --smoke --out /tmp/x   # tiny, aot_eager, a few steps: what CI runs

Paths (``--paths``), each under each strategy (``--strategies``: ``auto`` is one device, ``ddp`` DDP on one device):
``eager`` (``use_compile=None``); ``stock``, Lightning's own path (``fit(from_compiled(torch.compile(model)))``:
the steps compiled before the wrap; logging after the step, which stock Lightning can compile); ``stock_logging``, the
same with ``self.log`` inside the step; ``whole`` (``use_compile=True``); ``regional`` (``{"regions": "auto"}``);
``cache_warm`` (``{"cache": DIR}``: one process fills ``DIR``, reported as ``cache_cold``, a second one starts from
it); and ``plain_loop``, no Lightning, once, the ceiling every table compares with. Writes MODE.json and MODE.md into
``--out``.
"""

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from harness import RESULTS_DIR, RunSpec, fmt, markdown_table, new_report, ratio, report_header, run_fresh, write_report

PATHS = ("eager", "stock", "stock_logging", "whole", "regional", "cache_warm", "plain_loop")
STRATEGIES = ("auto", "ddp")
#: What the ratios rely on; ``stock_logging`` may fail (that is what it shows).
REQUIRED = ("eager", "stock", "whole", "regional", "cache_cold", "cache_warm", "plain_loop")


def _gpt(*sizes: int) -> dict[str, int]:
    """GPTConfig's sizes, in this order."""
    return dict(zip(("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "batch_size"), sizes, strict=True))


#: Each mode: what it trains, and the RunSpec fields of every path (``steps``: the default of ``--steps``). One torch
#: thread on a shared CPU: two threads on two busy cores made a step wait for a descheduled thread.
MODES: dict[str, tuple[str, dict[str, Any]]] = {
    "cpu": (
        "a 4-layer GPT (n_embd 128, 4 heads, sequence 128, batch 8, vocabulary 256), fp32, on the CPU",
        {"model": _gpt(4, 4, 128, 128, 256, 8), "steps": 30, "warmup": 5, "threads": 1},
    ),
    "cuda": (
        "GPT-2 small (124M: 12 layers, n_embd 768, 12 heads, vocabulary 50257), sequence 1024, batch 16, bf16-mixed,"
        " on one GPU",
        {
            "model": _gpt(12, 12, 768, 1024, 50257, 16),
            "steps": 50,
            "warmup": 10,
            "accelerator": "cuda",
            "precision": "bf16-mixed",
            "matmul_precision": "high",
        },
    ),
    "smoke": (
        "a tiny GPT (2 layers, n_embd 32, sequence 32, batch 4), backend aot_eager: a smoke check, not a performance"
        " number",
        {"model": _gpt(2, 2, 32, 32, 64, 4), "steps": 4, "warmup": 1, "compile_backend": "aot_eager", "threads": 1},
    ),
}


def use_compile_for(path: str, backend: str, cache_dir: Path) -> Any:
    """``Trainer(use_compile=...)`` of a path; with inductor, exactly what a user writes."""
    backend_kw = {} if backend == "inductor" else {"backend": backend}
    cache = {"cache": str(cache_dir), **backend_kw}
    if path in ("eager", "plain_loop", "stock", "stock_logging"):
        return None  # `stock` passes `from_compiled(torch.compile(model))`: Lightning's own placement
    return {"whole": backend_kw or True, "regional": {"regions": "auto", **backend_kw}}.get(path, cache)


def run_all(base: dict[str, Any], args: argparse.Namespace, workdir: Path, data: dict[str, Any]) -> list[dict]:
    """Each path of each strategy in a fresh process; the report is rewritten after each (partial runs survive)."""
    runs = [
        (strategy, name)
        for strategy in args.strategies
        for path in args.paths
        if path != "plain_loop"
        for name in (("cache_cold", "cache_warm") if path == "cache_warm" else (path,))
    ] + ([("none", "plain_loop")] if "plain_loop" in args.paths else [])
    results: list[dict[str, Any]] = []
    for i, (strategy, name) in enumerate(runs):
        use_compile = use_compile_for(name, base["compile_backend"], workdir / strategy / "compile-cache")
        kind, log_in_step = ("plain_loop" if name == "plain_loop" else "lightning"), name != "stock"
        spec = RunSpec(name, kind, strategy=strategy, use_compile=use_compile, log_in_step=log_in_step, **base)
        spec.compile_input = name.startswith("stock")
        print(f"[{i + 1}/{len(runs)}] {strategy} {name}: use_compile={use_compile!r}", flush=True)
        result = run_fresh(spec, workdir / strategy / name, inductor_cache=not name.startswith("cache_"))
        results.append({**result, "strategy": strategy})
        print(f"    {result['error'].splitlines()[0][:300] if result['status'] != 'ok' else 'ok'}", flush=True)
        data.update(results=ratios(results), complete=i + 1 == len(runs))
        write_report(args.out, data, markdown(data))
    return results


def ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adds to each result: steady step against ``stock`` and ``plain_loop``, first step against ``whole``."""
    ok = {(r["strategy"], r["name"]): r for r in results if r["status"] == "ok"}
    plain = ok.get(("none", "plain_loop"), {})
    for (strategy, _), r in ok.items():
        stock, whole = ok.get((strategy, "stock"), {}), ok.get((strategy, "whole"), {})
        r["steady_vs_stock"] = ratio(r["steady_step_ms"], stock.get("steady_step_ms"))
        r["steady_vs_plain_loop"] = ratio(r["steady_step_ms"], plain.get("steady_step_ms"))
        r["first_step_vs_whole"] = ratio(r["first_step_s"], whole.get("first_step_s"))
    return results


HEADERS = ("path", "first step", "steady step", "tokens/s", "peak mem", "graphs", "recompiles", "breaks (other)")
HEADERS += ("breaks (expected)", "steady vs stock", "steady vs plain loop", "first step vs whole", "final loss")


def _row(r: dict[str, Any]) -> list[str]:
    if r["status"] != "ok":
        return [f"`{r['name']}`", "failed: " + r["error"].splitlines()[0].replace("|", "\\|")[:160], *[""] * 11]
    other, summary = str(r["graph_breaks_other"]), r.get("compile_summary")
    if summary and summary.get("graph_breaks") is not None:  # the same count, from the package's run summary
        other += f" ({summary['graph_breaks'] - summary.get('expected_breaks', summary.get('intentional_breaks', 0))})"
    return [
        f"`{r['name']}`" + (" (no strategy)" if r["strategy"] == "none" else ""),
        fmt(r["first_step_s"], ".2f", " s"),
        fmt(r["steady_step_ms"], ".1f", " ms"),
        fmt(r["tokens_per_s"], ",.0f"),
        fmt(r["peak_memory_mib"], ",.0f", " MiB"),
        str(r["graphs"]),
        str(r["recompiles"]),
        other,
        str(r["graph_breaks_intentional"]),
        *(fmt(r.get(key), ".2f", "x") for key in ("steady_vs_stock", "steady_vs_plain_loop", "first_step_vs_whole")),
        fmt(r.get("final_loss"), ".4f"),
    ]


def markdown(data: dict[str, Any]) -> str:
    """One table per strategy, the plain loop in each."""
    results, mode = data["results"], data["mode"]
    plain = [_row(r) for r in results if r["strategy"] == "none"]
    parts = [
        report_header(f"`bench.py`: compile paths, {mode} mode", data),
        f"Model: {data['description']}. {data['steps']} training steps per path; steady step = median of the steps"
        f" after the first {data['warmup']}. Backend: `{data['backend']}`. Torch threads per process:"
        f" {data.get('threads') or 'torch default'}. Peak memory: "
        + ("`torch.cuda.max_memory_allocated`." if mode == "cuda" else "peak RSS of the process (`ru_maxrss`).")
        + ("" if data.get("complete") else "\n\n**Incomplete: the run was interrupted; these are the paths so far.**"),
    ]
    parts += ["Notes:\n\n" + "\n".join(f"* {note}" for note in data["notes"])] if data.get("notes") else []
    titles = {"auto": 'Single device (`strategy="auto"`, devices=1)', "ddp": 'DDP, world size 1 (`strategy="ddp"`)'}
    for strategy in dict.fromkeys(r["strategy"] for r in results if r["strategy"] != "none"):
        rows = [_row(r) for r in results if r["strategy"] == strategy] + plain
        parts.append(f"## {titles[strategy]}\n\n" + markdown_table(HEADERS, rows))
    parts.append(
        "Columns: *first step* is the whole first optimizer step, compile included (cold: empty inductor cache;"
        " `cache_warm` reads what `cache_cold` wrote). *breaks (other)* are graph breaks that are not expected ones"
        " (in DDP's own code, such as its inner call `_inside_ddp_forward`, or at our region boundaries), from"
        " `torch._dynamo.utils.counters`; in brackets, the same count from the package's run summary."
        " *recompiles*: compilation records with `cache_size > 0`. Ratios below 1 are faster. `stock` logs after the"
        " step (stock Lightning cannot compile a step that calls `self.log` on torch 2.13, see `stock_logging`)."
    )
    return "\n\n".join(parts)


def _subset(text: Optional[str], valid: Sequence[str], default: Sequence[str]) -> tuple[str, ...]:
    chosen = tuple(part.strip() for part in (text or ",".join(default)).split(",") if part.strip())
    if not chosen or set(chosen) - set(valid):
        raise SystemExit(f"choose from {', '.join(valid)}; got {text!r}")
    return chosen


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--smoke", action="store_true", help="a tiny GPT, aot_eager, 4 steps: a smoke check (CI)")
    parser.add_argument("--paths", help=f"comma-separated subset of {','.join(PATHS)}")
    parser.add_argument("--strategies", help=f"comma-separated subset of {','.join(STRATEGIES)}")
    parser.add_argument("--steps", type=int, help="training steps per path (at least 2)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where to write MODE.json and MODE.md")
    parser.add_argument("--workdir", type=Path, help="keep each process's log, spec and caches here")
    parser.add_argument("--note", action="append", default=[], help="a line for the report's notes (repeatable)")
    args = parser.parse_args(argv)
    stem = "smoke" if args.smoke else args.mode
    description, base = MODES[stem]
    default_paths = [p for p in PATHS if p != "stock_logging"] if args.smoke else PATHS
    args.paths = _subset(args.paths, PATHS, default_paths)
    args.strategies = _subset(args.strategies, STRATEGIES, ["auto"] if args.smoke else STRATEGIES)
    base = {"compile_backend": "inductor", "precision": "32-true", **base, "steps": args.steps or base["steps"]}
    base["warmup"] = min(base["warmup"], base["steps"] - 1)
    if base["steps"] < 2:
        parser.error("--steps must be at least 2 (a first step and a steady one)")
    keys = ("model", "steps", "warmup", "precision", "threads")
    data = new_report(
        stem,
        argv,
        mode=stem,
        description=description,
        backend=base["compile_backend"],
        strategies=args.strategies,
        paths=args.paths,
        notes=args.note,
        **{k: base.get(k) for k in keys},
    )
    with tempfile.TemporaryDirectory(prefix="lcp-bench-") as tmp:
        results = run_all(base, args, args.workdir or Path(tmp), data)
    print((args.out / f"{stem}.md").read_text())
    failed = [f"{r['strategy']}/{r['name']}" for r in results if r["status"] != "ok" and r["name"] in REQUIRED]
    print(f"failed: {', '.join(failed)}" if failed else "all paths ran", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
