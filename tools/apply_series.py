"""Applies the ``patches/`` series to a Lightning fork, all of it or none of it.

    python tools/apply_series.py PATH/TO/pytorch-lightning            # check, then apply
    python tools/apply_series.py PATH/TO/pytorch-lightning --check    # only check, change nothing

Before touching the fork it checks, and stops with the reason if any check fails:

* ``PATH`` is a git work tree with no uncommitted changes and no ``git am`` in progress;
* ``src/version.info`` is 2.6.6 (``--allow-version`` accepts another; expect conflicts);
* the series is not applied already (``Trainer.__init__`` does not take ``use_compile`` yet);
* the whole series applies, tried first on a throwaway worktree of the fork.

Then it runs ``git am --3way`` on the fork. Should that fail anyway, it runs ``git am --abort``, so the fork is left as
it was.

"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERIES = sorted((ROOT / "patches" / "lightning-2.6.6").glob("*.patch"))
EXPECTED_VERSION = "2.6.6"
TRAINER = "src/lightning/pytorch/trainer/trainer.py"


class RefusedError(Exception):
    """The fork cannot take the series; the message says why and what to do."""


def git(fork: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Runs git in ``fork``; with ``check``, a failure becomes a :class:`RefusedError` with git's message."""
    result = subprocess.run(["git", *args], cwd=fork, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RefusedError(f"`git {' '.join(args)}` failed in {fork}:\n{result.stderr.strip()}")
    return result


def check_fork(fork: Path, allow_version: bool) -> None:
    """Raises :class:`RefusedError` unless ``fork`` is a clean Lightning 2.6.6 work tree without the series."""
    if not fork.is_dir() or git(fork, "rev-parse", "--is-inside-work-tree", check=False).returncode != 0:
        raise RefusedError(f"{fork} is not a git work tree. Clone your fork first.")
    top = Path(git(fork, "rev-parse", "--show-toplevel").stdout.strip())
    if top.resolve() != fork.resolve():
        raise RefusedError(f"{fork} is inside the repository {top}; pass the repository's root.")
    if _am_in_progress(fork):
        raise RefusedError(f"a `git am` is in progress in {fork}; finish it or run `git am --abort` first.")
    dirty = git(fork, "status", "--porcelain", "--untracked-files=no").stdout.strip()
    if dirty:
        raise RefusedError(f"{fork} has uncommitted changes; commit or stash them first:\n{dirty}")
    version_file = fork / "src" / "version.info"
    if not version_file.exists() or not (fork / TRAINER).exists():
        raise RefusedError(f"{fork} does not look like Lightning's repository (no src/version.info or {TRAINER}).")
    version = version_file.read_text().strip()
    if version != EXPECTED_VERSION and not allow_version:
        raise RefusedError(
            f"{fork} is Lightning {version}; the series is made for {EXPECTED_VERSION}. Check out {EXPECTED_VERSION},"
            " or pass --allow-version to try anyway (git am --3way will stop on any conflict and nothing is changed)."
        )
    if "use_compile" in (fork / TRAINER).read_text():
        raise RefusedError(f"{fork} already has `use_compile` in {TRAINER}: the series looks applied already.")


def _am_in_progress(fork: Path) -> bool:
    git_dir = Path(git(fork, "rev-parse", "--absolute-git-dir").stdout.strip())
    return (git_dir / "rebase-apply").exists()


def try_on_worktree(fork: Path) -> None:
    """Applies the series on a throwaway worktree of ``fork``'s HEAD; raises with git's report if it does not apply."""
    with tempfile.TemporaryDirectory() as tmp:
        worktree = Path(tmp) / "try"
        git(fork, "worktree", "add", "--detach", "-q", str(worktree), "HEAD")
        try:
            result = git(worktree, "am", "--3way", "-q", *map(str, SERIES), check=False)
            if result.returncode != 0:
                conflicts = git(worktree, "diff", "--name-only", "--diff-filter=U", check=False).stdout.split()
                git(worktree, "am", "--abort", check=False)
                raise RefusedError(
                    "the series does not apply to this fork"
                    + (f"; conflicts in: {', '.join(conflicts)}" if conflicts else "")
                    + f"\n{(result.stdout + result.stderr).strip()}"
                )
        finally:
            git(fork, "worktree", "remove", "--force", str(worktree), check=False)


def apply(fork: Path) -> None:
    """Applies the series with ``git am --3way``; on failure aborts, so that the fork is unchanged."""
    result = git(fork, "am", "--3way", "-q", *map(str, SERIES), check=False)
    if result.returncode != 0:
        git(fork, "am", "--abort", check=False)
        raise RefusedError(f"`git am` failed and was aborted; the fork is unchanged:\n{result.stderr.strip()}")


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("fork", type=Path)
    parser.add_argument("--check", action="store_true", help="only check that the series applies")
    parser.add_argument("--allow-version", action="store_true", help="try a Lightning other than 2.6.6")
    args = parser.parse_args(argv)
    try:
        check_fork(args.fork, args.allow_version)
        try_on_worktree(args.fork)
        if not args.check:
            apply(args.fork)
    except RefusedError as error:
        print(f"apply_series: {error}", file=sys.stderr)
        return 1
    print(f"{len(SERIES)} patches {'apply cleanly to' if args.check else 'applied to'} {args.fork}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
