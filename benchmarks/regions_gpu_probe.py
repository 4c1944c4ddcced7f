"""Where does regional compilation lose steady-state time on a GPU? Designs in a plain loop, one process.

    python benchmarks/regions_gpu_probe.py [--layers 12] [--steps 15] [--variants ...] [--profile DIR]

GPT-2 small (124M), sequence 1024, batch 16, bf16 autocast, AdamW. Variants, each timed after its own compile:

* ``whole``: ``torch.compile`` of the step (model + loss);
* ``regions+rest+step``: what ``use_compile={"regions": "auto"}`` does: the blocks as opaque compiled regions sharing
  one graph, the modules around them (``_rest_of_model``: embeddings, final norm, head) as regions of their own, and
  the step (the loss) compiled around them;
* ``regions+step``: the blocks only as regions, the step compiled;
* ``regions-eager-step``: the blocks only as regions, the rest of the step eager;
* ``block.compile()``: ``nn.Module.compile`` on each block, the rest eager (the plain per-block baseline).

A variant may end in ``/MODE``, a ``torch.compile`` mode for every compile it makes: ``whole/reduce-overhead`` and
``regions+rest+step/reduce-overhead`` (CUDA graphs) tell whether the regional gap is the host's per-region overhead
(which CUDA graphs remove) or the GPU's own work.

``--profile DIR`` also profiles 3 steady steps of each variant with ``torch.profiler`` and writes, per variant, the
operators by self CUDA time (``DIR/<variant>.txt``) and a Chrome trace (``DIR/<variant>.json``), to see where the
steady-step gap between ``whole`` and the regional designs goes.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from lightning_compile_patch.demos.gpt import GPT, GPTConfig
from lightning_compile_patch.regions import _compile_regions, _find_regions, _rest_of_model


def run(
    variant: str,
    layers: int,
    steps: int,
    profile: Optional[Path] = None,
    device: str = "cuda",
    backend: str = "inductor",
) -> str:
    """Trains ``steps`` steps of one variant; returns its table row (and writes its profile, if asked)."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    design, _, mode = variant.partition("/")
    kwargs = {"backend": backend, **({"mode": mode} if mode else {})}
    config = GPTConfig.gpt2_small(n_layer=layers) if device == "cuda" else GPTConfig(n_layer=layers)
    model = GPT(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    x = torch.randint(0, config.vocab_size, (16, config.block_size), device=device)
    y = torch.randint(0, config.vocab_size, (16, config.block_size), device=device)
    synchronize = torch.cuda.synchronize if device == "cuda" else lambda: None

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device, dtype=torch.bfloat16):
            logits = model(x)
            return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), y.view(-1))

    if design == "whole":
        step = torch.compile(step, **kwargs)
    elif design in ("regions+rest+step", "regions+step", "regions-eager-step"):
        blocks = _find_regions(model, "auto")
        _compile_regions(blocks, kwargs, shared=True)
        if design == "regions+rest+step":
            _compile_regions(_rest_of_model(model, blocks), kwargs, shared=False)
        if design != "regions-eager-step":
            step = torch.compile(step, **kwargs)
    elif design == "block.compile()":
        for block in model.blocks:
            block.compile(**kwargs)
    else:
        raise ValueError(f"unknown variant {variant!r}")

    def one_step() -> torch.Tensor:
        loss = step(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    times = []
    for _ in range(steps):
        synchronize()
        start = time.perf_counter()
        loss = one_step()
        synchronize()
        times.append(time.perf_counter() - start)
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
        with torch.profiler.profile() as prof:
            for _ in range(3):
                one_step()
            synchronize()
        sort_by = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=sort_by, row_limit=40)
        slug = variant.replace("/", "-")
        (profile / f"{slug}.txt").write_text(table)
        prof.export_chrome_trace(str(profile / f"{slug}.json"))
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    first, steady = times[0], 1000 * statistics.median(times[3:])
    return f"| {variant} | {first:.1f} s | {steady:.1f} ms | {peak:.1f} GiB | {loss.item():.4f} |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--variants", default="whole,regions+rest+step,regions+step")
    parser.add_argument("--profile", type=Path, help="write a profile of each variant's steady steps here")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke check of the script on the demo's small GPT")
    parser.add_argument("--backend", default="inductor", help="the torch.compile backend of every compile")
    args = parser.parse_args()
    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU (smoke check: the demo GPT)"
    print(f"torch {torch.__version__}, {where}")
    print("| variant | first step | steady step | peak memory | loss |\n|---|---|---|---|---|", flush=True)
    for variant in args.variants.split(","):
        print(run(variant, args.layers, args.steps, args.profile, args.device, args.backend), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
