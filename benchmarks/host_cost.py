"""The table of docs/benchmarks/host_cost.md: the host's time per training step, where a step is almost all host time.

    python benchmarks/host_cost.py                 # every path 5 rounds, and every default key once
    python benchmarks/host_cost.py --rounds 1 --steps 60 --out /tmp/x   # quick

A tiny MLP (width 64, batch 8, one torch thread), so that a step's kernels take microseconds and what is measured is
Python: the training loop, Lightning's hooks, the compiled code's guards and the package's wrappers. Each path runs in
a fresh process (its own compile, nothing shared), and the paths take turns round by round, so that a change of the
machine's load hits every path alike; a path's figure is the lowest over rounds of its p10 step time (the fastest
tenth of its steps: the host's own cost; another job on the machine only ever adds time). The ratios come from this
one run; differences of a few tens of µs are within the noise of a shared machine (the JSON has every round): on
this 2-core VM, one process's p10 came out anywhere between about 700 and 1,500 µs for the same path.

So each path also counts the Python function calls of a step (``sys.setprofile``, over 20 steps after the timed ones),
which are the same in every run: what the package adds to a step is its own Python, and the calls measure it exactly.

Per key: ``use_compile`` with every one of the package's own keys off but that one, against all of them off; its calls
are exact, so each runs ``--key-rounds`` times (1), and its time is one sample.

The keys' time together is measured where it can be told from the noise: every key off and ``use_compile=True`` taking
turns in one process (``--paired-rounds``, 16), compared round by round and by each path's lowest.

And where that time goes, sampled: where ``py-spy`` is installed (``pip install py-spy``), ``use_compile=True`` and
every key off each run ``--sampled-steps`` steps (4,000) in a fresh process under ``py-spy record`` (2,000 samples a
second, each pausing the process), and each steady sample (in the training loop, not compiling) whose
innermost frame is the package's counts for the file it is in: a feature's module is its key, ``_run.py`` the seam.
Samples are shares of the same steps, so the machine's load cancels. The C++ guard check of the compiled step, run as
the innermost wrapper calls it, counts for that wrapper (the seam's with every key off, ``summary``'s with the
defaults): the difference between the two runs is the keys' own share, guards included.

Lightning's own paths run with the package removed (``lightning_compile_patch.remove()``; ``harness`` imports it):
applied, it also compiles a compiled model passed in without ``use_compile`` again after the wrap, with the features of
its ``INPUT_DEFAULTS``. Each result records whether the patch was applied as its steps ran.
"""

import argparse
import collections
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from harness import RESULTS_DIR, fmt, markdown_table, new_report, ratio, report_header, write_report

WIDTH, BATCH = 64, 8
#: Layers of the MLP before its last ``Linear`` (a ``Linear`` and a ``ReLU`` each); ``guard_check.py`` sets more.
DEPTH = 1


def _keys_off() -> dict[str, Any]:
    from lightning_compile_patch._monkeypatch.feature_defaults import FEATURE_DEFAULTS

    return {key: False for key in FEATURE_DEFAULTS}


def paths() -> dict[str, Optional[dict[str, Any]]]:
    """Each path's name and its ``use_compile`` (``None``: not through ``use_compile``)."""
    off = _keys_off()
    found: dict[str, Optional[dict[str, Any]]] = {
        "plain loop, eager": None,
        "plain loop, `torch.compile`": None,
        "Lightning, eager": None,
        "Lightning, `fit(torch.compile(m))`": None,
        "`use_compile=True`": {},
        "`use_compile`, every own key off": off,
    }
    for key in off:
        found[f"`use_compile`, only `{key}` on"] = {**off, key: True if key != "optimize_ddp" else "auto"}
    return found


def _model() -> Any:
    import torch

    layers = [layer for _ in range(DEPTH) for layer in (torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU())]
    return torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 1))


#: Steps after the timed ones whose Python function calls are counted (a profile function slows them: not timed).
COUNTED_STEPS = 20


class _Calls:
    """Counts the Python function calls made while it is on (``sys.setprofile``): exact, where times are noisy."""

    def __init__(self) -> None:
        self.calls = 0

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            self.calls += 1

    def on(self) -> None:
        sys.setprofile(self._profile)

    def off(self) -> None:
        sys.setprofile(None)


class _NoCalls(_Calls):
    def on(self) -> None:
        pass


def _plain_loop(compiled: bool, steps: int, calls: _Calls) -> list[float]:
    import torch

    model = _model()
    step_model = torch.compile(model) if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [torch.randn(BATCH, WIDTH) for _ in range(16)]
    times = []
    for i in range(steps + COUNTED_STEPS):
        if i == steps:
            calls.on()
        start = time.perf_counter()
        opt.zero_grad()
        loss = step_model(data[i % 16]).pow(2).mean()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
    calls.off()
    return times[:steps]


def _lightning(
    name: str, use_compile: Optional[dict[str, Any]], steps: int, calls: _Calls, callbacks: Sequence[Any] = ()
) -> list[float]:
    import torch

    import lightning_compile_patch  # imported with `harness` already
    from lightning.pytorch import Callback, LightningModule, Trainer

    if use_compile is None:
        # Lightning as it is: applied, the package also compiles a compiled model passed in again after the wrap, with
        # some of its features, and "Lightning, `fit(torch.compile(m))`" would not be Lightning's own path
        lightning_compile_patch.remove()
    elif not lightning_compile_patch.is_applied():  # after a Lightning path in the same process (`run_paired`)
        lightning_compile_patch.apply()

    class Tiny(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _model()

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.net(batch).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(torch.randn(16 * BATCH, WIDTH), batch_size=BATCH)

    class Starts(Callback):  # a step's time: from one batch's start to the next's, the whole loop included
        def __init__(self) -> None:
            self.at: list[float] = []

        def on_train_batch_start(self, *args: Any) -> None:
            self.at.append(time.perf_counter())
            if len(self.at) == steps + 1:  # from this batch's start to the start of the last
                calls.on()
            elif len(self.at) == steps + 1 + COUNTED_STEPS:
                calls.off()

    starts = Starts()
    model = Tiny()
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps + 1 + COUNTED_STEPS,
        **({} if use_compile is None else {"use_compile": use_compile or True}),
        callbacks=[starts, *callbacks],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(torch.compile(model) if "torch.compile(m)" in name else model)
    return [b - a for a, b in zip(starts.at[: steps + 1], starts.at[1 : steps + 1], strict=False)]


def run_one(name: str, steps: int, count_calls: bool = True) -> dict[str, Any]:
    """In this process: ``steps`` steps of the path; the p10 and median of those after the first 5, in µs.

    ``count_calls=False``: no steps with a profile function after them (a sampled run counts every step's samples).
    """
    import torch

    torch.set_num_threads(1)
    use_compile = paths()[name]
    calls = _Calls() if count_calls else _NoCalls()
    if name.startswith("plain loop"):
        times = _plain_loop("compile" in name, steps, calls)
    else:
        times = _lightning(name, use_compile, steps, calls)
    steady = sorted(times[5:])
    import lightning_compile_patch  # imported with `harness`

    patched = lightning_compile_patch.is_applied()
    return {
        "p10_us": 1e6 * steady[len(steady) // 10],
        "median_us": 1e6 * statistics.median(steady),
        "calls": calls.calls / COUNTED_STEPS,
        "patched": patched,
    }


#: The paths that `run_paired` times in turns, in one process.
PAIRED = ("Lightning, `fit(torch.compile(m))`", "`use_compile`, every own key off", "`use_compile=True`")


def run_paired(steps: int, rounds: int) -> list[list[float]]:
    """In this process: each of `PAIRED` in turn, ``rounds`` times; each round's p10 step times, in µs.

    Separate processes differ by far more than these paths do (on this 2-core VM a process runs fast or slow
    throughout, up to 2x); paths that take turns in one process meet the same machine, and each round's ratios cancel
    its speed. One process keeps Dynamo's state from run to run, which is why the table's figures come from fresh
    processes, and these rounds only compare the paths with each other.
    """
    import torch

    torch.set_num_threads(1)
    pairs = []
    for _ in range(rounds):
        pair = []
        for name in PAIRED:
            steady = sorted(_lightning(name, paths()[name], steps, _Calls())[5:])
            pair.append(1e6 * steady[len(steady) // 10])
        pairs.append(pair)
    return pairs


#: The paths whose samples `run_sampled` counts: the keys' own share is the difference between them.
SAMPLED = ("`use_compile=True`", "`use_compile`, every own key off")
#: The training loop's ``run`` in a raw stack (its module's import is not in it).
_IN_LOOP = re.compile(r"(?:^|;)(?:\w+\.)?run \([^;]*loops/training_epoch_loop\.py:\d+\)")
#: Compiling, not a steady step: Dynamo's frame conversion, and inductor's compile (a backward can compile lazily, in
#: the first step's backward, outside Dynamo's frame).
_COMPILING = ("torch/_dynamo/convert_frame.py", "torch/_inductor/compile_fx.py")
_PACKAGE_FILE = re.compile(r"lightning_compile_patch/(?:compile_features/)?(\w+)\.py:\d+\)$")


def sampled_shares(raw: str) -> dict[str, float]:
    """The share of a run's steady samples (``py-spy``'s raw format) whose innermost frame is in each package file.

    Steady: in Lightning's training loop, and not compiling (`_COMPILING`). The total is ``"steps"``.
    """
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if not _IN_LOOP.search(stack) or any(compiling in stack for compiling in _COMPILING):
            continue
        total += int(n)
        found = _PACKAGE_FILE.search(stack.rsplit(";", 1)[-1])
        if found:
            counts[found.group(1)] += int(n)
    return {"steps": float(total), **{name: n / total for name, n in counts.items()}} if total else {}


def run_sampled(name: str, steps: int, workdir: Path) -> Optional[dict[str, float]]:
    """``steps`` steps of the path in a fresh process under ``py-spy record``; `sampled_shares`, or ``None``."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))  # a venv's own
    if spy is None:
        return None
    raw, result = workdir / "samples.txt", workdir / "sampled.json"
    command = [spy, "record", "--rate", "2000", "--format", "raw", "--output", str(raw), "--"]
    command += [sys.executable, __file__, "--run", name, "--steps", str(steps), "--result", str(result), "--sampled"]
    env = {**_env(), "TORCHINDUCTOR_CACHE_DIR": str(workdir / "sampled")}
    done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0 or not raw.exists() or not result.exists():  # py-spy may not attach; the run may fail
        print(f"py-spy could not sample {name}: {done.stderr.strip()[-500:]}", file=sys.stderr, flush=True)
        return None
    return sampled_shares(raw.read_text())


def markdown(data: dict[str, Any]) -> str:
    medians, calls = data["p10_us"], data["calls"]
    stock, plain = medians["Lightning, eager"], medians["plain loop, `torch.compile`"]
    stock_compiled, ours = medians["Lightning, `fit(torch.compile(m))`"], medians["`use_compile=True`"]
    off = medians["`use_compile`, every own key off"]
    rows = []
    for name, value in medians.items():
        if name.startswith("`use_compile`, only"):
            continue
        rows.append([name, fmt(value, ".0f"), fmt(ratio(value, stock), ".2f", "x"), fmt(calls[name], ".0f")])
    off_calls = calls["`use_compile`, every own key off"]
    keys = [[name.split("`")[3], fmt(calls[name] - off_calls, "+.0f")] for name in medians if "only" in name]
    own, own_calls = ours - off, calls["`use_compile=True`"] - off_calls
    loop_calls = calls["Lightning, eager"] - calls["plain loop, eager"]
    return "\n\n".join(
        [
            report_header("Host cost per training step: a tiny MLP, where a step is almost all host time", data),
            f"An MLP of width {WIDTH}, batch {BATCH}, SGD, one torch thread, CPU, inductor. Each path in a fresh"
            f" process, {data['rounds']} rounds taking turns; each figure is the lowest over rounds of the path's p10"
            f" step time over {data['steps']} steps (the first 5 left out). A Lightning step is timed from one"
            " batch's start to the next: the whole loop. Lightning's eager and `fit(torch.compile(m))` paths run"
            " Lightning as it is, with the package removed. The Python calls per step are counted over"
            f" {COUNTED_STEPS} steps after the timed ones; they are the same in every round.",
            markdown_table(("path", "µs per step (p10)", "vs Lightning eager", "Python calls per step"), rows),
            f"`use_compile=True` against Lightning's own compiled path: {fmt(ratio(ours, stock_compiled), '.2f', 'x')};"
            f" against the plain compiled loop: {fmt(ours - plain, '+.0f')} µs.",
            "The package's own keys, every one of them on against all off: in Python calls, which do not vary from"
            f" run to run, {fmt(own_calls, '+.0f')} calls per step, {fmt(100 * own_calls / loop_calls, '.1f')}% of"
            f" the {fmt(loop_calls, '.0f')} that Lightning's loop adds to the plain eager loop. In the table's times,"
            f" {fmt(own, '+.0f')} µs, {fmt(100 * own / (stock - medians['plain loop, eager']), '.1f')}% of what the"
            " loop adds; but that difference comes from separate processes, which differ by more than that (the"
            " JSON has every round), so the paired figure below is the one to go by.",
            "What each default key costs on its own, in Python calls per step (only that key on, against every key"
            " off; each key's time in the JSON is one sample in a process of its own, which tells nothing at this"
            " size):",
            markdown_table(("key", "Python calls per step"), keys),
            _paired_markdown(data, stock - medians["plain loop, eager"]),
            _sampled_markdown(data, stock - medians["plain loop, eager"]),
        ]
    )


def _sampled_markdown(data: dict[str, Any], loop_us: float) -> str:
    sampled = data.get("sampled") or {}
    if not all(sampled.get(name) for name in SAMPLED):
        return "Where the time goes, sampled: not measured (`pip install py-spy` to measure it, where it can attach)."
    ours, off = (sampled[name] for name in SAMPLED)
    step = data["p10_us"][SAMPLED[0]]
    files = sorted({*ours, *off} - {"steps"}, key=lambda name: -ours.get(name, 0.0))
    rows = [[f"`{name}.py`", *(fmt(100 * run.get(name, 0.0), ".2f", "%") for run in (ours, off))] for name in files]
    own = sum(v for k, v in ours.items() if k != "steps") - sum(v for k, v in off.items() if k != "steps")
    return "\n\n".join(
        [
            f"Where the time goes, sampled (`py-spy`, 2,000 samples a second, {data['sampled_steps']} steps of each"
            f" path in a fresh process; {fmt(ours['steps'], '.0f')} and {fmt(off['steps'], '.0f')} steady samples):"
            " the share of the steady samples whose innermost frame is in each of the package's files. The compiled"
            " step's guard check counts for the innermost wrapper that calls it (`summary.py` with the defaults,"
            " `_run.py`, the seam, with every key off):",
            markdown_table(("file", "`use_compile=True`", "every own key off"), rows),
            f"The keys' own share, guards included: {fmt(100 * own, '.2f')}% of a step, {fmt(own * step, '+.0f')} µs"
            f" at the table's `use_compile=True` step, {fmt(100 * own * step / loop_us, '.1f')}% of what Lightning's"
            " loop adds to the plain eager loop.",
        ]
    )


def _paired_markdown(data: dict[str, Any], loop_us: float) -> str:
    stock, off, ours = (list(column) for column in zip(*data["paired_us"], strict=True))

    def ratios(a: list[float], b: list[float]) -> list[str]:
        found = sorted(x / y for x, y in zip(a, b, strict=True))
        by_round = f"{fmt(statistics.median(found), '.3f')} ({fmt(found[0], '.3f')} to {fmt(found[-1], '.3f')})"
        return [by_round, fmt(min(a) / min(b), ".3f")]

    own = statistics.median(x / y for x, y in zip(ours, off, strict=True)) - 1
    own_us = own * data["p10_us"][PAIRED[1]]
    return "\n\n".join(
        [
            "The paths' times, measured where they can be told apart: Lightning's own compiled path, every key off and"
            f" `use_compile=True` taking turns in one process, {len(ours)} rounds of {data['steps']} steps. Each ratio"
            " within its round (median, and the lowest to the highest), and the ratio of each path's lowest p10 over"
            " the rounds (the machine's load only ever adds time; a round in which it changed speed moves the first"
            " column, not this one):",
            markdown_table(
                ("ratio", "paired by round", "of the lowest"),
                [
                    ["`use_compile=True` / Lightning's own `fit(torch.compile(m))`", *ratios(ours, stock)],
                    ["`use_compile=True` / every own key off", *ratios(ours, off)],
                    ["every own key off / Lightning's own `fit(torch.compile(m))`", *ratios(off, stock)],
                ],
            ),
            f"The keys' share: at the table's step time with every key off, {fmt(own_us, '+.0f')} µs per step,"
            f" {fmt(100 * own_us / loop_us, '.1f')}% of what Lightning's loop adds to the plain eager loop.",
        ]
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--key-rounds", type=int, default=1)
    parser.add_argument("--paired-rounds", type=int, default=16)
    parser.add_argument("--steps", type=int, default=225)
    parser.add_argument("--sampled-steps", type=int, default=4000)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--run-paired", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sampled", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:
        args.result.write_text(json.dumps(run_one(args.run, args.steps, count_calls=not args.sampled)))
        return 0
    if args.run_paired:
        args.result.write_text(json.dumps(run_paired(args.steps, args.paired_rounds)))
        return 0
    rounds = {"rounds": args.rounds, "key_rounds": args.key_rounds, "paired_rounds": args.paired_rounds}
    rounds["sampled_steps"] = args.sampled_steps
    data = new_report("host_cost", argv, **rounds, steps=args.steps, threads=1)
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in paths()}
    with tempfile.TemporaryDirectory() as workdir:
        for round_ in range(args.rounds):
            for name in samples:
                if "only" in name and round_ >= args.key_rounds:
                    continue
                result = Path(workdir) / "result.json"
                env_dir = Path(workdir) / f"inductor-{round_}"  # one cache a round: the same kernels, compiled once
                command = [sys.executable, __file__, "--run", name, "--steps", str(args.steps), "--result", str(result)]
                subprocess.run(command, check=True, env={**_env(), "TORCHINDUCTOR_CACHE_DIR": str(env_dir)})
                samples[name].append(json.loads(result.read_text()))
                if name.startswith("Lightning") and samples[name][-1]["patched"]:
                    raise RuntimeError(f"{name!r} ran with the package applied, not as Lightning is")
                print(f"round {round_ + 1}: {name}: {samples[name][-1]['p10_us']:.0f} µs", flush=True)
        result = Path(workdir) / "paired.json"
        command = [sys.executable, __file__, "--run-paired", "--steps", str(args.steps), "--result", str(result)]
        command += ["--paired-rounds", str(args.paired_rounds)]
        subprocess.run(command, check=True, env={**_env(), "TORCHINDUCTOR_CACHE_DIR": str(Path(workdir) / "paired")})
        paired = json.loads(result.read_text())
        print(f"paired: {paired}", flush=True)
        sampled = {name: run_sampled(name, args.sampled_steps, Path(workdir)) for name in SAMPLED}
        print(f"sampled: {sampled}", flush=True)
    p10 = {name: min(s["p10_us"] for s in values) for name, values in samples.items()}  # load only adds time
    calls = {name: statistics.median(s["calls"] for s in values) for name, values in samples.items()}
    data.update(samples=samples, p10_us=p10, calls=calls, paired_us=paired, sampled=sampled)
    write_report(args.out, data, markdown(data))
    print(markdown(data))
    return 0


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}


if __name__ == "__main__":
    sys.exit(main())
