"""`torch.compiler.nested_compile_region` with inductor computes a wrong gradient (torch 2.13, CPU).

    python docs/repros/nested_compile_region_gradients.py [--backend inductor|aot_eager]

An embedding, two residual blocks whose ``forward`` is a nested compile region, a LayerNorm and a linear head. The
gradient norm of each block's weight, after one backward: eager, ``torch.compile`` of the step, and the same with the
blocks as nested compile regions. Why ``use_compile={"regions": ...}`` does not build on ``nested_compile_region``:
see docs/regions.md.
"""

import argparse

import torch
from torch import nn


class Block(nn.Module):
    """A residual linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x + fc(x)``."""
        return x + self.fc(x)


def block_gradients(mode: str, backend: str) -> list[float]:
    """The norm of each block's ``fc.weight`` gradient after one backward."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    embedding = nn.Embedding(10, 16)
    blocks = nn.ModuleList(Block() for _ in range(2))
    head = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 32, bias=False))

    def step(idx: torch.Tensor) -> torch.Tensor:
        x = embedding(idx)
        for block in blocks:
            x = block(x)
        return head(x).square().mean()

    forward = Block.forward
    if mode == "nested regions":
        Block.forward = torch.compiler.nested_compile_region(forward)
    if mode != "eager":
        step = torch.compile(step, backend=backend)
    try:
        step(torch.arange(8)).backward()
    finally:
        Block.forward = forward
    return [round(block.fc.weight.grad.norm().item(), 4) for block in blocks]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="inductor")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, backend {args.backend}")
    for mode in ("eager", "compiled", "nested regions"):
        print(f"{mode:>15}: {block_gradients(mode, args.backend)}")
