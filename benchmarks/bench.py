"""One command: the demo GPT trained under every compile path, each in a fresh process with a fresh inductor cache.

    python benchmarks/bench.py --mode cpu           # a small GPT on the CPU, inductor (what docs/ shows)
    python benchmarks/bench.py --mode cuda          # GPT-2 small (124M), sequence 1024, batch 16, bf16-mixed
    python benchmarks/bench.py --mode cuda --dry-run   # print the plan, run nothing
    python benchmarks/bench.py --smoke --out /tmp/x    # tiny, aot_eager, about a minute: what CI runs

Paths (``--paths``), each under each strategy (``--strategies``: ``auto`` is one device, ``ddp`` is DDP with world
size 1):

* ``eager``: ``use_compile=None`` and a plain model;
* ``stock``: Lightning's own path, ``Trainer(use_compile=False)`` and ``trainer.fit(torch.compile(model))``. Stock
  Lightning cannot compile a step that calls ``self.log`` on torch 2.13, so this module logs after the step instead
  (``worker.LogOutsideStepGPT``; the same model, loss and log call);
* ``stock_logging``: the same, with the unchanged module (``self.log`` inside ``training_step``), to show whether
  stock Lightning runs it at all;
* ``whole``: ``Trainer(use_compile=True)`` and a plain model;
* ``regional``: ``Trainer(use_compile={"regions": "auto"})``;
* ``cache_warm``: ``Trainer(use_compile={"cache": DIR})``: one process fills ``DIR`` (reported as ``cache_cold``),
  then a second fresh process with the same ``DIR`` is measured. Neither gets a ``TORCHINDUCTOR_CACHE_DIR``: the
  package points inductor at ``DIR`` itself;
* ``plain_loop``: no Lightning: ``torch.compile`` on the model and on the loss, the same AdamW, data and precision.
  It has no strategy, runs once, and every strategy's table compares against it.

Writes ``MODE.json`` (every raw number), ``MODE.md`` (the tables) and ``MODE.png`` (a chart, if matplotlib is
installed) into ``--out`` (default ``docs/benchmarks/``), and then, when writing there, regenerates
``docs/benchmarks.md``.

"""

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
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
    pyplot,
    ratio,
    report_header,
    run_fresh,
    update_index,
    write_report,
)

PATHS = ("eager", "stock", "stock_logging", "whole", "regional", "cache_warm", "plain_loop")
STRATEGIES = ("auto", "ddp")
#: The paths whose numbers the tests and the ratios rely on; ``stock_logging`` may fail (that is what it shows).
REQUIRED_PATHS = ("eager", "stock", "whole", "regional", "cache_cold", "cache_warm", "plain_loop")
PLAIN_LOOP_STRATEGY = "none"


@dataclass(frozen=True)
class Mode:
    """A size and a device to run every path at."""

    name: str
    description: str
    model: dict[str, int]
    steps: int
    warmup: int
    backend: str
    accelerator: str
    precision: str
    matmul_precision: Optional[str] = None
    #: ``torch.set_num_threads`` per process. One on a shared CPU: two OpenMP threads on two busy cores make a step
    #: wait for a descheduled thread (seen here: 4 ms steps became 370 ms while another job ran).
    threads: Optional[int] = None
    paths: tuple[str, ...] = PATHS
    strategies: tuple[str, ...] = STRATEGIES
    notes: list[str] = field(default_factory=list)


MODES: dict[str, Mode] = {
    "cpu": Mode(
        name="cpu",
        description="a 4-layer GPT (n_embd 128, 4 heads, sequence 128, batch 8, vocabulary 256), fp32, on the CPU",
        model={"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 128, "vocab_size": 256, "batch_size": 8},
        steps=30,
        warmup=5,
        backend="inductor",
        accelerator="cpu",
        precision="32-true",
        threads=1,
    ),
    "cuda": Mode(
        name="cuda",
        description="GPT-2 small (124M: 12 layers, n_embd 768, 12 heads, vocabulary 50257), sequence 1024, batch 16,"
        " bf16-mixed, on one GPU",
        model={"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024, "vocab_size": 50257, "batch_size": 16},
        steps=50,
        warmup=10,
        backend="inductor",
        accelerator="cuda",
        precision="bf16-mixed",
        matmul_precision="high",
    ),
    "smoke": Mode(
        name="smoke",
        description="a tiny GPT (2 layers, n_embd 32, sequence 32, batch 4), backend aot_eager: a smoke check, not a"
        " performance number",
        model={"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32, "vocab_size": 64, "batch_size": 4},
        steps=4,
        warmup=1,
        backend="aot_eager",
        accelerator="cpu",
        precision="32-true",
        threads=1,
        paths=("eager", "stock", "whole", "regional", "cache_warm", "plain_loop"),
        strategies=("auto",),
    ),
}


@dataclass
class Run:
    """One row to measure: a spec, where its table puts it, and how its process is set up."""

    strategy: str
    spec: RunSpec
    fresh_inductor_cache: bool = True
    #: For the cache paths: the ``cache`` directory both processes share.
    cache_dir: Optional[Path] = None


def use_compile_for(path: str, backend: str, cache_dir: Optional[Path]) -> Any:
    """The ``Trainer(use_compile=...)`` value of a path. With inductor, exactly what a user writes."""
    backend_kw = {} if backend == "inductor" else {"backend": backend}
    if path in ("eager",):
        return None
    if path in ("stock", "stock_logging"):
        return False
    if path == "whole":
        return backend_kw or True
    if path == "regional":
        return {"regions": "auto", **backend_kw}
    if path in ("cache_cold", "cache_warm"):
        return {"cache": str(cache_dir), **backend_kw}
    raise ValueError(f"no use_compile for path {path!r}")


def plan(mode: Mode, paths: Sequence[str], strategies: Sequence[str], steps: int, workdir: Path) -> list[Run]:
    """Every process to run, in order."""
    base = {
        "model": mode.model,
        "steps": steps,
        "warmup": min(mode.warmup, max(steps - 1, 0)),
        "accelerator": mode.accelerator,
        "precision": mode.precision,
        "compile_backend": mode.backend,
        "matmul_precision": mode.matmul_precision,
        "threads": mode.threads,
    }
    runs: list[Run] = []
    for strategy in strategies:
        for path in paths:
            if path == "plain_loop":
                continue
            names = ["cache_cold", "cache_warm"] if path == "cache_warm" else [path]
            cache_dir = workdir / strategy / "compile-cache" if path == "cache_warm" else None
            for name in names:
                spec = RunSpec(
                    name=name,
                    strategy=strategy,
                    use_compile=use_compile_for(name, mode.backend, cache_dir),
                    compile_input=name in ("stock", "stock_logging"),
                    log_in_step=name != "stock",
                    **base,
                )
                runs.append(Run(strategy, spec, fresh_inductor_cache=cache_dir is None, cache_dir=cache_dir))
    if "plain_loop" in paths:
        spec = RunSpec(name="plain_loop", kind="plain_loop", strategy=None, **base)
        runs.append(Run(PLAIN_LOOP_STRATEGY, spec))
    return runs


def describe_run(run: Run) -> str:
    """One line of the plan."""
    spec = run.spec
    if spec.kind == "plain_loop":
        what = (
            f"plain PyTorch loop: torch.compile(model) and torch.compile(loss) (backend {spec.compile_backend!r}),"
            f" AdamW(lr={spec.lr}), precision {spec.precision}"
        )
    else:
        model = f"torch.compile(model, backend={spec.compile_backend!r})" if spec.compile_input else "model"
        module = "GPTModule" if spec.log_in_step else "LogOutsideStepGPT"
        what = (
            f"Trainer(accelerator={spec.accelerator!r}, devices={spec.devices}, strategy={spec.strategy!r},"
            f" precision={spec.precision!r}, use_compile={spec.use_compile!r}).fit({model}) [{module}]"
        )
    cache = "fresh empty TORCHINDUCTOR_CACHE_DIR" if run.fresh_inductor_cache else "no TORCHINDUCTOR_CACHE_DIR"
    return f"{run.strategy:>5} {spec.name:<14} {what}; {spec.steps} steps; fresh process, {cache}"


def run_all(runs: list[Run], workdir: Path, report: Any) -> list[dict[str, Any]]:
    """Runs each process in turn; after each one, ``report`` rewrites the result files (so partial runs survive)."""
    results: list[dict[str, Any]] = []
    for i, run in enumerate(runs):
        print(f"[{i + 1}/{len(runs)}] {describe_run(run)}", flush=True)
        if run.spec.name == "cache_cold" and run.cache_dir and run.cache_dir.exists() and any(run.cache_dir.iterdir()):
            raise RuntimeError(f"the compile cache {run.cache_dir} must start empty for a cold run: use a new workdir")
        started = time.perf_counter()
        result = run_fresh(
            run.spec, workdir / run.strategy / run.spec.name, fresh_inductor_cache=run.fresh_inductor_cache
        )
        result["strategy"] = run.strategy
        if run.cache_dir is not None:
            files = [p for p in run.cache_dir.rglob("*") if p.is_file()]
            result["cache_dir_files"] = len(files)
            result["cache_dir_mb"] = sum(p.stat().st_size for p in files) / 1e6
        results.append(result)
        if result["status"] == "ok":
            print(
                f"    first step {result['first_step_s']:.2f} s, steady {fmt(result['steady_step_ms'])} ms,"
                f" {result['graphs']} graphs, {result['recompiles']} recompiles, breaks"
                f" {result['graph_breaks_other']} other + {result['graph_breaks_intentional']} expected"
                f" ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
        else:
            print(f"    FAILED: {result['error'].splitlines()[0][:300]}", flush=True)
        report(results, complete=False)
    return results


def _by_name(results: list[dict[str, Any]], strategy: str) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in results if r["strategy"] == strategy and r["status"] == "ok"}


def ratios(results: list[dict[str, Any]]) -> None:
    """Adds, to each result: steady step vs ``stock`` and vs ``plain_loop``, first step vs ``whole``."""
    plain = _by_name(results, PLAIN_LOOP_STRATEGY).get("plain_loop")
    for r in results:
        if r["status"] != "ok":
            continue
        same = _by_name(results, r["strategy"]) if r["strategy"] != PLAIN_LOOP_STRATEGY else {}
        stock, whole = same.get("stock"), same.get("whole")
        r["steady_vs_stock"] = ratio(r["steady_step_ms"], stock and stock["steady_step_ms"])
        r["steady_vs_plain_loop"] = ratio(r["steady_step_ms"], plain and plain["steady_step_ms"])
        r["first_step_vs_whole"] = ratio(r["first_step_s"], whole and whole["first_step_s"])


HEADERS = (
    "path",
    "first step",
    "steady step",
    "tokens/s",
    "peak mem",
    "graphs",
    "recompiles",
    "breaks (other)",
    "breaks (expected)",
    "steady vs stock",
    "steady vs plain loop",
    "first step vs whole",
    "final loss",
)


def _row(r: dict[str, Any]) -> list[str]:
    if r["status"] != "ok":
        reason = r["error"].splitlines()[0].replace("|", "\\|")[:160]
        return [f"`{r['name']}`", f"failed: {reason}", *[""] * (len(HEADERS) - 2)]
    summary = r.get("compile_summary") or {}
    name = f"`{r['name']}`" + (" (no strategy)" if r["strategy"] == PLAIN_LOOP_STRATEGY else "")
    other = str(r["graph_breaks_other"])
    if summary and summary.get("graph_breaks") is not None:
        expected = summary.get("expected_breaks", summary.get("intentional_breaks", 0))  # older JSON: intentional
        other += f" ({summary['graph_breaks'] - expected})"
    return [
        name,
        fmt(r["first_step_s"], ".2f", " s"),
        fmt(r["steady_step_ms"], ".1f", " ms"),
        fmt(r["tokens_per_s"], ",.0f"),
        fmt(r["peak_memory_mib"], ",.0f", " MiB"),
        str(r["graphs"]),
        str(r["recompiles"]),
        other,
        str(r["graph_breaks_intentional"]),
        fmt(r.get("steady_vs_stock"), ".2f", "x"),
        fmt(r.get("steady_vs_plain_loop"), ".2f", "x"),
        fmt(r.get("first_step_vs_whole"), ".2f", "x"),
        fmt(r.get("final_loss"), ".4f"),
    ]


def markdown(data: dict[str, Any]) -> str:
    """The report: one table per strategy, the plain loop in each."""
    results = data["results"]
    mode = data["mode"]
    strategies = [s for s in data["strategies"] if any(r["strategy"] == s for r in results)]
    plain = [r for r in results if r["strategy"] == PLAIN_LOOP_STRATEGY]
    parts = [
        report_header(f"`bench.py`: compile paths, {mode} mode", data),
        f"Model: {data['description']}. {data['steps']} training steps per path; steady step = median of the steps"
        f" after the first {data['warmup']}. Backend: `{data['backend']}`. Torch threads per process:"
        f" {data.get('threads') or 'torch default'}. Peak memory: "
        + ("`torch.cuda.max_memory_allocated`." if mode == "cuda" else "peak RSS of the process (`ru_maxrss`).")
        + ("" if data.get("complete") else "\n\n**Incomplete: the run was interrupted; these are the paths so far.**"),
    ]
    if data.get("notes"):
        parts.append("Notes:\n\n" + "\n".join(f"* {note}" for note in data["notes"]))
    names = {"auto": 'Single device (`strategy="auto"`, devices=1)', "ddp": 'DDP, world size 1 (`strategy="ddp"`)'}
    for strategy in strategies:
        rows = [_row(r) for r in results if r["strategy"] == strategy] + [_row(r) for r in plain]
        parts.append(f"## {names.get(strategy, strategy)}\n\n" + markdown_table(HEADERS, rows))
    if not strategies and plain:
        parts.append("## Plain loop\n\n" + markdown_table(HEADERS, [_row(r) for r in plain]))
    parts.append(
        "Columns: *first step* is the whole first optimizer step, compile included (cold: empty inductor cache;"
        " `cache_warm` reads what `cache_cold` wrote). *breaks (other)* are graph breaks that are not expected ones"
        " (in DDP's own code, such as its inner call `_inside_ddp_forward`, or at our region boundaries), from"
        " `torch._dynamo.utils.counters`; in brackets, the same count from `trainer._compile_connector.last_summary`."
        " *recompiles*: compilation records with `cache_size > 0`. Ratios below 1 are faster. `stock` logs after the"
        " step (stock Lightning cannot compile a step that calls `self.log` on torch 2.13, see `stock_logging`)."
    )
    if data.get("png"):
        parts.append(f"![{mode} chart]({data['png']})")
    return "\n\n".join(parts)


def chart(data: dict[str, Any], path: Path) -> Optional[str]:
    """A bar chart of the steady and the first step per path and strategy; ``None`` without matplotlib."""
    plt = pyplot()
    if plt is None:
        return None
    ok = [r for r in data["results"] if r["status"] == "ok"]
    names = list(dict.fromkeys(r["name"] for r in ok))
    groups = list(dict.fromkeys(r["strategy"] for r in ok))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    colors = {group: f"C{i}" for i, group in enumerate(groups)}
    width = 0.8 / max(len(groups), 1)
    for axis, key, label in (
        (axes[0], "steady_step_ms", "steady step (ms, lower is better)"),
        (axes[1], "first_step_s", "first step, cold (s, lower is better)"),
    ):
        values = {(r["strategy"], r["name"]): r[key] for r in ok}
        for i, name in enumerate(names):
            present = [g for g in groups if (g, name) in values]
            for k, group in enumerate(present):  # the bars of one path, centred on its tick
                x = i + (k - (len(present) - 1) / 2) * width
                axis.bar(x, values[(group, name)], width, color=colors[group], label=group)
        axis.set_xticks(range(len(names)))
        axis.set_xticklabels(names, rotation=30, ha="right")
        axis.set_title(label)
    fig.suptitle(
        f"demo GPT, {data['mode']} mode ({data['machine'].get('gpu') or data['machine']['cpu']})", x=0.02, ha="left"
    )
    handles, labels = axes[0].get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    fig.legend(unique.values(), unique.keys(), title="strategy", loc="upper right", ncol=len(unique))
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--smoke", action="store_true", help="tiny, aot_eager, 4 steps: a smoke check (CI)")
    parser.add_argument("--paths", help=f"comma-separated subset of {','.join(PATHS)}")
    parser.add_argument("--strategies", help=f"comma-separated subset of {','.join(STRATEGIES)}")
    parser.add_argument("--steps", type=int, help="training steps per path")
    parser.add_argument("--layers", type=int, help="n_layer of the GPT")
    parser.add_argument("--threads", type=int, help="torch threads per process (0: torch's default)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where to write MODE.json/.md/.png")
    parser.add_argument("--workdir", type=Path, help="keep each process's log, spec and caches here")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and run nothing")
    parser.add_argument("--note", action="append", default=[], help="a line for the report's notes (repeatable)")
    parser.add_argument(
        "--render", type=Path, help="rewrite the .md (and .png) of an existing MODE.json (with --note: add notes)"
    )
    args = parser.parse_args(argv)
    mode = MODES["smoke" if args.smoke else args.mode]
    args.paths = _subset(args.paths, PATHS, mode.paths, "--paths")
    args.strategies = _subset(args.strategies, STRATEGIES, mode.strategies, "--strategies")
    if args.layers is not None:
        mode = Mode(**{**vars(mode), "model": {**mode.model, "n_layer": args.layers}})
    if args.threads is not None:
        mode = Mode(**{**vars(mode), "threads": args.threads or None})
    args.mode_spec = mode
    args.steps = args.steps or mode.steps
    if args.steps < 2:
        parser.error("--steps must be at least 2 (a first step and a steady one)")
    return args


def _subset(text: Optional[str], valid: Sequence[str], default: Sequence[str], option: str) -> tuple[str, ...]:
    if text is None:
        return tuple(default)
    chosen = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [c for c in chosen if c not in valid]
    if unknown or not chosen:
        raise SystemExit(f"{option}: unknown {unknown}; choose from {', '.join(valid)}")
    return chosen


def render(path: Path, notes: Sequence[str]) -> None:
    """Rewrites the report and chart of a finished run from its JSON, e.g. one copied back from another machine."""
    import json

    data = json.loads(path.read_text())
    data["notes"] = [*data.get("notes", []), *notes]
    ratios(data["results"])
    data["png"] = chart(data, path.with_suffix(".png"))
    write_report(path.parent, data["stem"], data, markdown(data))
    print(f"rewrote {path.with_suffix('.md')}")
    if path.parent.resolve() == RESULTS_DIR.resolve():
        print(f"updated {update_index()}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.render:
        render(args.render, args.note)
        return 0
    mode: Mode = args.mode_spec
    stem = mode.name
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lcp-bench-") as tmp:
        workdir = args.workdir or Path(tmp)
        runs = plan(mode, args.paths, args.strategies, args.steps, workdir)
        print(f"{mode.name} mode: {mode.description}; {args.steps} steps per path, {len(runs)} fresh processes")
        if args.dry_run:
            for run in runs:
                print("  " + describe_run(run))
            print(f"results would go to {args.out}/{stem}.json, .md, .png")
            return 0
        data: dict[str, Any] = {
            "benchmark": "bench",
            "stem": stem,
            "mode": mode.name,
            "description": mode.description,
            "model": mode.model,
            "steps": args.steps,
            "warmup": min(mode.warmup, args.steps - 1),
            "backend": mode.backend,
            "precision": mode.precision,
            "threads": mode.threads,
            "strategies": list(args.strategies),
            "paths": list(args.paths),
            "command": command_line(argv),
            "machine": machine_info(),
            "date": now(),
            "notes": list(args.note),
        }

        def report(results: list[dict[str, Any]], complete: bool) -> None:
            ratios(results)
            data.update(results=results, complete=complete, total_s=time.perf_counter() - started)
            if complete:
                data["png"] = chart(data, args.out / f"{stem}.png") if results else None
            write_report(args.out, stem, data, markdown(data))

        results = run_all(runs, workdir, report)
        report(results, complete=True)
    print()
    print((args.out / f"{stem}.md").read_text())
    if args.out.resolve() == RESULTS_DIR.resolve():
        print(f"updated {update_index()}")
    failed = [f"{r['strategy']}/{r['name']}" for r in results if r["status"] != "ok" and r["name"] in REQUIRED_PATHS]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"bench finished in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
