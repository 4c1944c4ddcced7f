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
Lightning's own path, compiling the same step after it, finds its kernels compiled: its first step is marked *(warm)*,
and is not a cold-start figure. In a new environment the cold compile also builds inductor's precompiled headers, which
torch keeps outside the cache (``/tmp/torchinductor_<user>/precompiled_headers``): ``use_compile``'s first step took 22
to 33 s with them to build, 16 s with them built. Compiling the two side by side instead took as long on an idle 2-core
machine (the demo's own time 55 s, against 49 to 54 s one at a time, from a fresh environment) and 95 and 99 s against
101 and 107 beside the project's test suite, with Lightning's first step then neither cold nor warm.

A step is one turn of Lightning's training loop, timed from one batch's ``on_train_batch_start`` to the next's: the
step, the backward, the optimizer, the dataloader and every hook, the module's ``on_train_batch_end`` (where
Lightning's own path logs) included. A timer that stopped at the callbacks' ``on_train_batch_end`` missed that hook,
which runs after the callbacks': Lightning's path's ``self.log`` (0.7 ms a step, measured with ``torch.profiler``) went
untimed, and ``use_compile``'s, replayed inside the step, was timed, so ``use_compile`` read 3% slower than the same
compiled code.

The steady steps are measured in CPU time (``time.process_time``, every thread of the process), not wall time: another
job on the machine adds to a step's wall time whenever the OS runs it instead, but not to the CPU time the step itself
used. Beside the project's test suite, the wall-time ratio of the two configurations that run the same compiled code
had a 95% interval of 0.83 to 1.25; their CPU time does not count the other job's turns. The first step is wall time:
it is what a user waits for.

They are measured interleaved: once every configuration has compiled and trained its first steps, its process waits,
and the processes then take turns, one step each (a window of ``WINDOW`` steps), round after round for about 5 seconds
(at least 20 rounds). The machine drifts, even in CPU time (on this project's shared VM, every configuration's step
took 70% longer at the end of one idle 5-second measurement than at its start), and it drifts alike for the
configurations within a round, which lasts a fraction of a second. So each configuration's ratio to eager is the
median, over the rounds, of its window's median against eager's window median in the same round; and its steady step is
its least disturbed window (the lowest window median). The rounds rotate which configuration goes first, and run for a
time rather than a count so that a loaded machine, where a step can take ten times as long, does not stretch the demo.

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
WINDOW, MIN_ROUNDS, MAX_ROUNDS, STEADY_S = 1, 20, 120, 5.0
STEPS = WARMUP_STEPS + MAX_ROUNDS * WINDOW + 1
#: The GPT's width and batch (``--layers`` sets its depth). At 64 wide and batch 32 an eager step takes 45 to 50 ms,
#: against 65 to 70 at 128 wide and batch 16, so the steady window holds more rounds; Lightning's path, compiling from
#: ``use_compile``'s cache, took 3 s against 10; and compiling gains as much at both (0.83x and 0.86x eager's step time
#: in a plain loop, the two taking turns in one process).
MODEL = {"n_embd": 64, "batch_size": 32, "block": "llama"}


def step_timer() -> Any:
    """The callback that times each turn of the loop (it imports Lightning: made only in a configuration's process)."""
    import torch

    from lightning.pytorch import Callback, Trainer

    class Windows(Callback):
        """Times each turn of the loop, from one batch's start to the next's.

        Before step 0, after the first steps and after every window, it reports the window's CPU times on stdout and
        waits for a word on stdin.

        """

        def __init__(self) -> None:
            self.wall: list[float] = []  # each step's wall time (the first step's is reported)
            self.cpu: list[float] = []  # and its CPU time (the steady steps are compared in it)
            self.model_type = ""
            self.threads = 0
            self._start: tuple[float, float] | None = None

        def on_train_batch_start(self, trainer: Trainer, *args: Any) -> int | None:
            if self._start is not None:  # the step before this one has run all its hooks
                self.wall.append(time.perf_counter() - self._start[0])
                self.cpu.append(time.process_time() - self._start[1])
            step = len(self.cpu)
            if step == 0 or (step >= WARMUP_STEPS and (step - WARMUP_STEPS) % WINDOW == 0):
                done = step > WARMUP_STEPS  # none yet: set up, or compiled
                window = {"window": self.cpu[-WINDOW:] if done else [], "wall": self.wall[-WINDOW:] if done else []}
                print(json.dumps(window), flush=True)
                if sys.stdin.readline().strip() == "stop":
                    trainer.should_stop = True
                    return -1  # Lightning's word for: no more steps in this epoch
            self.model_type = type(trainer.strategy.model).__name__
            self.threads = torch.get_num_threads()
            self._start = time.perf_counter(), time.process_time()
            return None

    return Windows()


def _run_one(name: str, layers: int) -> dict[str, Any]:
    """Trains in this process: each time it reads ``go`` from stdin, the next steps (the first ones, then a window)."""
    import torch
    from gpt import GPTConfig, GPTModule, LogOutsideStepGPT  # beside this file

    path = ALL_PATHS[name]
    if _uses_package(name):
        # Only here: once imported, the package also handles a compiled model passed in without `use_compile` (it
        # compiles its steps again after the wrap, with some of its features), which is then not Lightning's own path.
        import lightning_compile_patch  # noqa: F401  # Trainer(use_compile=...)
    from lightning.pytorch import Trainer

    torch.manual_seed(0)
    windows = step_timer()
    use_compile = {} if path["use_compile"] is None else {"use_compile": path["use_compile"]}
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        strategy="ddp",
        max_steps=STEPS,  # stopped by the word "stop" before this
        limit_val_batches=0,
        callbacks=[windows],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **use_compile,
    )
    module = GPTModule if path.get("log_in_step", True) else LogOutsideStepGPT
    # one epoch holds every step: no epoch's end (its hooks, a new dataloader iterator) inside a timed step
    model = module(GPTConfig(n_layer=layers, **MODEL, samples=MODEL["batch_size"] * STEPS))
    trainer.fit(torch.compile(model) if path["compile_model"] else model)
    return {
        "name": name,
        "first_step_s": windows.wall[0],
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
        self.waits: list[float] = []  # each steady step's wall time against its CPU time

    def wait(self) -> list[float]:
        """Waits until the process reports (set up, compiled, or a window done), and returns the window's CPU times."""
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith('{"window"'):
                report = json.loads(line)
                self.waits += [wall / cpu for wall, cpu in zip(report["wall"], report["window"], strict=True)]
                return report["window"]
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
        measured["wall_per_cpu"] = statistics.median(self.waits)
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


def verdict(ratios: list[float]) -> str:
    """The median of same-round ratios, its 95% interval, and what it says: faster, slower, or no difference."""
    ratio, (low, high) = statistics.median(ratios), median_interval(ratios)
    said = "faster" if high < 1 else "slower" if low > 1 else "no difference measured (the interval holds 1.00x)"
    return f"{ratio:.2f}x its step time (95% interval {low:.2f}-{high:.2f}x): {said}"


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
        # The run has ended (Lightning tore DDP down in `fit`) and its results are written: the interpreter's own
        # teardown (torch's exit handlers, inductor's compile workers) took 2 s idle and 5 s beside the test suite, with
        # the demo waiting for every process. `os._exit` leaves that out; the compile workers exit as their pipe closes.
        sys.stdout.flush()
        os._exit(0)

    started = time.perf_counter()
    names = list(ALL_PATHS if args.regions else PATHS)
    with tempfile.TemporaryDirectory() as workdir:
        results = run_interleaved(names, args.layers, Path(workdir))
    width, batch = MODEL["n_embd"], MODEL["batch_size"]
    shape = f"width {width}, batch {batch}"
    print(f"\nA {args.layers}-layer GPT, Llama-style blocks ({shape}), under DDP (world size 1) on CPU:\n")
    print(_table(results))
    print(
        f"\nsteady step: the CPU time of a turn of the training loop (batch start to batch start, its hooks and logging"
        f" included), the lowest median of {len(results[0]['windows'])} windows of {WINDOW} steps; vs eager: the"
        " median ratio to eager's window in the same round (the windows interleaved; see the docstring). CPU time, as"
        " another job on the machine adds to a step's wall time but not to the CPU time it uses."
    )
    print(
        "Lightning's own path trains the model with its self.log moved after the step (on_train_batch_end): Lightning"
        " 2.6.6 cannot compile a step that calls self.log on torch 2.13; use_compile compiles the step as written."
    )
    by_name = {r["name"]: r for r in results}
    ours = by_name["use_compile=True"]
    for theirs, why in ((results[0], ""), (by_name["Lightning: fit(torch.compile(model))"], "; they compile one step")):
        print(f"use_compile=True against {theirs['name']}: {verdict(paired_ratios(ours, theirs))}{why}")
    waited = statistics.median(r["wall_per_cpu"] for r in results)
    if waited > 1.1:  # another job ran while the demo's steps did
        print(
            f"The machine was busy while the demo ran: a steady step's wall time was {waited:.2f}x its CPU time. The"
            " first steps took longer; the steady steps are compared in CPU time, which the other job does not add to."
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
