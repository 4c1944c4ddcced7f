"""Where does regional compilation lose steady-state time on a GPU? Four designs in a plain loop, one process.

    python benchmarks/regions_gpu_probe.py [--layers 12] [--steps 15]

GPT-2 small (124M), sequence 1024, batch 16, bf16 autocast, AdamW. Variants, each timed after its own compile:

* ``whole``: ``torch.compile`` of the step (model + loss);
* ``regions+step``: blocks as opaque compiled regions (``use_compile={"regions": ...}``'s design), step compiled;
* ``regions-eager-step``: the same regions, the rest of the step eager;
* ``regions+siblings+step``: also the embeddings, final norm and head as regions, step compiled;
* ``block.compile()``: ``nn.Module.compile`` on each block, the rest eager (the plain per-block baseline).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from lightning_compile_patch.demos.gpt import GPT, GPTConfig
from lightning_compile_patch.regions import _compile_regions, _find_regions


def run(variant: str, layers: int, steps: int) -> str:
    torch.manual_seed(0)
    torch._dynamo.reset()
    config = GPTConfig.gpt2_small(n_layer=layers)
    model = GPT(config).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randint(0, config.vocab_size, (16, config.block_size), device="cuda")
    y = torch.randint(0, config.vocab_size, (16, config.block_size), device="cuda")

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
            return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), y.view(-1))

    if variant == "whole":
        step = torch.compile(step)
    elif variant in ("regions+step", "regions-eager-step"):
        _compile_regions(_find_regions(model, "auto"), {})
        if variant == "regions+step":
            step = torch.compile(step)
    elif variant == "regions+siblings+step":
        siblings = {"wte": model.wte, "wpe": model.wpe, "ln_f": model.ln_f, "head": model.head}
        _compile_regions({**_find_regions(model, "auto"), **siblings}, {})
        step = torch.compile(step)
    elif variant == "block.compile()":
        for block in model.blocks:
            block.compile()
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = step(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return f"| {variant} | {times[0]:.1f} s | {1000 * statistics.median(times[3:]):.1f} ms | {loss.item():.4f} |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--variants", default="whole,regions+step,regions-eager-step,block.compile()")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("| variant | first step | steady step | loss |\n|---|---|---|---|", flush=True)
    for variant in args.variants.split(","):
        print(run(variant, args.layers, args.steps), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
