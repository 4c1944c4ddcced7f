"""What compiling after the wrap buys over stock Lightning, under DDP: what runs in the graph, graphs, step time.

    python benchmarks/after_the_wrap.py [--backend inductor] [--steps 30] [--accelerator cpu --devices 2]

Both paths compile the model with ``torch.compile(model, backend=...)`` and fit it with ``strategy="ddp"`` (2 gloo
processes on CPU by default), each path in processes of its own (Dynamo's caches and counters are per process).
``stock`` passes ``from_compiled(compiled)``, Lightning's own behavior: its steps are compiled before DDP wraps the
model. ``after the wrap`` passes the compiled model itself, which is compiled again after the wrap, DDP's wrapper
itself.
For each path, per step on rank 0 after the first (the compile):

* how often DDP's ``_pre_forward`` and ``_post_forward`` ran eagerly (0: they ran inside the compiled code, or not
  at all as Python);
* whether DDP's forward pre-hooks ran inside the compiled code (``torch.compiler.is_compiling()`` in a pre-hook, on
  the first step);
* the graphs Dynamo compiled and its graph breaks (``torch._dynamo.utils.counters``);
* the steady step time: the median after ``--warmup`` steps, and the ratio of the two paths, from one run each.

It prints a Markdown table and writes it, with the JSON of each path, under ``--out``.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

import lightning_compile_patch  # noqa: F401  (the Trainer compiles a compiled model again after the wrap)
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.utilities.compile import from_compiled

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))  # the demo's GPT, outside the wheel
from gpt import GPTConfig, GPTModule

PATHS = ("stock", "after the wrap")


class Unlogged(GPTModule):
    """The demo GPT without ``self.log`` in its step: Lightning 2.6's own ``self.log`` fails under Dynamo (master
    compiler-disables it, #21837), so the stock path could not run the demo's step compiled at all."""

    def training_step(self, batch, batch_idx):
        return self._loss(batch)


class Probe(Callback):
    """Counts DDP's eager pre-/post-forward calls and times each step, on every rank; rank 0 writes the result."""

    def __init__(self, out: Path, accelerator: str) -> None:
        self.out, self.accelerator = out, accelerator
        self.times: list[float] = []
        self.eager = {"_pre_forward": [], "_post_forward": []}
        self.hook_compiling: list[bool] = []

    def setup(self, trainer: Trainer, pl_module: object, stage: str) -> None:
        self._calls = dict.fromkeys(self.eager, 0)
        for name in self.eager:
            original = getattr(DistributedDataParallel, name)

            def counted(ddp: DistributedDataParallel, *args, _original=original, _name=name, **kwargs):
                if not torch.compiler.is_compiling():  # folded to True while Dynamo traces: only eager calls count
                    self._calls[_name] += 1
                return _original(ddp, *args, **kwargs)

            setattr(DistributedDataParallel, name, counted)

    def on_fit_start(self, trainer: Trainer, pl_module: object) -> None:
        # on the first step only: a hook that appends to a list at every step would itself recompile the compiled call
        # (a guard on the list's length) until the recompile limit
        self._hook = trainer.strategy.model.register_forward_pre_hook(
            lambda *_: self.hook_compiling.append(torch.compiler.is_compiling())
        )

    def _sync(self) -> None:
        if self.accelerator == "cuda":
            torch.cuda.synchronize()

    def on_train_batch_start(self, *_: object) -> None:
        self._sync()
        self._start = time.perf_counter()
        self._before = dict(self._calls)

    def on_train_batch_end(self, *_: object) -> None:
        self._sync()
        self._hook.remove()
        self.times.append(time.perf_counter() - self._start)
        for name in self.eager:
            self.eager[name].append(self._calls[name] - self._before[name])

    def on_fit_end(self, trainer: Trainer, pl_module: object) -> None:
        if trainer.global_rank != 0:
            return
        from torch._dynamo.utils import counters

        result = {
            "times": self.times,
            "eager": self.eager,
            "hook_compiling": self.hook_compiling,
            "graphs": counters["stats"].get("unique_graphs", 0),
            "frames": counters["frames"].get("ok", 0),
            "graph_breaks": sum(counters["graph_break"].values()),
            "break_reasons": sorted({str(k)[:120] for k in counters["graph_break"]}),
        }
        self.out.write_text(json.dumps(result))


def run(path: str, args: argparse.Namespace, out: Path) -> None:
    """Trains the demo GPT along ``path``; rank 0 writes what it recorded to ``out``."""
    seed_everything(0)
    config = GPTConfig(n_layer=args.layers, n_embd=args.width, samples=8 * 2 * args.steps)
    model = Unlogged(config)
    probe = Probe(out, args.accelerator)
    trainer = Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy="ddp",
        max_steps=args.steps,
        callbacks=[probe],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    compiled = torch.compile(model, backend=args.backend)
    trainer.fit(from_compiled(compiled) if path == "stock" else compiled)  # compiled before, or after, the wrap


def main() -> None:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--path", choices=list(PATHS), help="run one path here (the script runs each in its own)")
    args = parser.parse_args()
    args.out = args.out or Path(tempfile.mkdtemp(prefix="after-the-wrap-"))
    args.out.mkdir(parents=True, exist_ok=True)
    files = {path: args.out / f"{path.replace(' ', '_')}.json" for path in PATHS}
    if args.path:
        run(args.path, args, files[args.path])
        return
    for path in PATHS:
        given = [a for a in sys.argv[1:] if a not in ("--out", str(args.out))]
        subprocess.run([sys.executable, __file__, *given, "--out", str(args.out), "--path", path], check=True)
    results = {path: json.loads(files[path].read_text()) for path in PATHS}
    steady = {path: statistics.median(r["times"][args.warmup :]) for path, r in results.items()}
    rows = [
        "| | stock (`from_compiled`) | after the wrap |",
        "|---|---|---|",
        "| DDP `_pre_forward` run eagerly, per step after the first | "
        + " | ".join(str(sorted(set(r["eager"]["_pre_forward"][1:]))) for r in results.values())
        + " |",
        "| DDP `_post_forward` run eagerly, per step after the first | "
        + " | ".join(str(sorted(set(r["eager"]["_post_forward"][1:]))) for r in results.values())
        + " |",
        "| DDP's forward pre-hooks inside the compiled code (first step) | "
        + " | ".join("yes" if all(r["hook_compiling"]) else "no" for r in results.values())
        + " |",
        "| frames Dynamo converted (each compile and recompile) | "
        + " | ".join(str(r["frames"]) for r in results.values())
        + " |",
        "| graphs compiled | " + " | ".join(str(r["graphs"]) for r in results.values()) + " |",
        "| graph breaks | " + " | ".join(str(r["graph_breaks"]) for r in results.values()) + " |",
        f"| steady step (median after {args.warmup} steps) | "
        + " | ".join(f"{steady[p] * 1e3:.1f} ms" for p in PATHS)
        + " |",
        f"| ratio, after the wrap / stock | | {steady['after the wrap'] / steady['stock']:.3f} |",
    ]
    reasons = {p: r["break_reasons"] for p, r in results.items()}
    table = "\n".join(rows) + "\n"
    header = (
        f"torch {torch.__version__}, {args.devices} x {args.accelerator} (ddp), backend {args.backend},"
        f" GPT {args.layers} layers x {args.width}, {args.steps} steps\n\n"
    )
    (args.out / "after_the_wrap.md").write_text(header + table + f"\ngraph breaks: {json.dumps(reasons)}\n")
    print(header + table)
    print("graph breaks:", json.dumps(reasons, indent=1))


if __name__ == "__main__":
    main()
