"""Regional compilation designs in a plain training loop on CPU: loss and per-block gradients against eager.

    python docs/repros/regions_alternatives.py --layers 4 --steps 8

Each variant runs in a fresh process with an empty inductor cache (so its first step is a cold compile):

* ``eager``, and ``whole``: ``torch.compile`` of the step;
* ``opaque_regions``: the package's own region code (``lightning_compile_patch.compile_features.regions``) compiles the
  blocks, the step compiled around them: ``use_compile={"regions": ...}`` without the modules around the blocks;
* ``nested_class``: ``torch.compiler.nested_compile_region`` on the block class's ``forward``, the step compiled;
* ``nested_instance``: the same, bound to each block instance.

The loss after the last step is deterministic: a variant whose loss differs from eager's changes the numerics; the
gradient norm of each block after the first backward shows where (a block with a wrong gradient, or none at all).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

VARIANTS = ("eager", "whole", "opaque_regions", "nested_class", "nested_instance")


def run_variant(variant: str, layers: int, steps: int) -> dict:
    """Trains in this process; returns the loss, the first gradient norms and the step times."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))  # the demo's GPT
    from gpt import GPT, GPTConfig, NextTokenData

    from lightning_compile_patch.compile_features.regions import _compile_regions, _find_regions

    torch.manual_seed(0)
    config = GPTConfig(n_layer=layers, n_embd=128, block_size=64, vocab_size=512, batch_size=8)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = (torch.stack(t) for t in zip(*(NextTokenData(config)[i] for i in range(config.batch_size)), strict=True))

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = model(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))

    if variant == "opaque_regions":
        _compile_regions(_find_regions(model, "auto"), {}, shared=True)
    elif variant == "nested_class":
        cls = type(model.blocks[0])
        cls.forward = torch.compiler.nested_compile_region(cls.forward)
    elif variant == "nested_instance":
        marked = torch.compiler.nested_compile_region(type(model.blocks[0]).forward)
        for block in model.blocks:
            block.forward = types.MethodType(marked, block)
    if variant != "eager":
        step = torch.compile(step)
    times, first_grads = [], []
    for _ in range(steps):
        start = time.perf_counter()
        loss = step(x, y)
        loss.backward()
        if not first_grads:  # the gradient norm of each block's first linear layer, after the first backward
            first_grads = [None if b.fc.weight.grad is None else b.fc.weight.grad.norm().item() for b in model.blocks]
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    steady_ms = 1000 * statistics.median(times[2:] or times[-1:])
    return {
        "variant": variant,
        "loss": loss.item(),
        "first_grads": first_grads,
        "first_step_s": times[0],
        "steady_step_ms": steady_ms,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # the fresh process of one variant
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.layers, args.steps)))
        sys.exit(0)
    print(
        f"| variant ({args.layers} blocks, {args.steps} steps) | loss | `fc.weight` gradient norm per block, step 1 |"
        " first step | steady step |\n|---|---|---|---|---|"
    )
    for variant in VARIANTS:
        with tempfile.TemporaryDirectory() as cache:
            sizes = ["--layers", str(args.layers), "--steps", str(args.steps)]
            command = [sys.executable, __file__, "--variant", variant, *sizes]
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
        row = json.loads(out.splitlines()[-1])
        grads = ", ".join("none" if g is None else f"{g:.4g}" for g in row["first_grads"])
        times = f"{row['first_step_s']:.1f} s | {row['steady_step_ms']:.1f} ms"
        print(f"| {variant} | {row['loss']:.4f} | {grads} | {times} |", flush=True)
