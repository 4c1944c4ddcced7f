"""Each rung's own tests tell it apart from Lightning master, and the core rungs' tests from their likely mistakes.

    python tools/upstream/rung_tests.py [--lightning MASTER] [--workers N] [--table OUT.md]

The rungs a maintainer would merge (``patches/lightning-master/`` up to ``use_compile``) each add test files (listed
in ``tools/upstream/series.py``). They run on Lightning master:

* ``master``: no patch, only the test files copied in. Each file must fail: a test file that passes on master tests
  nothing its rung changes;
* each rung's files with the patches up to it (the three fixes together): they must pass, and so must Lightning's own
  ``utilities/test_compile.py`` with the re-apply, whose two assertions of the old placement it changes;
* the re-apply's and ``use_compile``'s files on two mutants of the ladder up to ``use_compile``, which each file must
  fail:
  ``compiles before the wrap`` (the connector compiles the LightningModule's steps, never the wrapper: master's
  placement) and ``compiles after the on_fit_start hooks`` (the compile call moved to the start of ``_run_stage``,
  after the hooks where the tuner runs its trials: where the first version of the core compiled).

Lightning's tests run as its CI runs them (``cd tests && PYTHONPATH=../src python -m pytest``, `tools/lightning_ci.py`).
Exits 1 if any target does not do what it must, with a table of each file's outcome.

"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(HERE.parent))

import lightning_ci  # noqa: E402
from upstream.series import REAPPLY, USE_COMPILE, series  # noqa: E402

CONNECTOR = "src/lightning/pytorch/trainer/connectors/compile_connector.py"
#: Lightning's own tests of its compile helpers, which the re-apply changes (two assertions of the old placement).
LIGHTNING_COMPILE_TESTS = "tests_pytorch/utilities/test_compile.py"
TRAINER = "src/lightning/pytorch/trainer/trainer.py"
_COMPILE_CALL = "        self._compile_connector.compile()\n"
_COMPILE_COMMENT = (
    "        # compile what the strategy runs, now that it has wrapped the model, before any hook runs a step\n"
)
_RUN_STAGE = '        self.strategy.barrier("run-stage")\n'
#: Each mutant: the file it changes, and the text replaced in it (which must be there once).
MUTANTS: dict[str, list[tuple[str, str, str]]] = {
    "compiles before the wrap": [
        (
            CONNECTOR,
            "        module, wrapper = self.trainer.lightning_module, self.trainer.strategy.model\n",
            "        module = wrapper = self.trainer.lightning_module\n",
        ),
    ],
    "compiles after the on_fit_start hooks": [
        (TRAINER, _COMPILE_COMMENT + _COMPILE_CALL, ""),
        (TRAINER, _RUN_STAGE, _COMPILE_CALL + _RUN_STAGE),
    ],
}


@dataclass
class Target:
    """One run of rung test files: on master, on a rung, or on a mutant of a rung."""

    name: str
    #: How many patches of the ladder it applies (0: master, with the test files copied in).
    patches: int
    files: list[str]
    must_fail: bool
    mutant: str = ""
    #: Lightning's own test files that the rung changes, run with its own, and which must pass there too.
    also: tuple[str, ...] = ()
    results: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def by_file(self) -> dict[str, list[str]]:
        """What each test file's tests did."""
        return {f: [r for t, r in self.results.items() if t.split("::")[0] == f] for f in (*self.files, *self.also)}

    @property
    def ok(self) -> bool:
        """Every file fails (at least one test of it failed), or every file passes (none failed, some passed)."""
        if self.must_fail:
            return all("failed" in outcomes for outcomes in self.by_file().values())
        return all(outcomes and "failed" not in outcomes for outcomes in self.by_file().values())


def mutate(tree: Path, name: str) -> None:
    """Applies the mutant ``name`` to ``tree``."""
    for path, old, new in MUTANTS[name]:
        file = tree / path
        text = file.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"mutant {name!r}: {path} holds {text.count(old)} copies of {old.strip()!r}, not one")
        file.write_text(text.replace(old, new))


def run_target(args: argparse.Namespace, base: Path, tmp: Path, target: Target, patches: list) -> None:
    """Builds the target's tree from ``base`` and runs its test files there."""
    tree = tmp / re.sub(r"[^A-Za-z0-9]+", "_", target.name)
    lightning_ci.git(tmp, "clone", "-q", str(base), str(tree))
    if not target.patches:
        for test in target.files:
            (tree / "tests" / test).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(HERE / "tests" / test, tree / "tests" / test)
    else:
        lightning_ci.git(tree, "am", "-3", "-q", *(str(p.path) for p in patches[: target.patches]))
    if target.mutant:
        mutate(tree, target.mutant)
    options = argparse.Namespace(**{**vars(args), "pytest_args": ["-q"]})
    started = time.monotonic()
    lightning_ci.pytest(options, tree, [*target.files, *target.also], tmp / tree.name)
    target.seconds = time.monotonic() - started
    outcome = lightning_ci.Outcome(target.name, [])
    if (tmp / f"{tree.name}.xml").exists():
        lightning_ci.read_junit(tmp / f"{tree.name}.xml", tree / "tests", outcome)
    target.results = outcome.results


def targets() -> list[Target]:
    """Master with every core rung's files; the fixes, the re-apply and `use_compile` each with theirs; the mutants."""
    ladder = series("master")
    subjects = [patch.subject for patch in ladder]
    core = ladder[: subjects.index(USE_COMPILE.subject) + 1]
    files = {patch.subject: list(patch.tests) for patch in core}
    fixes = [f for patch in core if patch.subject.startswith("Fix ") for f in files[patch.subject]]
    reapply, use_compile = subjects.index(REAPPLY.subject) + 1, subjects.index(USE_COMPILE.subject) + 1
    compiling = files[REAPPLY.subject] + files[USE_COMPILE.subject]
    return [
        Target("master", 0, [f for patch in core for f in files[patch.subject]], must_fail=True),
        Target("the fixes", reapply - 1, fixes, must_fail=False),
        Target("re-apply", reapply, files[REAPPLY.subject], must_fail=False, also=(LIGHTNING_COMPILE_TESTS,)),
        Target("use_compile", use_compile, files[USE_COMPILE.subject], must_fail=False),
        *(Target(f"use_compile, {m}", use_compile, compiling, must_fail=True, mutant=m) for m in MUTANTS),
    ]


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lightning", type=Path, default=Path(lightning_ci.DEFAULT_LIGHTNING))
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--timeout", type=int, default=300)
    parser.add_argument("--table", type=Path)
    args = parser.parse_args(argv)
    args.python = sys.executable
    patches = lightning_ci.series(ROOT / "patches" / "lightning-master")
    done: list[Target] = []
    with tempfile.TemporaryDirectory(prefix="rung-tests-") as tmp_name:
        tmp = Path(tmp_name)
        base = lightning_ci.base_repository(args.lightning, tmp)
        for target in targets():
            run_target(args, base, tmp, target, patches)
            done.append(target)
            print(f"{target.name}: {'ok' if target.ok else 'WRONG'} ({target.seconds:.0f} s)", flush=True)
    lines = ["| target | test file | must | passed | failed | skipped |", "|---|---|---|---|---|---|"]
    for t in done:
        for file, outcomes in t.by_file().items():
            counts = [outcomes.count(r) for r in ("passed", "failed", "skipped")]
            must = "fail" if t.must_fail else "pass"
            ok = "" if t.ok else " **WRONG**"
            lines.append(f"| {t.name}{ok} | `{file}` | {must} | {' | '.join(map(str, counts))} |")
    table = "\n".join(lines) + "\n"
    print(table)
    if args.table:
        args.table.write_text(table)
    return 0 if all(t.ok for t in done) else 1


if __name__ == "__main__":
    sys.exit(main())
