"""The main job, on CPU: a small GPT trained under DDP, eagerly, with Lightning's own compile and with ``use_compile``.

    python examples/demo.py                      # eager, fit(torch.compile(model)), use_compile=True
    python examples/demo.py --layers 12 --regions   # deeper, and regional compilation beside them

Each configuration runs in a fresh process, with one torch thread, set by ``OMP_NUM_THREADS=1`` in its environment.
``torch.set_num_threads(1)`` is not enough: when that variable is unset, Lightning's DDP strategy sets torch's threads
to cores / processes (2 here) as it sets up. With two threads on two busy cores, a step waits at every parallel region
for a thread the OS descheduled: beside the project's test suite, an eager DDP step of this model took 1,535 ms with
two threads against 46 ms with one (the median of 35 steps each). That, not the package, made the regional steady step
of an earlier version of this demo 40x eager's, and its steady figures noise on a loaded machine: it called
``torch.set_num_threads(1)``, and Lightning undid it. Each process now reports the threads its steps ran with, and the
demo fails unless every one ran with one.

Eager and Lightning's ``fit(torch.compile(model))`` run in processes that do not import the package: once imported,
it also handles a compiled model passed in without ``use_compile`` (compiled again after the wrap, with the features of
its ``INPUT_DEFAULTS``), and the row would not be Lightning's own path. Each process reports whether it imported the
package, and the demo fails unless only ``use_compile``'s did. Lightning's own path trains the same model with its
``self.log`` moved out of ``training_step`` into ``on_train_batch_end``: Lightning 2.6.6 cannot compile a step that
calls ``self.log`` on torch 2.13 (Dynamo fails in ``LightningModule.log``), which ``use_compile`` compiles as written.

The compiled configurations compile one at a time, ``use_compile`` first, and share one inductor cache, empty at the
start, as a user's runs share torch's default cache. So ``use_compile``'s first step pays the full cold compile, and
Lightning's own path, compiling the same step after it, finds most of its kernels compiled: its first step is
marked *(warm)*, and is not a cold-start figure. Compiling one at a time (inductor's worker pool using both cores)
rather than side by side, into one cache, cuts the compile work by a third: the demo took 48 s on an idle 2-core
machine, and 65 and 71 s beside the project's test suite (its own time, without the install; 62 s, and 85 and 91 s,
through ``nox -s demo`` from a fresh clone).

The steady steps are measured interleaved: once every configuration has compiled and trained its first steps, its
process waits, and the processes then take turns, one step each (a window of ``WINDOW`` steps), round after round
for about 5 seconds (at least 10 rounds). Another job on the machine slows the configurations alike within a round,
which lasts a fraction of a second, but not alike from one round to the next. So each configuration's ratio to eager
is the median, over the rounds, of its window's median against eager's window median in the same round; and its
steady step is its least disturbed window (the lowest window median), since another job only ever adds time to a
step. The rounds rotate which configuration goes first, and run for a time rather than a count so that a loaded
machine, where a step can take ten times as long, does not stretch the demo.

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

#: The configurations the demo compares: how the model is passed, and ``use_compile``.
PATHS: dict[str, dict[str, Any]] = {
    "eager": {"compile_model": False, "use_compile": None},
    # its model logs the loss after the step: Lightning 2.6.6 cannot compile a step that calls `self.log` (torch 2.13)
    "Lightning: fit(torch.compile(model))": {"compile_model": True, "use_compile": None, "log_in_step": False},
    "use_compile=True": {"compile_model": False, "use_compile": True},
}
REGIONS = {'use_compile={"regions": "auto"}': {"compile_model": False, "use_compile": {"regions": "auto"}}}
ALL_PATHS = {**PATHS, **REGIONS}
#: The order they compile in: ``use_compile`` cold, then the others from its cache (see the module's docstring).
COMPILE_ORDER = ["eager", "use_compile=True", *REGIONS, "Lightning: fit(torch.compile(model))"]
#: The GPU figures of docs/benchmarks.md ("Single device"), shown under the table.
GPU_LINE = (
    "On a GPU (NVIDIA H200, torch 2.11, 2026-11-30, GPT-2 small on one device; docs/benchmarks.md): eager 75.8 ms a"
    " step, Lightning's fit(torch.compile(model)) 40.3 ms, use_compile=True 41.9 ms (1.81x eager's speed, 1.04x"
    " Lightning's own step time)."
)
#: The cold first steps of docs/benchmarks.md ("DDP, world size 1", cpu mode), shown under the table: here Lightning's
#: path compiles warm, from ``use_compile``'s cache.
COLD_LINE = (
    "Cold, each into an empty cache, the two compiled paths take the same first step: 21.2 s for Lightning's"
    " fit(torch.compile(model)), 20.4 s for use_compile=True (a 4-layer GPT under DDP on a 2-core CPU, bench.py --mode"
    " cpu, 2026-11-30; docs/benchmarks.md)."
)
#: Steps each configuration trains before the interleaved windows (its compile, then a few steady steps).
WARMUP_STEPS = 5
#: The interleaved windows: steps in each, and rounds of them (at least, at most, and for about how long).
WINDOW, MIN_ROUNDS, MAX_ROUNDS, STEADY_S = 1, 10, 120, 5.0


def _run_one(name: str, layers: int) -> dict[str, Any]:
    """Trains in this process: each time it reads ``go`` from stdin, the next steps (the first ones, then a window)."""
    import torch
    from gpt import GPTConfig, GPTModule, LogOutsideStepGPT  # beside this file

    path = ALL_PATHS[name]
    if _uses_package(name):
        # Only here: once imported, the package also handles a compiled model passed in without `use_compile` (it
        # compiles its steps again after the wrap, with some of its features), which is then not Lightning's own path.
        import lightning_compile_patch  # noqa: F401  # Trainer(use_compile=...)
    from lightning.pytorch import Callback, Trainer

    class Windows(Callback):
        """Times every step; before step 0, the first window and every window after, reports and waits for a word."""

        def __init__(self) -> None:
            self.times: list[float] = []
            self.model_type = ""
            self.threads = 0

        def on_train_batch_start(self, trainer: Trainer, *args: Any) -> int | None:
            step = len(self.times)
            if step == 0 or (step >= WARMUP_STEPS and (step - WARMUP_STEPS) % WINDOW == 0):
                window = self.times[-WINDOW:] if step > WARMUP_STEPS else []  # none yet: set up, or compiled
                print(json.dumps({"window": window}), flush=True)
                if sys.stdin.readline().strip() == "stop":
                    trainer.should_stop = True
                    return -1  # Lightning's word for: no more steps in this epoch
            self.model_type = type(trainer.strategy.model).__name__
            self.threads = torch.get_num_threads()
            self._start = time.perf_counter()
            return None

        def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
            self.times.append(time.perf_counter() - self._start)

    torch.manual_seed(0)
    windows = Windows()
    use_compile = {} if path["use_compile"] is None else {"use_compile": path["use_compile"]}
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        strategy="ddp",
        max_steps=WARMUP_STEPS + MAX_ROUNDS * WINDOW + 1,  # stopped by the word "stop" before this
        limit_val_batches=0,
        callbacks=[windows],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **use_compile,
    )
    module = GPTModule if path.get("log_in_step", True) else LogOutsideStepGPT
    model = module(GPTConfig(n_layer=layers, n_embd=128, batch_size=16, block="llama"))
    trainer.fit(torch.compile(model) if path["compile_model"] else model)
    return {
        "name": name,
        "first_step_s": windows.times[0],
        "final_loss": float(trainer.callback_metrics["train_loss"]),
        "strategy_model": windows.model_type,
        "threads": windows.threads,
        "patched": "lightning_compile_patch" in sys.modules,
        "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"],
    }


def _compiles(name: str) -> bool:
    return bool(ALL_PATHS[name]["compile_model"] or ALL_PATHS[name]["use_compile"])


def _uses_package(name: str) -> bool:
    """Only ``use_compile``'s configurations import the package (see the module's docstring)."""
    return ALL_PATHS[name]["use_compile"] is not None


class _Configuration:
    """One configuration's process: it compiles into the demo's one inductor cache, and trains when told to."""

    def __init__(self, name: str, layers: int, workdir: Path, warm: bool) -> None:
        self.name, self.slug, self.warm = name, str(list(ALL_PATHS).index(name)), warm
        self.out = workdir / f"{self.slug}.json"
        self.log = open(workdir / f"{self.slug}.log", "w")  # noqa: SIM115  # closed in `result`
        # OMP_NUM_THREADS, not torch.set_num_threads: Lightning's DDP strategy sets torch's threads to cores / processes
        # when the variable is unset, whatever the process had set (see the module's docstring)
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(workdir / "inductor"), "OMP_NUM_THREADS": "1"}
        command = [sys.executable, str(Path(__file__).resolve()), "--run", name, "--layers", str(layers)]
        command += ["--out", str(self.out)]
        self.process = subprocess.Popen(
            command, env=env, cwd=workdir, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True
        )
        self.windows: list[float] = []  # the median of each steady window

    def wait(self) -> list[float]:
        """Waits until the process reports (set up, compiled, or a window done), and returns the window's times."""
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith('{"window"'):
                return json.loads(line)["window"]
        self.log.close()
        raise RuntimeError(f"{self.name} stopped; its output: {Path(self.log.name).read_text()[-3000:]}")

    def tell(self, word: str) -> None:
        """``go``: train the next steps; ``stop``: finish the run."""
        assert self.process.stdin is not None
        self.process.stdin.write(word + "\n")
        self.process.stdin.flush()

    def result(self) -> dict[str, Any]:
        """The run's measurements, once it has been told to stop (all are told at once: they finish side by side)."""
        if self.process.wait() != 0:
            raise RuntimeError(f"{self.name} failed; its output: {Path(self.log.name).read_text()[-3000:]}")
        self.log.close()
        measured = {"steady_step_ms": 1000 * min(self.windows), "windows": self.windows, "warm": self.warm}
        return {**json.loads(self.out.read_text()), **measured}


def run_interleaved(names: list[str], layers: int, workdir: Path) -> list[dict[str, Any]]:
    """The configurations compile one at a time (eager beside the first); then their steady windows take turns.

    The first to compile starts alone: once it is set up (imports, the Trainer, DDP), the modules it imported are
    byte-compiled, and the others start and set up beside its compile (in a fresh environment, three processes
    importing torch at once would each byte-compile it). Each of the others compiles once the one before it has. On a
    loaded machine the OS shares the CPU out per runnable thread, so a demo that keeps its processes busy side by side
    gets more of it than one that waits. ``names[0]`` is eager, which the others' windows are compared with.
    """
    started = time.perf_counter()

    def say(text: str) -> None:
        print(f"--- {text} ({time.perf_counter() - started:.0f} s)", flush=True)

    order = sorted(names, key=COMPILE_ORDER.index)
    first = next(name for name in order if _compiles(name))
    configurations = [_Configuration(first, layers, workdir, warm=False)]
    configurations[0].wait()  # set up, and waiting before its first step
    # every compile after the first finds the first's kernels in the cache
    configurations += [_Configuration(name, layers, workdir, warm=_compiles(name)) for name in order if name != first]
    for configuration in configurations:
        if configuration is not configurations[0]:
            configuration.wait()  # set up
        configuration.tell("go")
        if _compiles(configuration.name):
            configuration.wait()  # compiled, trained its first steps, and waiting
            say(f"{configuration.name}: compiled")
    for configuration in configurations:
        if not _compiles(configuration.name):
            configuration.wait()
    configurations.sort(key=lambda c: names.index(c.name))  # the table's order, eager first
    say(f"the steady steps: windows of {WINDOW}, the configurations taking turns, for about {STEADY_S:.0f} s")
    steady_from, rounds = time.perf_counter(), 0
    while rounds < MIN_ROUNDS or (rounds < MAX_ROUNDS and time.perf_counter() - steady_from < STEADY_S):
        turn = rounds % len(configurations)
        for configuration in configurations[turn:] + configurations[:turn]:
            configuration.tell("go")
            configuration.windows.append(statistics.median(configuration.wait()))
        rounds += 1
    say(f"measured: {rounds} rounds")
    for configuration in configurations:
        configuration.tell("stop")
    return [configuration.result() for configuration in configurations]


def paired_ratio(mine: dict[str, Any], theirs: dict[str, Any]) -> float:
    """How long ``mine``'s steps take against ``theirs``: the median ratio of their windows in the same round."""
    return statistics.median(paired_ratios(mine, theirs))


def paired_ratios(mine: dict[str, Any], theirs: dict[str, Any]) -> list[float]:
    """``mine``'s window against ``theirs``' in the same round, round by round."""
    return [a / b for a, b in zip(mine["windows"], theirs["windows"], strict=True)]


def median_interval(values: list[float]) -> tuple[float, float]:
    """A 95% interval for the median of ``values``, from their order statistics (the sign test's)."""
    n, ordered = len(values), sorted(values)
    half = 0.98 * n**0.5  # 1.96 standard deviations of Binomial(n, 1/2)
    return ordered[max(0, int(n / 2 - half))], ordered[min(n - 1, int(n / 2 + half + 1) - 1)]


def _table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| configuration | first step | steady step | vs eager | final loss | graphs |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        ratio = paired_ratio(r, results[0])
        lines.append(
            f"| {r['name']} | {r['first_step_s']:.1f} s{' (warm)' if r['warm'] else ''}"
            f" | {r['steady_step_ms']:.1f} ms | {ratio:.2f}x"
            f" | {r['final_loss']:.4f} | {r['graphs']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Runs every configuration in its own process and prints the comparison; 0 if they agree with eager."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=2, help="GPT blocks")
    parser.add_argument("--regions", action="store_true", help='also use_compile={"regions": "auto"} (pays with depth)')
    parser.add_argument("--run", choices=list(ALL_PATHS), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:
        args.out.write_text(json.dumps(_run_one(args.run, args.layers)))
        return 0

    started = time.perf_counter()
    names = list(ALL_PATHS if args.regions else PATHS)
    with tempfile.TemporaryDirectory() as workdir:
        results = run_interleaved(names, args.layers, Path(workdir))
    print(f"\nA {args.layers}-layer GPT, Llama-style blocks (width 128, batch 16), under DDP (world size 1) on CPU:\n")
    print(_table(results))
    print(
        f"\nsteady step: the lowest median of {len(results[0]['windows'])} windows of {WINDOW} steps; vs eager: the"
        " median ratio to eager's window in the same round (the windows interleaved; see the docstring)"
    )
    print(
        "Lightning's own path trains the model with its self.log moved after the step (on_train_batch_end): Lightning"
        " 2.6.6 cannot compile a step that calls self.log on torch 2.13; use_compile compiles the step as written."
    )
    by_name = {r["name"]: r for r in results}
    ours, stock = by_name["use_compile=True"], by_name["Lightning: fit(torch.compile(model))"]
    low, high = median_interval(paired_ratios(ours, stock))
    print(
        f"use_compile=True against Lightning's own compiled path, window by window: {paired_ratio(ours, stock):.2f}x"
        f" (95% interval {low:.2f}-{high:.2f}x; they compile the same step)"
    )
    if high - low > 0.2:  # the same step's compiled code, a round apart, differed by more than +-10%
        print(
            f"The machine was busy while the demo measured (load average {os.getloadavg()[0]:.1f} on"
            f" {os.cpu_count()} cores): two configurations that compile the same step differed by more than 10% from"
            " one round to the next, so the steady steps above are not reliable. Rerun it on an idle machine."
        )
    print(COLD_LINE)
    print(GPU_LINE)
    eager_loss = results[0]["final_loss"]
    worst = max(abs(r["final_loss"] - eager_loss) for r in results)
    wrapped = all(r["strategy_model"] == "DistributedDataParallel" for r in results)
    threads = {r["name"]: r["threads"] for r in results if r["threads"] != 1}
    patched = [r["name"] for r in results if r["patched"] != _uses_package(r["name"])]
    print(f"largest final-loss difference to eager: {worst:.2e}; DDP kept its type: {wrapped}")
    if threads:
        print(f"not measured with one torch thread: {threads}")
    if patched:
        print(f"run with the package where it should not, or without it where it should: {patched}")
    if not args.regions:
        print(
            "regional compilation (--regions) pays off with depth: at a few layers it compiles no faster than the"
            " whole model; docs/regions.md and docs/benchmarks.md measure 12 and 24."
        )
    print(f"demo finished in {time.perf_counter() - started:.0f} s")
    return 0 if worst < 5e-2 and wrapped and not threads and not patched else 1


if __name__ == "__main__":
    sys.exit(main())
