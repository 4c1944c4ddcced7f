"""Regional compilation designs, compared in a plain training loop: numerics, first step, steady step.

    python benchmarks/regions_alternatives.py --layers 4 --steps 8

Each variant runs in a fresh process with an empty inductor cache:

* ``eager``, ``whole`` (``torch.compile`` of the step);
* ``opaque_regions``: what ``use_compile={"regions": ...}`` does: each block's ``forward`` compiled in place and called
  through ``torch.compiler.disable``, the step compiled around them;
* ``nested_class``: ``torch.compiler.nested_compile_region`` on the block class's ``forward``, the step compiled;
* ``nested_instance``: the same, bound to each block instance.

The loss after the last step is deterministic: a variant whose loss differs from eager changes the numerics. The
gradient norms of each block after the first backward show where: a block whose gradient differs from eager's, or
that gets none at all.
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
    """Trains in this process and returns the measurements."""
    import torch
    import torch.nn.functional as F

    from lightning_compile_patch.demos.gpt import GPT, GPTConfig, NextTokenData

    torch.manual_seed(0)
    config = GPTConfig(n_layer=layers, n_embd=128, block_size=64, vocab_size=512, batch_size=8)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    samples = [NextTokenData(config)[i] for i in range(config.batch_size)]
    x, y = (torch.stack(t) for t in zip(*samples, strict=True))

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = model(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))

    if variant == "whole":
        step = torch.compile(step)
    elif variant == "opaque_regions":
        for block in model.blocks:
            compiled = torch.compile(block.forward, dynamic=False)
            block.forward = torch.compiler.disable(lambda *a, c=compiled, **k: c(*a, **k))
        step = torch.compile(step)
    elif variant == "nested_class":
        cls = type(model.blocks[0])
        cls.forward = torch.compiler.nested_compile_region(cls.forward)
        step = torch.compile(step)
    elif variant == "nested_instance":
        marked = torch.compiler.nested_compile_region(type(model.blocks[0]).forward)
        for block in model.blocks:
            block.forward = types.MethodType(marked, block)
        step = torch.compile(step)

    times, first_grads = [], []
    for _ in range(steps):
        start = time.perf_counter()
        loss = step(x, y)
        loss.backward()
        if not first_grads:  # the gradient norm of each block's first linear layer, after the first backward
            grads = [block.fc.weight.grad for block in model.blocks]
            first_grads = [None if grad is None else grad.norm().item() for grad in grads]
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    return {
        "variant": variant,
        "loss": loss.item(),
        "first_grads": first_grads,
        "first_step_s": times[0],
        "steady_step_ms": 1000 * statistics.median(times[2:]),
    }


def main() -> int:
    """Runs every variant in a fresh process and prints a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.layers, args.steps)))
        return 0
    rows = []
    for variant in VARIANTS:
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            command = [sys.executable, str(Path(__file__).resolve()), "--variant", variant]
            command += ["--layers", str(args.layers), "--steps", str(args.steps)]
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
    print(
        f"| variant ({args.layers} blocks, {args.steps} steps) | loss | `fc.weight` gradient norm per block, step 1"
        " | first step | steady step |"
    )
    print("|---|---|---|---|---|")
    for row in rows:
        grads = ", ".join("none" if g is None else f"{g:.4g}" for g in row["first_grads"])
        print(
            f"| {row['variant']} | {row['loss']:.4f} | {grads} | {row['first_step_s']:.1f} s"
            f" | {row['steady_step_ms']:.1f} ms |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
