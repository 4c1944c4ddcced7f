"""The main job, on CPU: a small GPT trained under DDP, eagerly and with ``use_compile``, side by side.

    python examples/demo.py

Each configuration runs in a fresh process with an empty inductor cache, so that every first step pays the full
compile. The table shows what ``use_compile`` adds to a run: the first (compiling) step, the steady step time, the
final loss against eager, and what the compiler did.

"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: The configurations the demo compares, with the ``use_compile`` value of each.
PATHS: dict[str, Any] = {
    "eager": None,
    "use_compile=True": True,
    'use_compile={"regions": "auto"}': {"regions": "auto"},
}


def _run_one(name: str, steps: int, layers: int) -> dict[str, Any]:
    """Trains in this process and returns the measurements."""
    import torch
    from gpt import GPTConfig, GPTModule  # beside this file

    import lightning_compile_patch
    from lightning.pytorch import Callback, Trainer

    class StepTimer(Callback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.model_type = ""

        def on_train_batch_start(self, trainer: Trainer, *args: Any) -> None:
            self._start = time.perf_counter()
            self.model_type = type(trainer.strategy.model).__name__

        def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
            self.times.append(time.perf_counter() - self._start)

    torch.manual_seed(0)
    timer = StepTimer()
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        strategy="ddp",
        max_steps=steps,
        limit_val_batches=0,
        use_compile=PATHS[name],
        callbacks=[timer],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(GPTModule(GPTConfig(n_layer=layers)))
    summary = lightning_compile_patch.last_summary(trainer)
    return {
        "name": name,
        "first_step_s": timer.times[0],
        "steady_step_ms": 1000 * statistics.median(timer.times[3:]),
        "final_loss": float(trainer.callback_metrics["train_loss"]),
        "strategy_model": timer.model_type,
        "graphs": summary.graphs if summary else 0,
        "graph_breaks": summary.graph_breaks - summary.expected_breaks if summary else 0,
    }


def _run_in_fresh_process(name: str, steps: int, layers: int, workdir: Path) -> dict[str, Any]:
    """Runs one configuration in a new Python process with an empty inductor cache."""
    slug = str(list(PATHS).index(name))
    out = workdir / f"{slug}.json"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(workdir / f"inductor-{slug}")}
    command = [sys.executable, str(Path(__file__).resolve())]
    command += ["--run", name, "--steps", str(steps), "--layers", str(layers), "--out", str(out)]
    subprocess.run(command, check=True, env=env, cwd=workdir)
    return json.loads(out.read_text())


def _table(results: list[dict[str, Any]]) -> str:
    eager = results[0]
    lines = [
        "| configuration | strategy.model | first step | steady step | vs eager | final loss | graphs | breaks* |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ratio = r["steady_step_ms"] / eager["steady_step_ms"]
        lines.append(
            f"| {r['name']} | {r['strategy_model']} | {r['first_step_s']:.1f} s | {r['steady_step_ms']:.1f} ms"
            f" | {ratio:.2f}x | {r['final_loss']:.4f} | {r['graphs']} | {r['graph_breaks']} |"
        )
    lines.append("\n*graph breaks besides the expected ones: in DDP's own code (torch's choice), at region boundaries")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Runs every configuration in its own process and prints the comparison; 0 if they agree with eager."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="training steps per configuration")
    parser.add_argument("--run", choices=list(PATHS), help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, default=4, help="GPT blocks (the regional cold start gains with depth)")
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:
        args.out.write_text(json.dumps(_run_one(args.run, args.steps, args.layers)))
        return 0

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as workdir:
        results = []
        for name in PATHS:
            print(f"--- {name}: training {args.steps} steps in a fresh process", flush=True)
            results.append(_run_in_fresh_process(name, args.steps, args.layers, Path(workdir)))
    print(f"\nA {args.layers}-layer GPT under DDP (world size 1, gloo) on CPU:\n")
    print(_table(results))
    eager_loss = results[0]["final_loss"]
    worst = max(abs(r["final_loss"] - eager_loss) for r in results)
    wrapped = all(r["strategy_model"] == "DistributedDataParallel" for r in results)
    print(f"\nlargest final-loss difference to eager: {worst:.2e}; DDP kept its type while compiled: {wrapped}")
    print(
        "regional compilation pays off with depth (its cold start stays flat as blocks are added, see"
        " docs/benchmarks.md); try `--layers 12`."
    )
    print(f"demo finished in {time.perf_counter() - started:.0f} s")
    return 0 if worst < 5e-2 and wrapped else 1


if __name__ == "__main__":
    sys.exit(main())
