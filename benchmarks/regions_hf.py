"""The table of docs/benchmarks/regions_hf.md: regions on a deep ``transformers`` Llama, against whole-model compile.

    python benchmarks/regions_hf.py --layers 32
    python benchmarks/regions_hf.py --layers 4 --steps 3 --out /tmp/x   # quick

A tiny-width Llama (random init, nothing downloaded) trained by ``Trainer.fit`` on one CPU device, inductor, each
configuration in a fresh process with an empty inductor cache. As users call it, the model builds a ``DynamicCache``
in training and each decoder layer reads its own ``layer_idx``, so the blocks cannot share one compiled graph:
``regions`` compiles each on its own, and the compiled code of identical graphs comes from inductor's caches.
Needs ``transformers`` (``pip install -e .[real-models]``).
"""

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from harness import RESULTS_DIR, RunSpec, fmt, markdown_table, new_report, ratio, report_header, run_fresh, write_report

MODEL = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4}
MODEL |= {"num_key_value_heads": 2, "max_position_embeddings": 64}
PATHS = {
    "whole": ({}, True),
    "regional": ({}, {"regions": "auto"}),
    "whole, use_cache=False": ({"use_cache": False}, True),
    "regional, use_cache=False": ({"use_cache": False}, {"regions": "auto"}),
}


def markdown(data: dict[str, Any]) -> str:
    headers = ("configuration", "first step", "first step / whole's", "steady step", "steady / whole's")
    headers += ("graphs", "recompiles", "recompile-limit hits", "compiled / eager steps")
    results = data["results"]
    rows = []
    for name in PATHS:
        r = results.get(name, {})
        whole = results.get("whole, use_cache=False" if "use_cache" in name else "whole", {})
        summary = r.get("compile_summary") or {}
        steps = summary.get("compiled_steps", {}).get("training"), summary.get("eager_steps", {}).get("training", 0)
        rows.append(
            [
                name,
                fmt(r.get("first_step_s"), ".1f", " s") if r.get("status") == "ok" else r.get("error", "")[:80],
                fmt(ratio(r.get("first_step_s"), whole.get("first_step_s")), ".2f", "x"),
                fmt(r.get("steady_step_ms"), ".1f", " ms"),
                fmt(ratio(r.get("steady_step_ms"), whole.get("steady_step_ms")), ".2f", "x"),
                summary.get("graphs"),
                summary.get("recompiles"),
                len(summary.get("recompile_limit_hits", [])),
                f"{steps[0]} / {steps[1]}",
            ]
        )
    return "\n\n".join(
        [
            report_header(f"Regions on a {data['layers']}-layer transformers Llama", data),
            f"`LlamaForCausalLM` ({', '.join(f'{k} {v}' for k, v in MODEL.items())}, {data['layers']} layers), fp32,"
            f" batches of 8 x 64 tokens, one {data['accelerator']} device, inductor, {data['steps']} steps, steady"
            f" step = median after the first {data['warmup']}. Whole: `use_compile=True`; regional:"
            ' `use_compile={"regions": "auto"}`.'
            " Each run in a fresh process with an empty inductor cache. The ratios compare with the whole-model run"
            " called the same way.",
            markdown_table(headers, rows),
        ]
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--accelerator", default="cpu", help="cpu, or cuda on a GPU machine")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    data = new_report("regions_hf", argv, model=MODEL, layers=args.layers, accelerator=args.accelerator, results={})
    data.update(steps=args.steps, warmup=args.warmup)
    with tempfile.TemporaryDirectory(prefix="lcp-regions-hf-") as tmp:
        for index, (name, (call, use_compile)) in enumerate(PATHS.items()):
            model = {**MODEL, "num_hidden_layers": args.layers, **call}
            spec = RunSpec(name, kind="hf_llama", model=model, steps=args.steps, warmup=args.warmup)
            spec.use_compile, spec.accelerator = use_compile, args.accelerator
            print(f"{name}: {args.steps} steps in a fresh process", flush=True)
            result = data["results"][name] = run_fresh(spec, Path(tmp) / str(index))
            print(f"    {result.get('first_step_s') or result.get('error', '')[:300]}", flush=True)
            write_report(args.out, data, markdown(data))
    print(markdown(data))
    return 0 if all(r["status"] == "ok" for r in data["results"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
