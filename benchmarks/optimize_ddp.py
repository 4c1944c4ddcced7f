"""DDPOptimizer (``use_compile={"optimize_ddp": True}``) against one graph (``False``), with 2 ranks and with 1, on CPU.

    python benchmarks/optimize_ddp.py
    python benchmarks/optimize_ddp.py --steps 6 --layers 2 --out /tmp/x   # quick

With ``optimize_ddp=True``, Dynamo splits the compiled graph at DDP's bucket boundaries, so that each bucket's gradient
all-reduce can start while the backward of the earlier layers still runs; with ``False``, the backward is one compiled
graph and every all-reduce waits for its end. Each configuration (eager for reference, ``True``, ``False``) trains a
GPT wide enough that its gradients are several MB, under ``strategy="ddp"`` on ``accelerator="cpu"`` (gloo), with
``devices=2`` and then ``devices=1``, each in a fresh process with a fresh inductor cache and one torch thread per rank
(two ranks on two cores).

Then a paper model: with ``B`` buckets, an all-reduce of the whole gradient taking ``A`` (measured here: gloo, 2
processes) and a backward taking ``T``, bucketing can hide at most ``min(A, T) - A/B`` of the communication (the last
bucket's all-reduce cannot overlap anything). It is a model, not a GPU measurement.

Writes ``optimize_ddp.json`` and ``optimize_ddp.md`` into ``--out`` (default ``docs/benchmarks/``).

"""

import argparse
import statistics
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

CONFIGS: dict[str, Any] = {
    "eager": None,
    "optimize_ddp=True": {"optimize_ddp": True},
    "optimize_ddp=False": {"optimize_ddp": False},
}


def _ok(result: Optional[dict[str, Any]], key: str) -> Optional[float]:
    return result.get(key) if result and result.get("status") == "ok" else None


def _buckets(result: Optional[dict[str, Any]]) -> Optional[int]:
    """The number of DDP's reducer buckets on rank 0 at the end of the run (after its rebuild)."""
    sizes = ((result or {}).get("ddp_reducer_buckets") or {}).get("bucket_bytes")
    return len(sizes) if sizes else None


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One configuration over its repeats: the first good run's details, with the timings' medians across runs."""
    ok = [r for r in runs if r["status"] == "ok"]
    if not ok:
        return runs[-1]
    combined = dict(ok[0])
    for key in ("steady_step_ms", "steady_backward_ms", "first_step_s"):
        values = [r[key] for r in ok if r.get(key) is not None]
        combined[key] = statistics.median(values) if values else None
        combined[f"{key}_runs"] = values
    combined["repeats_ok"] = len(ok)
    combined["repeats"] = len(runs)
    return combined


def _spread(result: dict[str, Any], key: str, spec: str, unit: str) -> str:
    """The median, and the range over repeats when there are several."""
    values = result.get(f"{key}_runs") or []
    text = fmt(result.get(key), spec, unit)
    if len(values) > 1:
        text += f" ({fmt(min(values), spec)} to {fmt(max(values), spec)})"
    return text


def _bucket_text(result: dict[str, Any]) -> str:
    sizes = (result.get("ddp_reducer_buckets") or {}).get("bucket_bytes")
    return f"{len(sizes)}: {', '.join(f'{b / 1e6:.1f}' for b in sizes)}" if sizes else "—"


def _outside_backward(results: dict[str, Any], key: str) -> Optional[float]:
    """Steady step minus backward: forward, loss and optimizer, where DDP communicates nothing."""
    step, backward = _ok(results.get(key), "steady_step_ms"), _ok(results.get(key), "steady_backward_ms")
    return step - backward if step is not None and backward is not None else None


def paper_model(data: dict[str, Any]) -> dict[str, Any]:
    """``min(A, T) - A/B`` from the measured all-reduce time, backward time and bucket count."""
    results = data["results"]
    allreduce = results.get("allreduce", {})
    a_ms = _ok(allreduce, "allreduce_ms")
    buckets = _buckets(results.get("optimize_ddp=False@2")) or _buckets(results.get("eager@2"))
    model: dict[str, Any] = {"A_ms": a_ms, "B": buckets}
    for label, key in (("compiled", "optimize_ddp=False@1"), ("eager", "eager@1")):
        t_ms = _ok(results.get(key), "steady_backward_ms")
        model[f"T_{label}_ms"] = t_ms
        if a_ms is not None and t_ms is not None and buckets:
            model[f"hideable_{label}_ms"] = max(min(a_ms, t_ms) - a_ms / buckets, 0.0)
    step_true = _ok(results.get("optimize_ddp=True@2"), "steady_step_ms")
    step_false = _ok(results.get("optimize_ddp=False@2"), "steady_step_ms")
    if step_true is not None and step_false is not None:
        model["measured_saving_ms"] = step_false - step_true
    return model


def markdown(data: dict[str, Any]) -> str:
    results = data["results"]
    headers = (
        "ranks",
        "configuration",
        "steady step",
        "vs optimize_ddp=False",
        "vs eager",
        "backward (median)",
        "first step",
        "graphs",
        "DDPOptimizer buckets",
        "DDP buckets (MB)",
        "other breaks",
        "final loss",
    )
    rows = []
    for ranks in data["world_sizes"]:
        for name in CONFIGS:
            r = results.get(f"{name}@{ranks}")
            if r is None:
                continue
            if r["status"] != "ok":
                rows.append([ranks, f"`{name}`", f"failed: {r['error'].splitlines()[0][:120]}", *[""] * 9])
                continue
            step = r["steady_step_ms"]
            rows.append(
                [
                    ranks,
                    f"`{name}`",
                    _spread(r, "steady_step_ms", ".1f", " ms"),
                    fmt(ratio(step, _ok(results.get(f"optimize_ddp=False@{ranks}"), "steady_step_ms")), ".3f", "x"),
                    fmt(ratio(step, _ok(results.get(f"eager@{ranks}"), "steady_step_ms")), ".3f", "x"),
                    _spread(r, "steady_backward_ms", ".1f", " ms"),
                    fmt(r["first_step_s"], ".1f", " s"),
                    r["graphs"],
                    ", ".join(map(str, r.get("ddp_optimizer_buckets") or [])) or "—",
                    _bucket_text(r),
                    r["graph_breaks_other"],
                    fmt(r.get("final_loss"), ".4f"),
                ]
            )
    model = data.get("paper_model", {})
    allreduce = results.get("allreduce", {})
    params = next((r.get("parameters") for r in results.values() if r.get("parameters")), None)
    grad_mb = params * 4 / 1e6 if params else None
    spec = data["model"]
    parts = [
        report_header("`optimize_ddp`: DDPOptimizer bucket splitting on CPU (gloo)", data),
        f"The demo GPT ({', '.join(f'{k} {v}' for k, v in spec.items())}; {fmt(params and params / 1e6, '.2f')}M"
        f' parameters, {fmt(grad_mb, ".1f")} MB of fp32 gradients), `strategy="ddp"`, `accelerator="cpu"`, DDP'
        f" `bucket_cap_mb={data['bucket_cap_mb']}` (DDP's default of 25 MB would hold the whole gradient in one bucket"
        f" and leave DDPOptimizer nothing to split), backend inductor, {data['steps']} steps per rank, steady step ="
        f" median after the first {data['warmup']}, 1 torch thread per rank. Each configuration in a fresh process"
        f" with an empty inductor cache, {data['repeats']} time(s), the configurations interleaved; the table gives the"
        " median over those processes, with their range in brackets (first step: median). *DDPOptimizer buckets*:"
        " the pieces Dynamo split each compiled graph into (none: no split). *DDP buckets*: the reducer's buckets on"
        " rank 0 at the end of the run, after DDP rebuilt them in the order gradients arrived.",
        markdown_table(headers, rows),
        "Reading the 2-rank rows: both ranks share the machine's two cores (with whatever else runs there), so going"
        " from 1 to 2 ranks slows the whole step, not only the communication. The part of the step outside the"
        " backward, where DDP communicates nothing, took"
        f" {fmt(_outside_backward(results, 'optimize_ddp=False@2'), '.1f', ' ms')} with 2 ranks against"
        f" {fmt(_outside_backward(results, 'optimize_ddp=False@1'), '.1f', ' ms')} with 1 (`optimize_ddp=False`).",
        "## Paper model (not a GPU measurement)",
        "With `B` buckets, an all-reduce of the whole gradient taking `A` and a backward pass taking `T`, bucketing can"
        " hide at most `min(A, T) - A/B` of the communication behind the backward: the all-reduce of the last bucket"
        " starts when the backward ends, so it can never overlap. The inputs below are measured on this CPU: `A` is"
        " the median of `torch.distributed.all_reduce` of the full gradient size on gloo with 2 processes on this"
        " machine; `T` is the median backward time of one rank without communication (the 1-rank runs, one thread,"
        " as each of the two ranks has); `B` is DDP's bucket count on rank 0 after its rebuild. On two shared cores"
        " the all-reduce and the backward compete for the same cores, so real overlap here is at most what the model"
        " says, and usually less; on GPUs (NCCL on its own streams and links) the model is closer to what happens,"
        " but these numbers are not GPU numbers.",
        markdown_table(
            ("quantity", "value"),
            [
                (
                    "`A`: all-reduce of the full gradient, gloo, 2 ranks",
                    f"{fmt(model.get('A_ms'), '.1f', ' ms')} ({fmt(allreduce.get('megabytes'), '.1f')} MB; min"
                    f" {fmt(allreduce.get('allreduce_min_ms'), '.1f', ' ms')})",
                ),
                ("`B`: DDP buckets", model.get("B") or "—"),
                ("`T`: backward, compiled (1 rank)", fmt(model.get("T_compiled_ms"), ".1f", " ms")),
                ("`T`: backward, eager (1 rank)", fmt(model.get("T_eager_ms"), ".1f", " ms")),
                ("hideable `min(A, T) - A/B`, compiled `T`", fmt(model.get("hideable_compiled_ms"), ".1f", " ms")),
                ("hideable `min(A, T) - A/B`, eager `T`", fmt(model.get("hideable_eager_ms"), ".1f", " ms")),
                (
                    "measured: steady step `False` minus `True`, 2 ranks",
                    fmt(model.get("measured_saving_ms"), ".1f", " ms"),
                ),
            ],
        ),
    ]
    return "\n\n".join(parts)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="training steps per rank")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256, help="n_embd")
    parser.add_argument("--bucket-cap-mb", type=float, default=4.0, help="DDP's bucket_cap_mb")
    parser.add_argument("--world-sizes", default="2,1", help="comma-separated devices values")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per configuration")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    model = {
        "n_layer": args.layers,
        "n_head": 4,
        "n_embd": args.width,
        "block_size": 32,
        "vocab_size": 256,
        "batch_size": 4,
    }
    world_sizes = [int(w) for w in args.world_sizes.split(",")]
    data: dict[str, Any] = {
        "benchmark": "optimize_ddp",
        "stem": "optimize_ddp",
        "model": model,
        "steps": args.steps,
        "warmup": args.warmup,
        "bucket_cap_mb": args.bucket_cap_mb,
        "world_sizes": world_sizes,
        "repeats": args.repeats,
        "command": command_line(argv),
        "machine": machine_info(),
        "date": now(),
        "results": {},
        "runs": [],
    }
    started = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="lcp-optimize-ddp-") as tmp:
        for repeat in range(args.repeats):
            for world_size in world_sizes:
                names = list(CONFIGS)
                names = names[repeat % len(names) :] + names[: repeat % len(names)]  # interleave the order
                for name in names:
                    key = f"{name}@{world_size}"
                    spec = RunSpec(
                        name=key,
                        model=model,
                        steps=args.steps,
                        warmup=args.warmup,
                        devices=world_size,
                        strategy="ddp",
                        use_compile=CONFIGS[name],
                        threads=1,
                        bucket_cap_mb=args.bucket_cap_mb,
                    )
                    print(f"{key} (repeat {repeat + 1}/{args.repeats}): {args.steps} steps per rank", flush=True)
                    workdir = Path(tmp) / f"{key.replace('=', '-').replace('@', '-')}-{repeat}"
                    result = run_fresh(spec, workdir)
                    result["repeat"] = repeat
                    runs.setdefault(key, []).append(result)
                    data["runs"].append(result)
                    data["results"][key] = combine(runs[key])
                    if result["status"] == "ok":
                        print(
                            f"    steady {result['steady_step_ms']:.1f} ms, backward"
                            f" {result['steady_backward_ms']:.1f} ms, DDPOptimizer buckets"
                            f" {result.get('ddp_optimizer_buckets')}",
                            flush=True,
                        )
                    else:
                        print(f"    FAILED: {result['error'][:300]}", flush=True)
                    write_report(args.out, "optimize_ddp", data, markdown(data))
        params = next((r["parameters"] for r in data["results"].values() if r.get("parameters")), None)
        if params:
            print(f"allreduce of {params * 4 / 1e6:.1f} MB on gloo, 2 ranks", flush=True)
            spec = RunSpec(name="allreduce", kind="allreduce", numel=params, threads=1, repeats=30)
            data["results"]["allreduce"] = run_fresh(spec, Path(tmp) / "allreduce")
        data["paper_model"] = paper_model(data)
        data["total_s"] = time.perf_counter() - started
        write_report(args.out, "optimize_ddp", data, markdown(data))
    print()
    print(markdown(data))
    if args.out.resolve() == RESULTS_DIR.resolve():
        print(f"updated {update_index()}")
    checked = [*data["runs"], data["results"].get("allreduce", {"status": "missing"})]
    return 0 if all(r["status"] == "ok" for r in checked) else 1


if __name__ == "__main__":
    sys.exit(main())
