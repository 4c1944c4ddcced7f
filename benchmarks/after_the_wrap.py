"""What compiling after the wrap buys over stock Lightning, under DDP: what runs in the graph, graphs, step time.

    python benchmarks/after_the_wrap.py [--backend inductor] [--steps 30] [--accelerator cpu --devices 2]

Both paths compile the model with ``torch.compile(model, backend=...)`` and fit it with ``strategy="ddp"`` (2 gloo
processes on CPU by default), each path in processes of its own (Dynamo's caches and counters are per process).
``stock`` passes ``from_compiled(compiled)``, Lightning's own behavior: its steps are compiled before DDP wraps the
model. ``after the wrap`` passes the compiled model itself, whose steps the package compiles again after the strategy's
setup (DDP's call itself only under its python reducer; until 2026-12-06 it compiled DDP's call under every reducer).
For each path, per step on rank 0 after the first (the compile):

* how often DDP's ``forward``, ``_pre_forward`` and ``_post_forward`` ran as Python (their own code objects), counted
  with ``sys.setprofile`` on steps 2 and 3, which are not timed: code that Dynamo traced into a graph runs as the
  graph, so 0 means traced; a frame that Dynamo skips, or gives up on, runs its original code and counts. (A counting
  wrapper patched onto the class cannot tell the two apart: Dynamo compiles the wrapper as a frame of its own when
  the eager ``forward`` calls it, and folds its ``is_compiling()`` check away.)
* whether DDP's forward pre-hooks ran inside the compiled code (``torch.compiler.is_compiling()`` in a pre-hook, on
  the first step);
* the graphs Dynamo compiled and its graph breaks (``torch._dynamo.utils.counters``);
* the steady step time: the median after ``--warmup`` steps, and the ratio of the two paths, from one run each.

It prints a Markdown table and writes it, with the JSON of each path, under ``--out``.
"""

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

import lightning_compile_patch  # noqa: F401  (the Trainer compiles a compiled model again after the wrap)
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.utilities.compile import from_compiled

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))  # the demo's GPT, outside the wheel
from gpt import GPTConfig, GPTModule

PATHS = ("stock", "after the wrap")
#: DDP's own forward, by code object: what ``sys.setprofile`` sees run as Python.
DDP_CODE = {
    getattr(DistributedDataParallel, name).__code__: name for name in ("forward", "_pre_forward", "_post_forward")
}
#: The steps (0-based) on which the probe counts; not timed, since a profile function slows every call down.
PROFILED = (1, 2)


@contextlib.contextmanager
def python_frames(codes: dict[types.CodeType, str]) -> Iterator[dict[str, int]]:
    """Counts, by name, the frames of ``codes`` that run as Python (their own code) in the block.

    Code that Dynamo traced into a graph runs as the graph, so it does not count; a frame that Dynamo skips or gives up
    on runs its original code, and counts. The profile function sees every Python call, so it slows the block down.

    """
    calls = dict.fromkeys(codes.values(), 0)

    def profile(frame: types.FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code in codes:
            calls[codes[frame.f_code]] += 1

    sys.setprofile(profile)
    try:
        yield calls
    finally:
        sys.setprofile(None)


class Unlogged(GPTModule):
    """The demo GPT without ``self.log`` in its step: Lightning 2.6's own ``self.log`` fails under Dynamo (master
    compiler-disables it, #21837), so the stock path could not run the demo's step compiled at all."""

    def training_step(self, batch, batch_idx):
        return self._loss(batch)


class Probe(Callback):
    """Counts DDP's own forward code run as Python and times each step, on every rank; rank 0 writes the result."""

    def __init__(self, out: Path, accelerator: str) -> None:
        self.out, self.accelerator = out, accelerator
        self.times: list[float] = []
        self.python: dict[str, list[int]] = {name: [] for name in DDP_CODE.values()}
        self.hook_compiling: list[bool] = []

    def on_fit_start(self, trainer: Trainer, pl_module: object) -> None:
        # on the first step only: a hook that appends to a list at every step would itself recompile the compiled call
        # (a guard on the list's length) until the recompile limit
        self._hook = trainer.strategy.model.register_forward_pre_hook(
            lambda *_: self.hook_compiling.append(torch.compiler.is_compiling())
        )

    def _sync(self) -> None:
        if self.accelerator == "cuda":
            torch.cuda.synchronize()

    def on_train_batch_start(self, trainer: Trainer, pl_module: object, batch: object, batch_idx: int) -> None:
        self._sync()
        if batch_idx in PROFILED:
            self._profile = python_frames(DDP_CODE)
            self._calls = self._profile.__enter__()
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer: Trainer, pl_module: object, outputs: object, batch: object, i: int) -> None:
        self._sync()
        self.times.append(time.perf_counter() - self._start)
        self._hook.remove()
        if i in PROFILED:
            self._profile.__exit__(None, None, None)
            for name, count in self._calls.items():
                self.python[name].append(count)

    def on_fit_end(self, trainer: Trainer, pl_module: object) -> None:
        if trainer.global_rank != 0:
            return
        from torch._dynamo.utils import counters

        result = {
            "times": self.times,
            "python": self.python,
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
    if args.steps <= max(PROFILED) + args.warmup or args.warmup <= max(PROFILED):
        parser.error(f"--warmup must be over {max(PROFILED)} (the profiled steps are not timed), and --steps over it")
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
        *(
            f"| DDP `{name}` run as Python, steps 2 and 3 | "
            + " | ".join(str(r["python"][name]) for r in results.values())
            + " |"
            for name in DDP_CODE.values()
        ),
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
