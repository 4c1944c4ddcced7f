"""The table of docs/benchmarks/guard_check.md: the compiled step's guard check, by the model's depth and by key.

    python benchmarks/guard_check.py
    python benchmarks/guard_check.py --depths 1 4 --checks 2000 --out /tmp/x   # quick

Before each call of a compiled step, Dynamo checks the step's guards, in C++: that what its graph was compiled for
still holds. It is host time on every step, which ``host_cost.py``'s samples count for the wrapper that calls the
step, and it grows with the model. A key that changes the model adds guards: ``in_parts`` gives each module that holds
parameters a ``forward`` of its own, which Dynamo guards (the method's code, that its ``self`` is the module, the
class's ``forward``). ``host_cost.py``'s MLP has two such modules, too few to tell this from noise.

So this script times the guard check alone: ``host_cost.py``'s MLP with ``--depths`` layers (a ``Linear`` and a
``ReLU`` each, then the last ``Linear``), Lightning's own ``fit(torch.compile(m))``, ``use_compile`` with every key
off, with only ``in_parts`` on, and with the defaults. At step 50 of each run, the guards of the entry of
``training_step``'s code that ran last are checked ``--checks`` times against the module and batch of that step; the
figure is the median over 5 repeats, in µs. Each depth runs in a fresh process (Dynamo counts recompiles per code
object). Checking guards is deterministic work on a fixed object graph, so one process's figures compare with each
other; another job on the machine moves all of them.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import host_cost
from harness import RESULTS_DIR, fmt, markdown_table, new_report, report_header, write_report

#: Each path's name and its ``use_compile`` (``None``: Lightning's own compile, the package removed).
PATHS: dict[str, Optional[dict[str, Any]]] = {
    "Lightning's own `fit(torch.compile(m))`": None,
    "`use_compile`, every own key off": host_cost._keys_off(),
    "`use_compile`, only `in_parts` on": {**host_cost._keys_off(), "in_parts": True},
    "`use_compile=True`": {},
}
AT_STEP = 50


def _guard_timer(checks: int, found: list[float]) -> Any:
    """A callback that times the guard check of the step's compiled code once, at step `AT_STEP`."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from lightning.pytorch import Callback

    class GuardTimer(Callback):
        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if trainer.global_step != AT_STEP:
                return
            entries = _debug_get_cache_entry_list(type(module).training_step.__code__)
            guards = entries[0].guard_manager  # the entry that ran last comes first
            frame_locals = {"self": module, "batch": batch, "batch_idx": batch_idx}
            if not guards.check(frame_locals):
                raise RuntimeError("the step's guards fail on its own module and batch: not the entry that ran")
            repeats = []
            for _ in range(5):
                start = time.perf_counter()
                for _ in range(checks):
                    guards.check(frame_locals)
                repeats.append(1e6 * (time.perf_counter() - start) / checks)
            found.append(statistics.median(repeats))

    return GuardTimer()


def run_depth(depth: int, checks: int) -> dict[str, float]:
    """In this process: each path at ``depth``, one after the other; the guard check of each, in µs."""
    import torch

    torch.set_num_threads(1)
    host_cost.DEPTH = depth
    result = {}
    for name, use_compile in PATHS.items():
        found: list[float] = []
        host_cost._lightning(name, use_compile, AT_STEP + 5, host_cost._NoCalls(), [_guard_timer(checks, found)])
        result[name] = found[0]
    return result


def markdown(data: dict[str, Any]) -> str:
    names = list(PATHS)
    rows = []
    for depth, found in data["guard_us"].items():
        parts = int(depth) + 1  # the modules `in_parts` compiles: every `Linear`
        per_part = (found[names[2]] - found[names[1]]) / parts
        rows.append([depth, parts, *(fmt(found[name], ".2f") for name in names), fmt(per_part, "+.2f")])
    headers = ("layers", "`Linear`s", *names, "`in_parts` per `Linear`")
    return "\n\n".join(
        [
            report_header("The compiled step's guard check, by the model's depth and by key", data),
            "µs per check of the guards of `training_step`'s compiled code, at step 50 of each run (median of 5"
            f" repeats of {data['checks']} checks): the host-cost MLP (width {host_cost.WIDTH}, batch"
            f" {host_cost.BATCH}) with more layers, each depth in a fresh process. Dynamo runs this check before every"
            " call of the compiled step. The last column: what `in_parts` adds to it per module it compiles, against"
            " every key off.",
            markdown_table(headers, rows),
        ]
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 10, 40])
    parser.add_argument("--checks", type=int, default=20000)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--run", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run is not None:
        args.result.write_text(json.dumps(run_depth(args.run, args.checks)))
        return 0
    data = new_report("guard_check", argv, checks=args.checks, guard_us={})
    with tempfile.TemporaryDirectory() as workdir:
        for depth in args.depths:
            result = Path(workdir) / "result.json"
            command = [sys.executable, __file__, "--run", str(depth), "--checks", str(args.checks)]
            env = {**host_cost._env(), "TORCHINDUCTOR_CACHE_DIR": str(Path(workdir) / "inductor")}
            subprocess.run([*command, "--result", str(result)], check=True, env=env)
            data["guard_us"][str(depth)] = json.loads(result.read_text())
            print(f"{depth} layers: {data['guard_us'][str(depth)]}", flush=True)
    write_report(args.out, data, markdown(data))
    print(markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
