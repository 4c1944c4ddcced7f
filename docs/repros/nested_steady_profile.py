"""One steady training step of the demo GPT (12 blocks), whole model against nested regions, profiled (torch 2.9).

    python docs/repros/nested_steady_profile.py whole
    python docs/repros/nested_steady_profile.py nested

Trains 10 steps through the Trainer with ``fullgraph=True`` (and ``regions="auto"`` for ``nested``), one torch thread,
and prints the median step after the first 3, and the profiler's event count and self CPU time of step 8. Run each
twice with the same ``TORCHINDUCTOR_CACHE_DIR`` to leave compilation out of the process-to-process noise.
"""

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

import lightning_compile_patch  # noqa: F401  (patches the Trainer: `use_compile`)
from lightning.pytorch import Callback, Trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))  # the demo's GPT
from gpt import GPTConfig, GPTModule

QUIET = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False}


class ProfileStep(Callback):
    """Times every step and profiles the 8th."""

    def __init__(self) -> None:
        self.steps: list[float] = []

    def on_train_batch_start(self, *args: Any) -> None:
        """Starts the clock, and the profiler before the 8th step."""
        self.start = time.perf_counter()
        if len(self.steps) == 7:
            self.profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.profile.__enter__()

    def on_train_batch_end(self, *args: Any) -> None:
        """Stops the clock, and the profiler after the 8th step."""
        self.steps.append(time.perf_counter() - self.start)
        if len(self.steps) == 8:
            self.profile.__exit__(None, None, None)
            events = self.profile.key_averages()
            self.events = sum(e.count for e in events)
            self.self_cpu_ms = sum(e.self_cpu_time_total for e in events) / 1000


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else "nested"
    torch.set_num_threads(1)
    use_compile = {"fullgraph": True, **({"regions": "auto"} if path == "nested" else {})}
    probe = ProfileStep()
    trainer = Trainer(
        use_compile=use_compile, max_steps=10, limit_val_batches=0, callbacks=[probe], accelerator="cpu", **QUIET
    )
    config = GPTConfig(n_layer=12, n_head=4, n_embd=64, block_size=64, vocab_size=256, batch_size=8, samples=80)
    trainer.fit(GPTModule(config))
    median_ms = 1000 * statistics.median(probe.steps[3:])
    print(f"{path}: steady {median_ms:.1f} ms; step 8: {probe.events} profiler events, {probe.self_cpu_ms:.1f} ms CPU")
