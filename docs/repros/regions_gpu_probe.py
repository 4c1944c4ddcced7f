"""Where does regional compilation lose steady-step time on a GPU? Designs in a plain loop, one process.

    python docs/repros/regions_gpu_probe.py [--layers 12] [--steps 15] [--variants ...] [--profile DIR]
    python docs/repros/regions_gpu_probe.py --device cpu --backend aot_eager --layers 2 --steps 4   # a smoke check

GPT-2 small (124M; on CPU the demo's small GPT), sequence 1024, batch 16, bf16 autocast, AdamW. Each variant is
timed after its own compile; the regional ones use the package's own region code:

* ``whole``: ``torch.compile`` of the step (model and loss);
* ``regions+rest+step``: what ``use_compile={"regions": "auto"}`` does: the blocks as regions sharing one graph, the
  modules around them (embeddings, final norm, head) as regions of their own, the step (the loss) compiled;
* ``regions+step``: the blocks only as regions, the step compiled; ``regions-eager-step``: the same, the step eager;
* ``block.compile()``: ``nn.Module.compile`` on each block, the rest eager; ``eager``: nothing compiled.

A variant may end in ``/MODE``, a ``torch.compile`` mode for every compile it makes (``whole/reduce-overhead``: CUDA
graphs). ``--profile DIR`` writes, per variant, the operators of 3 steady steps by self time and a Chrome trace.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))  # the demo's GPT
from gpt import GPT, GPTConfig

from lightning_compile_patch.compile_features.regions import _compile_regions, _find_regions, _rest_of_model

DESIGNS = ("whole", "regions+rest+step", "regions+step", "regions-eager-step", "block.compile()", "eager")


def run(variant: str, args: argparse.Namespace, profile: Optional[Path]) -> str:
    """Trains ``args.steps`` steps of one variant; returns its table row (and writes its profile, if asked)."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    design, _, mode = variant.partition("/")
    if design not in DESIGNS:
        raise SystemExit(f"unknown variant {variant!r}; the designs are {', '.join(DESIGNS)}")
    kwargs = {"backend": args.backend, **({"mode": mode} if mode else {})}
    config = GPTConfig.gpt2_small(n_layer=args.layers) if args.device == "cuda" else GPTConfig(n_layer=args.layers)
    model = GPT(config).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=args.device == "cuda")
    x, y = (torch.randint(0, config.vocab_size, (16, config.block_size), device=args.device) for _ in range(2))
    synchronize = torch.cuda.synchronize if args.device == "cuda" else lambda: None

    def step() -> torch.Tensor:
        with torch.autocast(args.device, dtype=torch.bfloat16):
            logits = model(x)
            return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), y.view(-1))

    if design.startswith("regions"):
        blocks = _find_regions(model, "auto")
        _compile_regions(blocks, kwargs, shared=True)
        if design == "regions+rest+step":
            _compile_regions(_rest_of_model(model, blocks), kwargs, shared=False)
    elif design == "block.compile()":
        for block in model.blocks:
            block.compile(**kwargs)
    if design in ("whole", "regions+rest+step", "regions+step"):
        step = torch.compile(step, **kwargs)

    def one_step() -> torch.Tensor:
        loss = step()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    times = []
    for _ in range(args.steps):
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
        sort_by = "self_cuda_time_total" if args.device == "cuda" else "self_cpu_time_total"
        (profile / f"{variant.replace('/', '-')}.txt").write_text(
            prof.key_averages().table(sort_by=sort_by, row_limit=40)
        )
        prof.export_chrome_trace(str(profile / f"{variant.replace('/', '-')}.json"))
    peak = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else float("nan")
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    steady = 1000 * statistics.median(times[3:] or times[-1:])
    return f"| {variant} | {times[0]:.1f} s | {steady:.1f} ms | {peak:.1f} GiB | {loss.item():.4f} |"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--steps", type=int, default=15, help="steps per variant; steady: the median after 3")
    parser.add_argument("--variants", default="whole,regions+rest+step,regions+step")
    parser.add_argument("--profile", type=Path, help="write a profile of each variant's steady steps here")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke check on the demo's small GPT")
    parser.add_argument("--backend", default="inductor", help="the torch.compile backend of every compile")
    args = parser.parse_args()
    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU (smoke check: the demo GPT)"
    print(f"torch {torch.__version__}, {where}")
    print("| variant | first step | steady step | peak memory | loss |\n|---|---|---|---|---|", flush=True)
    for variant in args.variants.split(","):
        print(run(variant, args, args.profile), flush=True)
