"""Runs Lightning's own tests stock, with this package imported, and compiled, and writes one table comparing them.

    python tools/lightning_suite/run.py --selection ci --out .work/suite               # stock, imported, compiled
    python tools/lightning_suite/run.py --selection issue --modes stock,compiled,regions
    python tools/lightning_suite/run.py --selection full --out .work/full -- --maxfail=500   # after --: to pytest

The tests come from ``LCP_LIGHTNING_TESTS`` (or ``--tests``): Lightning's ``tests/tests_pytorch`` with its
``pyproject.toml``, as the archive in ``../shared/lightning-tests/`` or a clone of Lightning at the tag. They are copied
to ``OUT/tree`` (for ``--flavour pytorch_lightning`` with their imports rewritten the way Lightning's build derives
``pytorch_lightning``) and run the way Lightning's CI runs them: ``cd tests && python -m pytest tests_pytorch/...``
with Lightning's pytest options, plus ``-p lightning_suite.plugin`` (see ``plugin.py``) which sets the mode and records
each test's outcome and what its runs compiled.

The exit status is 1 when a test fails (or errors) in a mode where it passes stock and ``expected_failures.txt`` does
not list it, or when a test listed there for a mode ran in it and did not newly fail (the list stays reviewed); 2 when
pytest itself could not run a mode.
"""

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
DEFAULT_TESTS = ROOT.parent / "shared" / "lightning-tests" / "lightning-2.6.5-tests.tar.gz"
EXPECTED = HERE / "expected_failures.txt"

#: The modes: name -> (``LCP_SUITE_MODE``, ``LCP_SUITE_COMPILE`` or None). ``NAME=JSON`` on the command line adds one.
MODES: dict[str, tuple[str, Optional[str]]] = {
    "stock": ("stock", None),
    "imported": ("imported", None),
    "false": ("compiled", "false"),
    "compiled": ("compiled", '{"backend": "aot_eager"}'),
    # as users run it: one long process per worker, Dynamo's caches and budgets kept from test to test
    "compiled_no_reset": ("compiled", '{"backend": "aot_eager"}'),
    "regions": ("compiled", '{"backend": "aot_eager", "regions": "auto"}'),
    "inductor": ("compiled", "true"),
}

#: Folders and files under ``tests/`` (and pytest options). ``full``: all of these folders that runs on CPU (the rest
#: skips).
SELECTIONS: dict[str, tuple[str, ...]] = {
    "issue": (
        "tests_pytorch/models/test_hooks.py",
        "tests_pytorch/trainer/logging_",
        "tests_pytorch/trainer/optimization",
        "tests_pytorch/loops",
        "tests_pytorch/checkpointing/test_model_checkpoint.py",
        "tests_pytorch/callbacks/test_early_stopping.py",
        "tests_pytorch/models/test_restore.py",
        "tests_pytorch/core/test_lightning_module.py",
        "tests_pytorch/core/test_lightning_optimizer.py",
    ),
    "full": (
        *(
            f"tests_pytorch/{folder}"
            for folder in (
                "loops",
                "trainer",
                "models",
                "callbacks",
                "checkpointing",
                "core",
                "tuner",
                "profilers",
                "loggers",
                "strategies",
            )
        ),
        # onnxruntime is not a test requirement here; the legacy checkpoints are not in the archive
        "--ignore=tests_pytorch/models/test_onnx.py",
        "--ignore=tests_pytorch/checkpointing/test_legacy_checkpoints.py",
    ),
}
#: About 1,050 tests for CI: the issue's selection without its two slowest files compiled (``test_early_stopping.py``:
#: ddp_spawn fits that compile in each spawned process, and a torchmetrics model that recompiles each step;
#: ``test_lightning_module.py``: toggling 3 optimizers recompiles each step), with the Trainer's connectors and flags
#: (cheap, many Trainer arguments) and the learning-rate finder (the tuner's runs).
SELECTIONS["ci"] = (
    *(p for p in SELECTIONS["issue"] if not p.endswith(("test_early_stopping.py", "test_lightning_module.py"))),
    "tests_pytorch/trainer/connectors",
    "tests_pytorch/trainer/flags",
    "tests_pytorch/tuner/test_lr_finder.py",
)
#: Past Lightning's own options: no cache folder in the tree, plain output, every test's outcome.
PYTEST_ARGS = ("-p", "lightning_suite.plugin", "-p", "no:cacheprovider", "--color=no", "-q", "-rN")
FAILED = ("failed", "error")


@dataclass
class Comparison:
    """One mode's outcomes against stock's, by test."""

    passes_both: list[str] = field(default_factory=list)
    fails_both: list[str] = field(default_factory=list)
    new_failures: list[str] = field(default_factory=list)
    expected: list[str] = field(default_factory=list)
    new_passes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    #: Passed or skipped in this mode, where stock ran only the tests that failed elsewhere (``--stock-where-failed``).
    stock_not_run: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)


def find_tree(source: Path, work: Path) -> Path:
    """The folder that holds ``tests/tests_pytorch`` and ``pyproject.toml``, unpacked from ``source`` if an archive."""
    if source.is_file():
        unpacked = work / "unpacked"
        shutil.rmtree(unpacked, ignore_errors=True)
        with tarfile.open(source) as archive:
            archive.extractall(unpacked, filter="data")
        source = unpacked
    found = [
        p.parent.parent for p in source.glob("**/tests/tests_pytorch") if (p.parent.parent / "pyproject.toml").exists()
    ]
    if not found:
        raise SystemExit(f"no tests/tests_pytorch beside a pyproject.toml under {source}")
    return min(found, key=lambda p: len(p.parts))


def prepare_tree(source: Path, work: Path, flavour: str) -> Path:
    """A copy of Lightning's tests in ``work/tree``, imports rewritten for ``pytorch_lightning`` if asked."""
    origin = find_tree(source, work)
    tree = work / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(origin / "tests" / "tests_pytorch", tree / "tests" / "tests_pytorch")
    shutil.copy2(origin / "pyproject.toml", tree / "pyproject.toml")
    shutil.rmtree(work / "unpacked", ignore_errors=True)
    if flavour == "pytorch_lightning":  # as Lightning's `.actions/assistant.py` derives the standalone package
        for path in (tree / "tests").rglob("*.py"):
            text = path.read_text()
            text = re.sub(r"\blightning\.pytorch\b", "pytorch_lightning", text)
            text = re.sub(r"\blightning\.fabric\b", "lightning_fabric", text)
            text = re.sub(r"\blightning/pytorch\b", "pytorch_lightning", text)
            path.write_text(text)
    return tree


def run_mode(
    name: str, tree: Path, work: Path, args: argparse.Namespace, extra: list[str], only: Optional[list[str]] = None
) -> dict[str, Any]:
    """Runs the selection in one mode (or only the tests ``only`` names); returns its exit code and seconds."""
    mode, value = MODES[name]
    records = work / "records" / name
    shutil.rmtree(records, ignore_errors=True)
    records.mkdir(parents=True)
    if only is not None and not only:
        print(f"[lightning_suite] {name}: no test to run", flush=True)
        return {"exit": 0, "seconds": 0.0}
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")])),
        "LCP_SUITE_MODE": mode,
        "LCP_SUITE_TARGET": args.target,
        "LCP_SUITE_FLAVOUR": args.flavour,
        "LCP_SUITE_RECORDS": str(records),
    }
    if value is not None:
        env["LCP_SUITE_COMPILE"] = value
    if name.endswith("_no_reset"):
        env["LCP_SUITE_DYNAMO_RESET"] = "0"
    workers = ("-n", args.workers) if args.workers != "0" else ()
    timeout = (f"--timeout={args.timeout}",) if args.timeout else ()
    selection = SELECTIONS.get(args.selection, tuple(args.selection.split(","))) if only is None else tuple(only)
    command = [sys.executable, "-m", "pytest", *PYTEST_ARGS, *workers, *timeout, *extra, *selection]
    print(f"[lightning_suite] {name}: {' '.join(command)}", flush=True)
    start = time.monotonic()
    with (work / f"{name}.log").open("w") as log:
        code = subprocess.run(command, cwd=tree / "tests", env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    seconds = time.monotonic() - start
    print(f"[lightning_suite] {name}: exit {code} in {seconds:.0f} s (log: {work / f'{name}.log'})", flush=True)
    return {"exit": code, "seconds": seconds}


def load_records(folder: Path) -> dict[str, dict[str, Any]]:
    """Each test's record: from the process that ran it, else (a crashed worker) from xdist's controller."""
    tests: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.jsonl"), key=lambda p: p.name.startswith("controller")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            tests.setdefault(record["nodeid"], record)
    return tests


def load_expected(path: Path) -> dict[tuple[str, str], str]:
    """``expected_failures.txt``: ``MODES NODEID  # reason`` per line, MODES a comma list or ``*``; -> reason."""
    expected = {}
    if not path.exists():
        return expected
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        entry, _, reason = line.partition("  # ")
        modes, _, nodeid = entry.strip().partition(" ")
        for mode in modes.split(","):
            expected[(mode, nodeid.strip())] = reason.strip()
    return expected


def expected_reason(expected: dict[tuple[str, str], str], mode: str, nodeid: str) -> Optional[str]:
    """Why ``nodeid`` is expected to fail in ``mode``; None if it is not."""
    return expected.get((mode, nodeid), expected.get(("*", nodeid)))


def compare(
    base: dict[str, dict],
    other: dict[str, dict],
    mode: str,
    expected: dict[tuple[str, str], str],
    stock_where_failed: bool = False,
) -> Comparison:
    """Sorts the tests by their outcome in ``other`` against ``base`` (stock, or its run of ``failed_elsewhere``)."""
    result = Comparison()
    for nodeid in sorted(base.keys() | other.keys()):
        if stock_where_failed and nodeid not in base and other[nodeid]["outcome"] not in FAILED:
            result.stock_not_run.append(nodeid)
            continue
        if nodeid not in base or nodeid not in other:
            result.missing.append(nodeid)
            continue
        was, now = base[nodeid]["outcome"], other[nodeid]["outcome"]
        listed = expected_reason(expected, mode, nodeid) is not None
        if now in FAILED and was not in FAILED:
            (result.expected if listed else result.new_failures).append(nodeid)
            continue
        if listed:
            result.stale.append(nodeid)
        if now in FAILED:
            result.fails_both.append(nodeid)
        elif was in FAILED and now == "passed":
            result.new_passes.append(nodeid)
        elif now == was == "passed":
            result.passes_both.append(nodeid)
        else:
            result.skipped.append(nodeid)
    return result


def failed_elsewhere(work: Path, names: list[str], expected: dict[tuple[str, str], str]) -> list[str]:
    """The tests that failed in a mode other than stock, or that ``expected_failures.txt`` lists for one it ran.

    Only these need stock's outcome: a test that passed compiled is no new failure, whatever stock does.

    """
    ran = {name: load_records(work / "records" / name) for name in names if name != "stock"}
    ids = {nodeid for tests in ran.values() for nodeid, record in tests.items() if record["outcome"] in FAILED}
    for mode, nodeid in expected:
        if any(nodeid in tests for name, tests in ran.items() if mode in (name, "*")):
            ids.add(nodeid)
    return sorted(nodeid.removeprefix("tests/") for nodeid in ids)  # pytest runs in tests/, the ids are from its parent


def cell(text: Any) -> str:
    """``text`` fit for a table cell, paths shortened to their package or test file."""
    text = re.sub(r"\S*/(site-packages|tree/tests)/", "", str(text))
    return text.replace("|", "\\|").replace("\n", " ")


def signature(error: Optional[str]) -> str:
    """An error's first line without what varies per test (the model's class, numbers), to group failures by."""
    text = re.sub(r"\b[\w<>.]+\.(?=\w+\(\))", "", error or "(no error)")  # `test.<locals>.Model.training_step()`
    return re.sub(r"\d+|\bNone\b", "N", text)[:160]


def steps(counts: Counter) -> str:
    """Step counts by kind, in words."""
    return ", ".join(f"{kind} {counts[kind]}" for kind in sorted(counts)) or "0"


def runs_section(name: str, tests: dict[str, dict], limit: Optional[int]) -> list[str]:
    """What the runs of one mode compiled: totals, causes of eager steps, recompile-limit hits, and the tests with
    eager steps (the ``limit`` with the most).
    """
    runs = [run for record in tests.values() for run in record["runs"]]
    summarized = [run for run in runs if run["compiled"]]
    compiled, parts, eager, causes, cause_tests, hits = Counter(), Counter(), Counter(), Counter(), Counter(), Counter()
    eager_tests = []
    for nodeid, record in tests.items():
        mine = Counter()
        for run in record["runs"]:
            if not run["compiled"]:
                continue
            compiled.update(run["compiled_steps"])
            parts.update(run.get("parts_steps", {}))
            eager.update(run["eager_steps"])
            mine.update(run["eager_steps"])
            causes.update(run.get("eager_causes", {}))
            cause_tests.update(set(run.get("eager_causes", {})))
            hits.update(run["recompile_limit_hits"])
        if mine:
            eager_tests.append((sum(mine.values()), nodeid, record))
    recompiles = sum(run["recompiles"] for run in summarized)
    limit_hits = sum(len(run["recompile_limit_hits"]) for run in summarized)
    lines = [
        f"### Runs in `{name}`",
        "",
        "| runs (fit/validate/test/predict) | with a compile summary | steps compiled | steps in parts | steps eager"
        " | recompiles | recompile-limit hits | tests with eager steps |",
        "|---|---|---|---|---|---|---|---|",
        f"| {len(runs)} | {len(summarized)} | {steps(compiled)} | {steps(parts)} | {steps(eager)} | {recompiles}"
        f" | {limit_hits} | {len(eager_tests)} |",
        "",
    ]
    if causes:
        lines += ["| cause of eager steps | steps | tests |", "|---|---|---|"]
        lines += [f"| {cell(cause)} | {n} | {cause_tests[cause]} |" for cause, n in causes.most_common()]
        lines.append("")
    if hits:
        lines += ["| recompile limit hit at | runs |", "|---|---|"]
        lines += [f"| {cell(frame)} | {n} |" for frame, n in hits.most_common()]
        lines.append("")
    if eager_tests:
        shown = sorted(eager_tests, key=lambda item: (-item[0], item[1]))[:limit]
        more = f" ({len(shown)} with the most of {len(eager_tests)}; all in `table-full.md`)" if limit else ""
        lines += [f"Tests with eager steps{more}:", ""]
        lines += ["| test with eager steps | runs | compiled | eager | causes |", "|---|---|---|---|---|"]
        for _, nodeid, record in shown:
            done = [run for run in record["runs"] if run["compiled"]]
            ran = "; ".join(f"{run['fn']}" for run in record["runs"])
            good = steps(sum((Counter(run["compiled_steps"]) for run in done), Counter()))
            bad = steps(sum((Counter(run["eager_steps"]) for run in done), Counter()))
            why = "; ".join(sorted({cause for run in done for cause in run.get("eager_causes", {})})) or "(none given)"
            lines.append(f"| `{nodeid}` | {ran} | {good} | {bad} | {cell(why)} |")
        lines.append("")
    return lines


def report(
    results: dict[str, dict[str, dict]],
    timings: dict[str, dict],
    expected: dict[tuple[str, str], str],
    title: str,
    limit: Optional[int] = 25,
    stock_where_failed: bool = False,
) -> tuple[str, bool]:
    """The markdown table, and whether it shows something wrong (an unexpected new failure, a stale expectation)."""
    lines = [f"# {title}", "", "| mode | use_compile | tests | passed | failed | error | skipped | exit | seconds |"]
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for name, tests in results.items():
        counts = Counter(record["outcome"] for record in tests.values())
        value = MODES[name][1] or "(unset)"
        timing = timings.get(name, {})
        lines.append(
            f"| {name} | `{value}` | {len(tests)} | {counts['passed']} | {counts['failed']} | {counts['error']}"
            f" | {counts['skipped']} | {timing.get('exit', '-')} | {timing.get('seconds', 0):.0f} |"
        )
    lines.append("")
    if stock_where_failed:
        lines += ["`stock` ran only the tests that failed in another mode, or are listed as expected to.", ""]
    wrong = any(timing["exit"] not in (0, 1) for timing in timings.values())
    base = results.get("stock")
    for name, tests in results.items():
        if name == "stock" or base is None:
            continue
        result = compare(base, tests, name, expected, stock_where_failed)
        wrong |= bool(result.new_failures or result.stale)
        lines += [f"## `{name}` vs `stock`", "", "| | tests |", "|---|---|"]
        for label, group in (
            ("passes both", result.passes_both),
            ("fails both", result.fails_both),
            ("**new failure**", result.new_failures),
            ("new failure, expected", result.expected),
            ("new pass", result.new_passes),
            ("skipped (either)", result.skipped),
            *([("passed or skipped, stock not run", result.stock_not_run)] if stock_where_failed else []),
            ("ran in one mode only", result.missing),
            ("**listed as expected but did not newly fail**", result.stale),
        ):
            lines.append(f"| {label} | {len(group)} |")
        lines.append("")
        if result.new_failures:
            groups = Counter(signature(tests[nodeid].get("error")) for nodeid in result.new_failures)
            lines += [f"### New failures by error (`{name}`)", "", "| error, first line | tests |", "|---|---|"]
            lines += [f"| {cell(error)} | {n} |" for error, n in groups.most_common()]
            lines.append("")
        for label, group in (
            ("New failures", result.new_failures),
            ("Expected new failures", result.expected),
            ("New passes", result.new_passes),
            ("Listed as expected, but not a new failure", result.stale),
            ("Ran in one mode only", result.missing),
        ):
            if not group:
                continue
            if limit and label == "Ran in one mode only" and len(group) > limit:  # another selection: not a result
                label += f" ({limit} of {len(group)}; all in `table-full.md`)"
                group = group[:limit]
            lines += [f"### {label} (`{name}`)", "", "| test | outcome | first line of the error | expected because |"]
            lines.append("|---|---|---|---|")
            for nodeid in group:
                record = tests.get(nodeid) or base.get(nodeid) or {}
                reason = expected_reason(expected, name, nodeid) or ""
                error = cell(record.get("error") or "")
                lines.append(f"| `{nodeid}` | {record.get('outcome', '-')} | {error} | {cell(reason)} |")
            lines.append("")
        if MODES[name][0] == "compiled":
            lines += runs_section(name, tests, limit)
    return "\n".join(lines) + "\n", wrong


def main() -> int:
    """Runs the modes asked for, writes ``OUT/table.md`` and prints it; the exit status as the module says."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tests", type=Path, default=Path(os.environ.get("LCP_LIGHTNING_TESTS", DEFAULT_TESTS)))
    parser.add_argument("--selection", default="ci", help=f"{', '.join(SELECTIONS)}, or paths under tests/, commas")
    parser.add_argument("--modes", default="stock,imported,compiled", help=f"of {', '.join(MODES)}, or NAME=JSON")
    parser.add_argument("--flavour", default="lightning.pytorch", choices=("lightning.pytorch", "pytorch_lightning"))
    parser.add_argument("--target", default="package", choices=("package", "upstream"))
    parser.add_argument("--out", type=Path, default=ROOT / ".work" / "lightning_suite")
    parser.add_argument("--workers", default=os.environ.get("LCP_PYTEST_WORKERS", "2"))
    parser.add_argument("--timeout", type=int, default=300, help="seconds per test (pytest-timeout), 0 for none")
    parser.add_argument("--expected", type=Path, default=EXPECTED)
    parser.add_argument("--table", type=Path, help="also write the table here (default: OUT/table.md only)")
    parser.add_argument("--report-only", action="store_true", help="tabulate the records already in --out")
    parser.add_argument(
        "--stock-where-failed",
        action="store_true",
        help="run stock last, on the tests that failed in another mode (or are listed as expected to) only",
    )
    args, extra = parser.parse_known_args()
    extra = [arg for arg in extra if arg != "--"]
    names = []
    for spec in args.modes.split(","):
        name, _, value = spec.partition("=")
        if value:
            MODES[name] = ("compiled", value)
        if name not in MODES:
            parser.error(f"unknown mode {name!r}: one of {', '.join(MODES)}, or NAME=JSON")
        names.append(name)
    work = args.out.resolve()
    work.mkdir(parents=True, exist_ok=True)
    timings_path = work / "timings.json"
    timings: dict[str, dict] = json.loads(timings_path.read_text()) if timings_path.exists() else {}
    expected = load_expected(args.expected)
    if not args.report_only:
        spec = importlib.util.find_spec("lightning_compile_patch")
        print(f"[lightning_suite] lightning_compile_patch: {spec.origin if spec else 'not installed'}", flush=True)
        tree = prepare_tree(args.tests.resolve(), work, args.flavour)
        last = ["stock"] if args.stock_where_failed and "stock" in names else []
        for name in [*(n for n in names if n not in last), *last]:
            only = failed_elsewhere(work, names, expected) if name in last else None
            timings[name] = run_mode(name, tree, work, args, extra, only)
            timings_path.write_text(json.dumps(timings, indent=1))
    results = {name: load_records(work / "records" / name) for name in names}
    title = f"Lightning's tests ({args.selection}, {args.flavour}, target {args.target})"
    timings = {name: timings[name] for name in names if name in timings}
    table, wrong = report(results, timings, expected, title, stock_where_failed=args.stock_where_failed)
    (work / "table.md").write_text(table)
    full = report(results, timings, expected, title, limit=None, stock_where_failed=args.stock_where_failed)[0]
    (work / "table-full.md").write_text(full)
    if args.table:
        args.table.parent.mkdir(parents=True, exist_ok=True)
        args.table.write_text(table)
    print(table)
    print(f"[lightning_suite] table: {work / 'table.md'}")
    if any(timings.get(name, {}).get("exit") not in (0, 1) for name in names):
        return 2
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
