"""The script from Lightning's `use_compile` feature request, run through `lightning_compile_patch`.

DDP with `static_graph=True`, `optimize_ddp="python_reducer"` and compiled autograd. Stock Lightning compiles the
model before DDP wraps it, so DDP's `_pre_forward`/`_post_forward` run outside the compiled code; on older torch the C++
reducer then stayed enabled and the run failed with "Final callbacks can only be installed during backward pass".
With `lightning_compile_patch`, the Trainer compiles DDP itself, after the wrap.

    python examples/seed_ddp_compiled_autograd.py --model compiled   # as in the report: fit(torch.compile(model))
    python examples/seed_ddp_compiled_autograd.py --model plain      # Trainer(use_compile=True) with a plain model
    python examples/seed_ddp_compiled_autograd.py --model option     # the whole setup in one option, 2 processes

The first two set the python reducer and compiled autograd by hand, as the report does, which works in one process
only. `--model option` is the same setup as one option, `use_compile={"compiled_autograd": True}`, under `ddp_spawn`
with 2 processes: each rank sets the python reducer before DDP is built and runs the fit under compiled autograd.
"""

import argparse

import torch
import torch.nn as nn
from torch._dynamo import compiled_autograd
from torch.utils.data import DataLoader, TensorDataset

import lightning_compile_patch  # patches pytorch_lightning's Trainer too
import pytorch_lightning as pl
from pytorch_lightning.strategies import DDPStrategy


class SomeModel(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(10, 1)

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.mean((self(x) - y) ** 2)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.02)


def create_dataset(num_samples=1000):
    x = torch.randn(num_samples, 10)
    y = torch.sum(x, dim=1, keepdim=True)
    return TensorDataset(x, y)


def run_training(model_kind: str, backend: str, accelerator: str = "cpu") -> dict:
    torch.manual_seed(0)
    dataset = create_dataset()
    train_loader = DataLoader(dataset, batch_size=32)
    model = SomeModel()
    compile_kwargs = {} if backend == "inductor" else {"backend": backend}
    quiet = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False}
    if model_kind == "option":
        # one option, nothing set by hand, in this process or in the two it spawns; each rank logs its summary
        strategy = DDPStrategy(static_graph=True, start_method="spawn")
        use_compile = {**compile_kwargs, "compiled_autograd": True}
        trainer = pl.Trainer(
            max_epochs=2, accelerator=accelerator, devices=2, strategy=strategy, use_compile=use_compile, **quiet
        )
        trainer.fit(model, train_loader)
    else:
        if model_kind == "compiled":
            # as in the report: compile the whole model before the Trainer sees it (use_compile=None re-applies it)
            model = torch.compile(model, **compile_kwargs)
            use_compile = None
        else:
            use_compile = compile_kwargs or True
        torch._dynamo.config.optimize_ddp = "python_reducer"  # as in the report: by hand, so for this process only
        strategy = DDPStrategy(static_graph=True)  # static_graph makes _DDPSink.backward queue a callback
        trainer = pl.Trainer(
            max_epochs=2, accelerator=accelerator, devices=1, strategy=strategy, use_compile=use_compile, **quiet
        )
        with compiled_autograd._enable(torch.compile(**compile_kwargs)):
            trainer.fit(model, train_loader)
    x, y = dataset.tensors
    module = model._orig_mod if model_kind == "compiled" else model
    device = next(module.parameters()).device
    with torch.no_grad():
        loss = torch.mean((module(x.to(device)) - y.to(device)) ** 2).item()
    steps = trainer.global_step if model_kind != "option" else "per-rank"  # ddp_spawn brings back weights, not steps
    return {"loss": loss, "steps": steps, "summary": lightning_compile_patch.last_summary(trainer)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["compiled", "plain", "option"], default="compiled")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (inductor, as in the report)")
    parser.add_argument("--accelerator", default="cpu", help="cpu (gloo), or cuda (nccl) as in the report")
    args = parser.parse_args()
    result = run_training(args.model, args.backend, args.accelerator)
    print(f"seed run finished: model={args.model} steps={result['steps']} mse_after_training={result['loss']:.4f}")
    if result["summary"] is not None:  # with `--model option` the ranks ran the fit, and each logged its summary
        print(f"compiled after the wrap: {result['summary']}")
    if args.model != "option":  # Dynamo's own counts of this process (a compiled model passed in gets no summary)
        from torch._dynamo.utils import counters

        breaks = sum(counters["graph_break"].values())
        print(f"dynamo: graphs={counters['stats']['unique_graphs']} graph_breaks={breaks}")
