"""Each rung's own tests tell it apart from Lightning master, and the core rungs' tests from their likely mistakes.

    python tools/upstream/rung_tests.py [--lightning MASTER] [--workers N] [--table OUT.md]

The rungs a maintainer would merge (``patches/lightning-master/`` up to ``use_compile``) each add tests
(``tools/upstream/series.py``): the fixes, to Lightning's own test files; the re-apply and ``use_compile``, in files of
their own. Each rung's tests are a unit: a new file, or the tests a fix adds to one of Lightning's files (run by node
id). First each fix must ``git am -3`` alone on Lightning master; then the tests run there:

* ``master``: no patch, only the changes of ``tests/`` of every rung applied. Each unit must fail: tests that pass on
  master test nothing their rung changes;
* each rung's units with the patches up to it (the four fixes together): they must pass, and so must Lightning's test
  files that the rungs add to or whose code they change (``utilities/test_compile.py`` with the re-apply);
* the re-apply's and ``use_compile``'s files on two mutants of the ladder up to ``use_compile``, which each file must
  fail:
  ``compiles before the launch`` (the Trainer does not unwrap the model passed in, so ``fit`` compiles its steps with
  ``from_compiled`` before the strategy's launcher and setup, and leaves them compiled: master's placement) and
  ``compiles after the on_fit_start hooks`` (the compile call moved to the start of ``_run_stage``, after the hooks
  where the tuner runs its trials: where the first version of the core compiled). Since ``torch.compile`` is lazy, a
  step compiled before the wrap or after it is traced at its first call, inside the wrapper, alike. The re-apply
  (0005, the ``ddp_spawn`` fix) unwraps and compiles after the setup only where the launcher pickles the model: its
  file fails the first mutant by ``ddp_spawn``'s pickling, the warning for unknown arguments and the model passed
  compiled again, and the second by the tuner's trials, which its ``ddp_spawn`` test runs in each process. Elsewhere
  the model takes Lightning's own path, which its ``ddp_fork`` tests guard (they pass on master and on the first
  mutant).

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
from upstream.series import (  # noqa: E402
    _UNWRAP_NEW,
    _UNWRAP_OLD,
    FEATURE_SEAM,
    REAPPLY,
    USE_COMPILE,
    AddTests,
    Patch,
    series,
)

#: Lightning's own tests of its compile helpers and of a compiled model in the Trainer, whose code the re-apply changes.
LIGHTNING_COMPILE_TESTS = "tests_pytorch/utilities/test_compile.py"
TRAINER = "src/lightning/pytorch/trainer/trainer.py"
_COMPILE_CALL = "        self._compile_connector.compile()\n"
_COMPILE_COMMENT = (
    "        # compile what the strategy runs, now that it has set the model up, before any hook runs a step\n"
)
_RUN_STAGE = '        self.strategy.barrier("run-stage")\n'
#: Each mutant: the file it changes, the text replaced in it, and how many copies of it the file holds.
MUTANTS: dict[str, list[tuple[str, str, str, int]]] = {
    "compiles before the launch": [(TRAINER, _UNWRAP_NEW, _UNWRAP_OLD, 4)],  # in `fit`, `validate`, `test`, `predict`
    "compiles after the on_fit_start hooks": [
        (TRAINER, _COMPILE_COMMENT + _COMPILE_CALL, "", 1),
        (TRAINER, _RUN_STAGE, _COMPILE_CALL + _RUN_STAGE, 1),
    ],
}


@dataclass
class Target:
    """One run of rung test files: on master, on a rung, or on a mutant of a rung."""

    name: str
    #: How many patches of the ladder it applies (0: master, with only the rungs' changes of ``tests/``).
    patches: int
    #: The rungs' tests, by unit: a unit's label, and its node ids (a whole file, or tests of one).
    units: dict[str, list[str]]
    must_fail: bool
    mutant: str = ""
    #: Lightning's own test files that the rungs add to or change, run whole, which must pass there too.
    also: tuple[str, ...] = ()
    results: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def by_unit(self) -> dict[str, list[str]]:
        """What each unit's tests did (and each of Lightning's files of ``also``)."""
        units = {**self.units, **{f: [f] for f in self.also}}
        ran = [(t.split("[")[0], r) for t, r in self.results.items()]
        return {u: [r for t, r in ran if t in ids or t.split("::")[0] in ids] for u, ids in units.items()}

    @property
    def ok(self) -> bool:
        """Every unit fails (at least one test of it failed), or every unit passes (none failed, some passed)."""
        if self.must_fail:
            return all("failed" in outcomes for outcomes in self.by_unit().values())
        return all(outcomes and "failed" not in outcomes for outcomes in self.by_unit().values())


def mutate(tree: Path, name: str) -> None:
    """Applies the mutant ``name`` to ``tree``."""
    for path, old, new, copies in MUTANTS[name]:
        file = tree / path
        text = file.read_text()
        if text.count(old) != copies:
            raise SystemExit(f"mutant {name!r}: {path} holds {text.count(old)} copies of {old.strip()!r}, not {copies}")
        file.write_text(text.replace(old, new))


def run_target(args: argparse.Namespace, base: Path, tmp: Path, target: Target, patches: list) -> None:
    """Builds the target's tree from ``base`` and runs its test files there."""
    tree = tmp / re.sub(r"[^A-Za-z0-9]+", "_", target.name)
    lightning_ci.git(tmp, "clone", "-q", str(base), str(tree))
    rungs = rungs_to_use_compile()
    absent = lightning_ci.absent_tests(tree, patches[: len(rungs)])
    exclude = [f"--exclude={path}" for path in absent]
    if not target.patches:
        for patch in patches[: len(rungs)]:
            lightning_ci.git(tree, "apply", *exclude, "--include=tests/*", str(patch.path))
    else:
        lightning_ci.am(tree, patches[: target.patches])
    # tests that a fix adds to a file the base lacks (CI's archive has no `tests/tests_fabric`) run from their module,
    # copied in as a file of its own: the same tests, which Lightning's file gets verbatim
    ids: dict[str, str] = {}  # a test's node id in Lightning's file: its node id in the module
    modules: dict[str, list[str]] = {}  # Lightning's file: the modules whose tests it would have
    for edit in (e for patch in rungs for e in patch.edits if isinstance(e, AddTests) and e.path in absent):
        folder = (tree / "tests" / edit.source).parent
        if not folder.exists():  # with the harness's `RunIf`, which defers to Lightning's as Lightning's own does
            shutil.copytree(HERE / "harness" / edit.source.split("/")[0], folder)
        shutil.copy(HERE / "tests" / edit.source, tree / "tests" / edit.source)
        ids |= {i: f"{edit.source}::{i.split('::')[1]}" for i in edit.node_ids()}
        modules.setdefault(edit.path.removeprefix("tests/"), []).append(edit.source)
    if ids:
        target.units = {
            (f"{u} (run from its module)" if ids.keys() & set(i) else u): [ids.get(n, n) for n in i]
            for u, i in target.units.items()
        }
        target.also = tuple(m for f in target.also for m in modules.get(f, [f]))
    if target.mutant:
        mutate(tree, target.mutant)
    options = argparse.Namespace(**{**vars(args), "pytest_args": ["-q"]})
    started = time.monotonic()
    selection = [
        i for i in dict.fromkeys(i for ids in target.units.values() for i in ids) if i.split("::")[0] not in target.also
    ]
    lightning_ci.pytest(options, tree, [*selection, *target.also], tmp / tree.name)
    target.seconds = time.monotonic() - started
    outcome = lightning_ci.Outcome(target.name, [])
    if (tmp / f"{tree.name}.xml").exists():
        lightning_ci.read_junit(tmp / f"{tree.name}.xml", tree / "tests", outcome)
    target.results = outcome.results


def rungs_to_use_compile() -> list[Patch]:
    """The master ladder's rungs a maintainer would merge: the fixes, the re-apply, `use_compile`."""
    ladder = series("master")
    return ladder[: [patch.subject for patch in ladder].index(USE_COMPILE.subject) + 1]


def fixes() -> list[Patch]:
    """The rungs before the re-apply: fixes of Lightning's own code, each of which can merge alone."""
    rungs = rungs_to_use_compile()
    return rungs[: [patch.subject for patch in rungs].index(REAPPLY.subject)]


def units(number: int, patch: Patch) -> dict[str, list[str]]:
    """The tests rung ``number`` adds, by unit: each new file, and the tests it adds to each of Lightning's files."""
    out = {file: [file] for file in patch.tests}
    for edit in patch.edits:
        if isinstance(edit, AddTests):
            ids = edit.node_ids()
            out[f"{edit.path.removeprefix('tests/')}: {number:04d}'s {len(ids)} test{'s' * (len(ids) > 1)}"] = ids
    return out


def targets() -> list[Target]:
    """Master with every core rung's tests; the fixes, the re-apply and `use_compile` each with theirs; the mutants."""
    core = rungs_to_use_compile()
    by_rung = {patch.subject: units(number, patch) for number, patch in enumerate(core, start=1)}
    fixed_by = fixes()
    # the fixes' tests are in Lightning's files: those run whole with the fixes, whose other tests must still pass
    fixed = tuple(
        dict.fromkeys(e.path.removeprefix("tests/") for p in fixed_by for e in p.edits if isinstance(e, AddTests))
    )
    reapply, use_compile = len(fixed_by) + 1, len(core)
    compiling = {**by_rung[REAPPLY.subject], **by_rung[USE_COMPILE.subject]}
    return [
        Target("master", 0, {u: i for rung in by_rung.values() for u, i in rung.items()}, must_fail=True),
        Target(
            "the fixes", reapply - 1, {u: i for p in fixed_by for u, i in by_rung[p.subject].items()}, False, also=fixed
        ),
        Target("re-apply", reapply, by_rung[REAPPLY.subject], must_fail=False, also=(LIGHTNING_COMPILE_TESTS,)),
        Target("use_compile", use_compile, by_rung[USE_COMPILE.subject], must_fail=False),
        *(Target(f"use_compile, {m}", use_compile, compiling, must_fail=True, mutant=m) for m in MUTANTS),
    ]


def fixes_that_do_not_apply_alone(base: Path, tmp: Path, patches: list) -> list[str]:
    """The fixes (the rungs before the re-apply) that ``git am -3`` does not take alone on ``base``."""
    failed = []
    for number, patch in enumerate(patches[: len(fixes())], start=1):
        tree = tmp / f"alone-{number}"
        lightning_ci.git(tmp, "clone", "-q", str(base), str(tree))
        if lightning_ci.am(tree, [patch], check=False).returncode:
            failed.append(patch.path.name)
    return failed


def ladders_that_do_not_apply(base: Path, tmp: Path, patches: list) -> list[str]:
    """Of what the master ladder promises to apply with ``git am -3``: all of it, and the seam with each later rung."""
    seam = [patch.subject for patch in patches].index(FEATURE_SEAM.subject) + 1
    ladders = {"all": patches, **{patch.path.name: [*patches[:seam], patch] for patch in patches[seam:]}}
    failed = []
    for number, (name, ladder) in enumerate(ladders.items()):
        tree = tmp / f"ladder-{number}"
        lightning_ci.git(tmp, "clone", "-q", str(base), str(tree))
        if lightning_ci.am(tree, ladder, check=False).returncode:
            failed.append(name)
        shutil.rmtree(tree)
    return failed


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
        not_alone = fixes_that_do_not_apply_alone(base, tmp, patches)
        print(f"each fix alone: {'ok' if not not_alone else 'WRONG: ' + ', '.join(not_alone)}", flush=True)
        not_applied = ladders_that_do_not_apply(base, tmp, patches)
        applied = "ok" if not not_applied else "WRONG: " + ", ".join(not_applied)
        print(f"the whole ladder, and the seam with each later rung: {applied}", flush=True)
        not_alone += not_applied
        for target in targets():
            run_target(args, base, tmp, target, patches)
            done.append(target)
            print(f"{target.name}: {'ok' if target.ok else 'WRONG'} ({target.seconds:.0f} s)", flush=True)
    lines = ["| target | tests | must | passed | failed | skipped |", "|---|---|---|---|---|---|"]
    for t in done:
        for file, outcomes in t.by_unit().items():
            counts = [outcomes.count(r) for r in ("passed", "failed", "skipped")]
            must = "fail" if t.must_fail else "pass"
            ok = "" if t.ok else " **WRONG**"
            lines.append(f"| {t.name}{ok} | `{file}` | {must} | {' | '.join(map(str, counts))} |")
    table = "\n".join(lines) + "\n"
    print(table)
    if args.table:
        args.table.write_text(table)
    return 0 if all(t.ok for t in done) and not not_alone else 1


if __name__ == "__main__":
    sys.exit(main())
