"""The table of docs/benchmarks/optimize_ddp.md: DDPOptimizer (``optimize_ddp=True``) against one graph (``False``).

    python benchmarks/optimize_ddp.py
    python benchmarks/optimize_ddp.py --steps 4 --layers 1 --width 64 --repeats 1 --world-sizes 1 --out /tmp/x  # quick

With ``optimize_ddp=True``, Dynamo splits the compiled graph at DDP's bucket boundaries, so that each bucket's
all-reduce can start while the backward of earlier layers still runs. Eager, ``True`` and ``False`` train a GPT whose
gradients are several MB under ``strategy="ddp"`` on CPU (gloo), with 2 ranks and with 1, one torch thread per rank,
each configuration in fresh processes, interleaved. Then a paper model: with ``B`` buckets, an all-reduce of the whole
gradient taking ``A`` (measured: gloo, 2 processes) and a backward taking ``T``, bucketing can hide at most
``min(A, T) - A/B`` (the last bucket's all-reduce overlaps nothing). A model, not a GPU measurement.
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
    run_fresh,
    run_interleaved,
    spread,
    write_report,
)

CONFIGS: dict[str, Any] = {"eager": None, "optimize_ddp=True": {"optimize_ddp": True}}
CONFIGS["optimize_ddp=False"] = {"optimize_ddp": False}


def _get(results: dict[str, Any], key: str, field: str) -> Optional[float]:
    result = results.get(key) or {}
    return result.get(field) if result.get("status") == "ok" else None


def _buckets(results: dict[str, Any], key: str) -> list[int]:
    """The sizes of DDP's reducer buckets on rank 0 at the end of the run (after its rebuild)."""
    return ((results.get(key) or {}).get("ddp_reducer_buckets") or {}).get("bucket_bytes") or []


def paper_model(results: dict[str, Any]) -> dict[str, Any]:
    """``min(A, T) - A/B`` from the measured all-reduce time, backward time and bucket count."""
    a_ms = _get(results, "allreduce", "allreduce_ms")
    buckets = len(_buckets(results, "optimize_ddp=False@2") or _buckets(results, "eager@2")) or None
    model: dict[str, Any] = {"A_ms": a_ms, "B": buckets}
    for label, key in (("compiled", "optimize_ddp=False@1"), ("eager", "eager@1")):
        model[f"T_{label}_ms"] = t_ms = _get(results, key, "steady_backward_ms")
        if a_ms is not None and t_ms is not None and buckets:
            model[f"hideable_{label}_ms"] = max(min(a_ms, t_ms) - a_ms / buckets, 0.0)
    step_true, step_false = (_get(results, f"optimize_ddp={v}@2", "steady_step_ms") for v in (True, False))
    if step_true is not None and step_false is not None:
        model["measured_saving_ms"] = step_false - step_true
    return model


def _outside_backward(results: dict[str, Any], key: str) -> Optional[float]:
    """Steady step minus backward: forward, loss and optimizer, where DDP communicates nothing."""
    step, backward = _get(results, key, "steady_step_ms"), _get(results, key, "steady_backward_ms")
    return None if step is None or backward is None else step - backward


def _row(results: dict[str, Any], ranks: int, name: str) -> list[Any]:
    r = results[f"{name}@{ranks}"]
    if r["status"] != "ok":
        return [ranks, f"`{name}`", f"failed: {r['error'].splitlines()[0][:120]}", *[""] * 9]
    sizes, base = _buckets(results, f"{name}@{ranks}"), ("optimize_ddp=False", "eager")
    return [
        ranks,
        f"`{name}`",
        spread(r, "steady_step_ms", ".1f", " ms"),
        *(fmt(ratio(r["steady_step_ms"], _get(results, f"{b}@{ranks}", "steady_step_ms")), ".3f", "x") for b in base),
        spread(r, "steady_backward_ms", ".1f", " ms"),
        fmt(r["first_step_s"], ".1f", " s"),
        r["graphs"],
        ", ".join(map(str, r.get("ddp_optimizer_buckets") or [])) or "—",
        f"{len(sizes)}: {', '.join(f'{b / 1e6:.1f}' for b in sizes)}" if sizes else "—",
        r["graph_breaks_other"],
        fmt(r.get("final_loss"), ".4f"),
    ]


def markdown(data: dict[str, Any]) -> str:
    results, model, allreduce = data["results"], data.get("paper_model", {}), data["results"].get("allreduce", {})
    headers = ("ranks", "configuration", "steady step", "vs optimize_ddp=False", "vs eager", "backward (median)")
    headers += ("first step", "graphs", "DDPOptimizer buckets", "DDP buckets (MB)", "other breaks", "final loss")
    rows = [_row(results, w, name) for w in data["world_sizes"] for name in CONFIGS if f"{name}@{w}" in results]
    params = next((r["parameters"] for r in results.values() if r.get("parameters")), None)
    outside = [fmt(_outside_backward(results, f"optimize_ddp=False@{w}"), ".1f", " ms") for w in (2, 1)]
    ms = {key: fmt(model.get(key), ".1f", " ms") for key in model}
    a_text = f"{ms.get('A_ms', '—')} ({fmt(allreduce.get('megabytes'), '.1f')} MB; min"
    quantities = [
        (
            "`A`: all-reduce of the full gradient, gloo, 2 ranks",
            f"{a_text} {fmt(allreduce.get('allreduce_min_ms'), '.1f', ' ms')})",
        ),
        ("`B`: DDP buckets", model.get("B") or "—"),
        *((f"`T`: backward, {t} (1 rank)", ms.get(f"T_{t}_ms", "—")) for t in ("compiled", "eager")),
        *((f"hideable `min(A, T) - A/B`, {t} `T`", ms.get(f"hideable_{t}_ms", "—")) for t in ("compiled", "eager")),
        ("measured: steady step `False` minus `True`, 2 ranks", ms.get("measured_saving_ms", "—")),
    ]
    sizes = f"{fmt(params and params / 1e6, '.2f')}M parameters, {fmt(params and params * 4e-6, '.1f')} MB of gradients"
    parts = [
        report_header("`optimize_ddp`: DDPOptimizer bucket splitting on CPU (gloo)", data),
        f'The demo GPT ({", ".join(f"{k} {v}" for k, v in data["model"].items())}; {sizes}), `strategy="ddp"` on CPU,'
        f" DDP `bucket_cap_mb={data['bucket_cap_mb']}` (DDP's default of 25 MB would leave DDPOptimizer nothing to"
        f" split), inductor, {data['steps']} steps per rank, steady step = median after the first {data['warmup']}, 1"
        f" torch thread per rank. Each configuration {data['repeats']} time(s) in a fresh process with an empty"
        " inductor cache, interleaved: the median over them, their range in brackets. *DDPOptimizer buckets*: the"
        " pieces Dynamo split each graph into. *DDP buckets*: the reducer's, on rank 0 after its rebuild.",
        markdown_table(headers, rows),
        "Both ranks share the machine's cores, so 2 ranks slow the whole step, not only the communication: the part"
        f" outside the backward took {outside[0]} with 2 ranks against {outside[1]} with 1 (`optimize_ddp=False`).",
        "## Paper model (not a GPU measurement)",
        "With `B` buckets, an all-reduce of the whole gradient taking `A` and a backward taking `T`, bucketing can hide"
        " at most `min(A, T) - A/B` behind the backward (the last bucket's all-reduce starts when the backward ends)."
        " Measured here: `A` on gloo with 2 processes; `T` in the 1-rank runs (no communication); `B` on rank 0 after"
        " DDP's rebuild. On shared CPU cores the all-reduce and the backward compete, so real overlap is at most this.",
        markdown_table(("quantity", "value"), quantities),
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
    model = {"n_layer": args.layers, "n_head": 4, "n_embd": args.width, "block_size": 32, "vocab_size": 256}
    model["batch_size"] = 4
    world_sizes = [int(w) for w in args.world_sizes.split(",")]
    data = new_report("optimize_ddp", argv, model=model, world_sizes=world_sizes, results={}, runs=[])
    data.update(steps=args.steps, warmup=args.warmup, bucket_cap_mb=args.bucket_cap_mb, repeats=args.repeats)

    def spec_for(name: str, world_size: int) -> RunSpec:
        spec = RunSpec(name, model=model, steps=args.steps, warmup=args.warmup, devices=world_size)
        spec.strategy, spec.use_compile, spec.threads, spec.bucket_cap_mb = "ddp", CONFIGS[name], 1, args.bucket_cap_mb
        return spec

    with tempfile.TemporaryDirectory(prefix="lcp-optimize-ddp-") as tmp:
        run_interleaved(data, list(CONFIGS), world_sizes, args.repeats, spec_for, Path(tmp), args.out, markdown)
        params = next((r["parameters"] for r in data["results"].values() if r.get("parameters")), None)
        if params:
            spec = RunSpec("allreduce", "allreduce", numel=params, threads=1, repeats=30)
            data["results"]["allreduce"] = run_fresh(spec, Path(tmp) / "allreduce")
    data["paper_model"] = paper_model(data["results"])
    write_report(args.out, data, markdown(data))
    print(markdown(data))
    checked = [*data["runs"], data["results"].get("allreduce", {"status": "missing"})]
    return 0 if all(r["status"] == "ok" for r in checked) else 1


if __name__ == "__main__":
    sys.exit(main())
