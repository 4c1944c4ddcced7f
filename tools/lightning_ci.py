"""Lightning's own CI for the files that `patches/lightning-master/` touches: stock, with the core, with the series.

    python tools/lightning_ci.py requirements --out REQS.txt   # Lightning's test requirements, for `pip install -r`
    python tools/lightning_ci.py run [--patches none --patches core --patches all] [--workers N] [--keep DIR]

`run` builds Lightning master from `--lightning` (its archive, or a clone at the series' base commit; default
``$LCP_LIGHTNING_MASTER``, else ``../shared/lightning-tests/lightning-master-7f0c3436cd.tar.gz`` from the repository
root) in a temporary directory, and for each rung of the ladder `git am -3`s that rung's patches onto a fresh copy of
it, then runs Lightning's tests the way its CI does: ``cd tests && python -m pytest tests_pytorch/...`` with
``PYTHONPATH=src`` (the source tree, not an installed Lightning) and the pytest options of Lightning's pyproject.toml.

The selection: the tests of what the series changes (`utilities/test_compile.py`, `trainer/test_trainer.py`,
`trainer/connectors/`, `strategies/test_ddp.py`) and every test file that the rung's patches add or change (Fabric's
`test_wrappers.py` only from a clone: the archive has no `tests/tests_fabric`, and its changes are left out there).

A rung (``--patches``, repeatable; default ``none``, ``core``, ``all``):
  ``none``        stock Lightning, the baseline that the other rungs are compared with
  ``core``        the patches up to the one whose subject starts with ``--core-subject``
                  (default "Add `Trainer(use_compile"), that one included
  ``all``         the whole series
  ``N``           the first N patches;  ``1,3-5``: those numbers (by the number in the file name)

It prints, and writes to ``--table`` if given, a table of passed / failed / skipped per rung with the failures that are
new against stock (a test that fails in the rung and did not fail, or did not exist, in stock), and exits 1 if any rung
has a new failure. Failures are run again on their own (up to ``--recheck`` of them per rung): one that passes then is
"flaky" (a timeout on a loaded machine, say), neither a stock failure nor a new one.

Not quite Lightning's CI: ``--continue-on-collection-errors`` (a test module that fails to import counts as a failure
instead of stopping the run), ``--timeout`` 300 s by default (for a loaded machine), and ``--workers`` (pytest-xdist).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LIGHTNING = ROOT.parent / "shared" / "lightning-tests" / "lightning-master-7f0c3436cd.tar.gz"
SERIES = ROOT / "patches" / "lightning-master"
SELECTION = (
    "tests_pytorch/utilities/test_compile.py",
    "tests_pytorch/trainer/test_trainer.py",
    "tests_pytorch/trainer/connectors",
    "tests_pytorch/strategies/test_ddp.py",
)
CORE_SUBJECT = "Add `Trainer(use_compile"
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "lightning-ci",
    "GIT_AUTHOR_EMAIL": "lightning-ci@lightning-compile-patch.invalid",
    "GIT_COMMITTER_NAME": "lightning-ci",
    "GIT_COMMITTER_EMAIL": "lightning-ci@lightning-compile-patch.invalid",
}

#: Lightning's requirement files that its CI installs for these tests (`strategies.txt`, DeepSpeed, comes separately:
#: it needs `--no-build-isolation`), with the lines that are left out, and why.
REQUIREMENT_FILES = (
    "requirements/fabric/base.txt",
    "requirements/pytorch/base.txt",
    "requirements/pytorch/extra.txt",
    "requirements/pytorch/test.txt",
)
LEFT_OUT: dict[str, str] = {}


def lightning_root(source: Path, into: Path) -> Path:
    """Lightning's tree from an archive (unpacked into ``into``) or a directory (returned as it is)."""
    if source.is_dir():
        return source
    with tarfile.open(source) as archive:
        archive.extractall(into, filter="data")
    [top] = [p for p in into.iterdir() if p.is_dir()] or [into]
    return top if (top / "src").is_dir() else into


def requirements(args: argparse.Namespace) -> int:
    """Writes Lightning's test requirements (`REQUIREMENT_FILES`, less `LEFT_OUT` and ``--drop``) to ``--out``."""
    with tempfile.TemporaryDirectory(prefix="lightning-ci-") as tmp:
        tree = lightning_root(Path(args.lightning), Path(tmp))
        lines = [f"# from {args.lightning}"]
        for name in REQUIREMENT_FILES:
            lines.append(f"# {name}")
            for line in (tree / name).read_text().splitlines():
                line = line.split(" #")[0].strip() if not line.startswith("#") else ""
                if not line or line.startswith("-r"):
                    continue
                package = re.split(r"[ <>=!;\[~]", line, maxsplit=1)[0].lower()
                if package in LEFT_OUT or package in args.drop:
                    lines.append(f"# left out: {line}  ({LEFT_OUT.get(package, 'asked with --drop')})")
                    continue
                lines.append(line)
        Path(args.out).write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    return 0


@dataclass
class Patch:
    """One patch of the series: the number its file name starts with, the file, the subject."""

    number: int
    path: Path
    subject: str


def series(directory: Path) -> list[Patch]:
    """The patches of ``directory``, by the number that starts each file name."""
    patches = []
    for path in sorted(directory.glob("*.patch")):
        number = re.match(r"\d+", path.name)
        subject = re.search(r"^Subject: (?:\[PATCH[^\]]*\] )?(.*)$", path.read_text(), re.MULTILINE)
        if number and subject:
            patches.append(Patch(int(number.group()), path, subject.group(1)))
    return sorted(patches, key=lambda p: p.number)


def absent_tests(tree: Path, patches: list[Patch]) -> list[str]:
    """The test files of Lightning's that ``patches`` change and ``tree`` lacks.

    CI's archive of master holds ``tests/tests_pytorch`` alone, and the fixes of Fabric add their tests to
    ``tests/tests_fabric/test_wrappers.py``: with such a tree, ``git am --exclude`` leaves those changes out.
    """
    changed = set()
    for patch in patches:
        for section in re.split(r"(?m)^(?=diff --git )", patch.path.read_text())[1:]:
            path = section.split()[2][2:]
            if path.startswith("tests/") and "\nnew file mode" not in section.split("\n@@")[0]:
                changed.add(path)
    return sorted(path for path in changed if not (tree / path).exists())


def am(tree: Path, patches: list[Patch], check: bool = True) -> subprocess.CompletedProcess:
    """``git am -3`` of ``patches`` in ``tree``, without the changes of test files the tree lacks (`absent_tests`)."""
    exclude = [f"--exclude={path}" for path in absent_tests(tree, patches)]
    return git(tree, "am", "-3", "-q", *exclude, *(str(p.path) for p in patches), check=check)


def rung_patches(spec: str, patches: list[Patch], core_subject: str) -> list[Patch]:
    """The patches of one rung of the ladder: ``none``, ``core``, ``all``, ``N`` (the first N), or ``1,3-5``."""
    if spec == "none":
        return []
    if spec == "all":
        return patches
    if spec == "core":
        cores = [p for p in patches if p.subject.startswith(core_subject)]
        if len(cores) != 1:
            raise SystemExit(
                f"{len(cores)} patches have a subject that starts with {core_subject!r}: pass --core-subject"
            )
        return [p for p in patches if p.number <= cores[0].number]
    if spec.isdigit():
        return patches[: int(spec)]
    numbers: set[int] = set()
    for part in spec.split(","):
        low, _, high = part.partition("-")
        numbers.update(range(int(low), int(high or low) + 1))
    chosen = [p for p in patches if p.number in numbers]
    if len(chosen) != len(numbers):
        raise SystemExit(f"--patches {spec}: no patch numbered {sorted(numbers - {p.number for p in chosen})}")
    return chosen


def git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Runs git in ``cwd`` with an identity of its own; with ``check``, stops with git's output if it fails."""
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env={**os.environ, **GIT_IDENTITY})
    if check and result.returncode:
        raise SystemExit(f"`git {' '.join(args)}` failed in {cwd}:\n{result.stdout}{result.stderr}")
    return result


def base_repository(source: Path, tmp: Path) -> Path:
    """A git repository whose HEAD is Lightning's tree: a clone of ``source`` if it is one, else the tree committed."""
    base = tmp / "base"
    if source.is_dir() and (source / ".git").exists():
        git(tmp, "clone", "-q", str(source), str(base))
        return base
    tree = lightning_root(source, tmp / "unpacked")
    shutil.copytree(tree, base, symlinks=True)
    git(base, "init", "-q")
    git(base, "add", "-A")
    git(base, "commit", "-q", "--no-verify", "-m", f"Lightning from {source.name}")
    return base


@dataclass
class Outcome:
    """One rung: its patches, whether they applied, and what each test did."""

    rung: str
    patches: list[Patch]
    applied: bool = True
    apply_error: str = ""
    results: dict[str, str] = field(default_factory=dict)  # test id -> passed / failed / skipped
    messages: dict[str, str] = field(default_factory=dict)  # test id -> the failure's first lines
    seconds: float = 0.0
    returncode: int = 0
    tree: Optional[Path] = None
    #: New failures that passed when run again on their own: load or order, not the patches.
    flaky: list[str] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        """How many tests ended ``outcome`` (passed, failed, skipped)."""
        return sum(1 for r in self.results.values() if r == outcome)


def test_id(classname: str, name: str, tests: Path) -> str:
    """The pytest node id of a junit test case, relative to ``tests``.

    ``tests_pytorch.trainer.test_trainer.TestX`` + ``test_y``: ``tests_pytorch/trainer/test_trainer.py::TestX::test_y``.

    """
    parts = classname.split(".") if classname else []
    if parts[:1] == [tests.name]:  # relative to the rootdir, the tree (its pyproject.toml), not to tests/
        parts = parts[1:]
    for cut in range(len(parts), 0, -1):
        module = Path(*parts[:cut]).with_suffix(".py")
        if (tests / module).exists():
            return "::".join([module.as_posix(), *parts[cut:], name])
    return "::".join([*parts, name]) if parts else name


def read_junit(path: Path, tests: Path, outcome: Outcome) -> None:
    """Adds a junit file's results to ``outcome``: the worst of a test's entries (a teardown error is a failure)."""
    rank = {"passed": 0, "skipped": 1, "failed": 2}
    for case in ET.parse(path).getroot().iter("testcase"):
        tid = test_id(case.get("classname", ""), case.get("name", ""), tests)
        result, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                result = "failed"
                text = (child.get("message") or "") + "\n" + (child.text or "")
                message = "\n".join(line for line in text.strip().splitlines()[:8])
            elif child.tag == "skipped" and result == "passed":
                result = "skipped"
        if rank[result] >= rank[outcome.results.get(tid, "passed")]:
            outcome.results[tid] = result
            if message:
                outcome.messages[tid] = message


def run_rung(args: argparse.Namespace, base: Path, tmp: Path, spec: str, patches: list[Patch], out: Path) -> Outcome:
    """Applies the rung's patches to a fresh clone of ``base`` and runs the selection and the tests they add there."""
    outcome = Outcome(spec, rung_patches(spec, patches, args.core_subject))
    tree = outcome.tree = tmp / f"rung-{re.sub(r'[^A-Za-z0-9]+', '_', spec)}"
    git(tmp, "clone", "-q", str(base), str(tree))
    if outcome.patches:
        applied = am(tree, outcome.patches, check=False)
        if applied.returncode:
            outcome.applied, outcome.apply_error = False, (applied.stdout + applied.stderr).strip()
            git(tree, "am", "--abort", check=False)
            return outcome
    tests = ("tests/tests_pytorch", "tests/tests_fabric")
    added = git(tree, "diff", "--name-only", "--diff-filter=AM", "origin/HEAD", "HEAD", "--", *tests)
    selection = list(args.tests or SELECTION)
    for path in added.stdout.split():
        relative = path.removeprefix("tests/")
        covered = any(relative == s or relative.startswith(s.rstrip("/") + "/") for s in selection)
        if path.endswith(".py") and Path(path).name.startswith("test_") and not covered:
            selection.append(relative)
    started = time.monotonic()
    print(f"\n[{spec}] {len(outcome.patches)} patches", flush=True)
    outcome.returncode = pytest(args, tree, selection, out / tree.name)
    outcome.seconds = time.monotonic() - started
    if (out / f"{tree.name}.xml").exists():
        read_junit(out / f"{tree.name}.xml", tree / "tests", outcome)
    return outcome


def pytest(args: argparse.Namespace, tree: Path, selection: list[str], stem: Path) -> int:
    """Runs ``selection`` in ``tree`` as Lightning's CI does; the junit file and log are ``stem``.xml/.log."""
    junit, log = stem.with_suffix(".xml"), stem.with_suffix(".log")
    # not Lightning's: without `--continue-on-collection-errors`, a test module that fails to import stops the whole
    # run (no result at all); with it, the module counts as one failure and the rest runs
    command = [args.python, "-m", "pytest", *selection, "-p", "no:cacheprovider", "--color=no", "-rfE"]
    command += ["--continue-on-collection-errors"]
    command += [
        f"--junitxml={junit}",
        f"--timeout={args.timeout}",
        *(["-n", str(args.workers)] if args.workers > 1 else []),
    ]
    command += args.pytest_args
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    started = time.monotonic()
    print(f"cd {tree / 'tests'} && PYTHONPATH=src {' '.join(command[1:])}", flush=True)
    with log.open("w") as stream:
        returncode = subprocess.run(
            command, cwd=tree / "tests", env=env, stdout=stream, stderr=subprocess.STDOUT
        ).returncode
    tail = log.read_text().splitlines()[-1:] if log.exists() else []
    print(
        f"{time.strftime('%H:%M:%S')} {time.monotonic() - started:.0f} s: {tail[0] if tail else 'no output'}",
        flush=True,
    )
    return returncode


def failures(outcome: Outcome) -> set[str]:
    """What failed in ``outcome``, less what passed when run again on its own."""
    return {t for t, r in outcome.results.items() if r == "failed" and t not in outcome.flaky}


def new_failures(outcome: Outcome, stock: Optional[Outcome]) -> list[str]:
    """What fails in ``outcome`` and not in ``stock`` (flaky ones left out of both)."""
    return sorted(failures(outcome) - (failures(stock) if stock and stock is not outcome else set()))


def recheck(args: argparse.Namespace, outcome: Outcome, stock: Optional[Outcome], out: Path) -> None:
    """Runs a rung's new failures (stock's: all) again, on their own: those that pass now are flaky (load, order).

    A stock failure that passes on its own is no failure of stock's: the same test failing with the patches is new.
    """
    again = [t for t in new_failures(outcome, stock) if "::" in t]  # not the modules that failed to import
    if not again or len(again) > args.recheck or outcome.tree is None:
        return
    print(f"[{outcome.rung}] running its {len(again)} new failures again", flush=True)
    rerun = Outcome(outcome.rung, outcome.patches)
    stem = out / f"{outcome.tree.name}-recheck"
    pytest(args, outcome.tree, again, stem)
    if stem.with_suffix(".xml").exists():
        read_junit(stem.with_suffix(".xml"), outcome.tree / "tests", rerun)
    outcome.flaky = sorted(t for t in again if rerun.results.get(t) == "passed")


def table(outcomes: list[Outcome], header: str) -> tuple[str, int]:
    """The markdown table of the ladder, with the new failures of each rung; and how many new failures there are."""
    stock = next((o for o in outcomes if not o.patches and o.applied), None)
    old_failures = failures(stock) if stock else set()
    lines = [header, "", "| patches | passed | failed | skipped | new failures | flaky | seconds |"]
    lines.append("|---|---|---|---|---|---|---|")
    details: list[str] = []
    new_total = 0
    for o in outcomes:
        names = ", ".join(f"{p.number:04d}" for p in o.patches) or "none"
        label = f"{o.rung} ({names})" if o.rung not in ("none",) else "none"
        if not o.applied:
            lines.append(f"| {label} | - | - | - | does not apply | - | - |")
            details += [f"### {label}: `git am -3` failed", "", "```", o.apply_error[:3000], "```", ""]
            new_total += 1
            continue
        new = new_failures(o, stock)
        if not o.results:
            new = [f"(no results: pytest exited with {o.returncode})"]
        new_total += len(new)
        shown = "-" if o is stock else (str(len(new)) if new else "0")
        counts = f"{o.count('passed')} | {o.count('failed')} | {o.count('skipped')}"
        lines.append(f"| {label} | {counts} | {shown} | {len(o.flaky)} | {o.seconds:.0f} |")
        if o.flaky:
            details += [f"### {label}: failed, then passed on their own (not counted as new)", ""]
            details += [f"- `{tid}`: {(o.messages.get(tid, '').splitlines() or [''])[0][:200]}" for tid in o.flaky] + [
                ""
            ]
        if new and o is not stock:
            details += [f"### {label}: {len(new)} new failures", ""]
            causes: dict[str, int] = {}
            for tid in new:
                first = (o.messages.get(tid, "").splitlines() or ["?"])[0][:200]
                causes[first] = causes.get(first, 0) + 1
            if len(new) > 10:
                details += ["By first line of the error:", ""]
                details += [f"- {n} x `{cause}`" for cause, n in sorted(causes.items(), key=lambda c: -c[1])[:10]]
                details += ["", "The tests:", ""]
            for tid in new[:40]:
                first = o.messages.get(tid, "").splitlines()
                details.append(f"- `{tid}`: {first[0][:300] if first else ''}")
            if len(new) > 40:
                details.append(f"- ... and {len(new) - 40} more")
            details.append("")
    if stock:
        failing = sorted(old_failures)
        details += [f"Stock failures ({len(failing)}): " + (", ".join(f"`{t}`" for t in failing) or "none"), ""]
    return "\n".join([*lines, "", *details]), new_total


def run(args: argparse.Namespace) -> int:
    """The ladder: builds the tree, runs each rung, writes the table; 1 if any rung has a new failure."""
    patches = series(Path(args.series))
    rungs = args.patches or ["none", "core", "all"]
    if "none" not in rungs:
        rungs = ["none", *rungs]  # the baseline that "new" is measured against
    versions = subprocess.run(
        [
            args.python,
            "-c",
            "import sys, torch, importlib.metadata as m\n"
            "def v(n):\n  try: return m.version(n)\n  except Exception: return 'absent'\n"
            "print(f'python {sys.version.split()[0]}, torch {torch.__version__},'\n"
            '      f\' deepspeed {v("deepspeed")}, pytest {v("pytest")}\')',
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    out = Path(args.out or ROOT / ".work" / "lightning-ci" / versions.split("torch ")[1].split(",")[0].split("+")[0])
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"{versions}; Lightning from {args.lightning}; series {args.series}: {len(patches)} patches; results in {out}"
    )
    tmp = Path(tempfile.mkdtemp(prefix="lightning-ci-", dir=args.tmp))
    try:
        base = base_repository(Path(args.lightning), tmp)
        outcomes = []
        for spec in rungs:
            outcomes.append(run_rung(args, base, tmp, spec, patches, out))
            stock = next((o for o in outcomes if not o.patches and o.applied), None)
            if outcomes[-1].applied:
                recheck(args, outcomes[-1], stock, out)
    finally:
        if args.keep_trees:
            print(f"trees kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    header = f"## Lightning's CI on {versions}\n\nLightning: {args.lightning}; series: {args.series}"
    text, new_total = table(outcomes, header)
    print("\n" + text)
    (out / "table.md").write_text(text + "\n")
    if args.table:
        Path(args.table).write_text(text + "\n")
    return 1 if new_total else 0


def main(argv: Optional[list[str]] = None) -> int:
    """The command line: `requirements`, `run` or `excludes`."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    default_lightning = os.environ.get("LCP_LIGHTNING_MASTER", str(DEFAULT_LIGHTNING))
    reqs = commands.add_parser("requirements", help="Lightning's test requirements, in one file")
    reqs.add_argument("--lightning", default=default_lightning)
    reqs.add_argument("--out", required=True)
    reqs.add_argument("--drop", action="append", default=[], help="a package to leave out (repeatable)")
    ladder = commands.add_parser("run", help="the ladder: stock, then each --patches rung")
    ladder.add_argument("--lightning", default=default_lightning, help="Lightning master: its archive or a clone")
    ladder.add_argument(
        "--python", default=sys.executable, help="the environment's python (torch, Lightning's test requirements)"
    )
    ladder.add_argument("--series", default=str(SERIES))
    ladder.add_argument("--patches", action="append", help="a rung: none, core, all, N, or 1,3-5 (repeatable)")
    ladder.add_argument(
        "--core-subject", default=CORE_SUBJECT, help="the subject with which the core's last patch starts"
    )
    ladder.add_argument("--tests", action="append", help="instead of the default selection (relative to tests/)")
    ladder.add_argument("--workers", type=int, default=int(os.environ.get("LCP_LIGHTNING_CI_WORKERS", "1")))
    ladder.add_argument("--timeout", type=int, default=300, help="pytest-timeout's limit per test, in seconds")
    ladder.add_argument("--recheck", type=int, default=60, help="run a rung's new failures again, up to this many")
    ladder.add_argument("--out", help="junit files, logs and table.md (default .work/lightning-ci/TORCH)")
    ladder.add_argument("--table", help="also write the table here")
    ladder.add_argument("--tmp", help="where the trees are built (default: the system's temp directory)")
    ladder.add_argument("--keep-trees", action="store_true")
    ladder.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments")
    excludes = commands.add_parser("excludes", help="`--exclude` for the test files a patch changes and . lacks")
    excludes.add_argument("patch", type=Path)
    args = parser.parse_args(argv)
    if args.command == "excludes":
        print(*(f"--exclude={path}" for path in absent_tests(Path(), [Patch(0, args.patch, "")])))
        return 0
    return requirements(args) if args.command == "requirements" else run(args)


if __name__ == "__main__":
    sys.exit(main())
