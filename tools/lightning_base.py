"""Builds the Lightning 2.6.6 tree the patch series applies to, as a git repository with one commit.

    python tools/lightning_base.py --out .work/base                                   # src/ only, from PyPI
    python tools/lightning_base.py --out .work/base --lightning-repo PATH --tag 2.6.5  # with docs/ and tests/

The PyPI sdist of ``lightning==2.6.6`` has Lightning's ``src/`` layout but no ``docs/`` and no ``tests/``, and the
repository has no 2.6.6 tag. So the full base is the repository at 2.6.5 (the nearest tag) with ``src/`` and the
packaging files of the 2.6.6 sdist laid over it; between 2.6.5 and 2.6.6 only ``src/`` changed (the CHANGELOG and
``core/saving.py``). Without ``--lightning-repo`` the base is the sdist alone, which is enough to build and install
the patched package (``git am --include='src/*'``).

"""

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "2.6.6"
#: Committer identity and date of the base commit, fixed so that the base is the same everywhere.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Lightning base",
    "GIT_AUTHOR_EMAIL": "base@lightning-compile-patch.invalid",
    "GIT_COMMITTER_NAME": "Lightning base",
    "GIT_COMMITTER_EMAIL": "base@lightning-compile-patch.invalid",
    "GIT_AUTHOR_DATE": "2026-09-10T00:00:00+00:00",
    "GIT_COMMITTER_DATE": "2026-09-10T00:00:00+00:00",
}
REPO_PATHS = ("docs", "tests", ".actions", "requirements")


def git(*args: str, cwd: Path, **kwargs: object) -> subprocess.CompletedProcess:
    """Runs git in ``cwd`` with the fixed identity of the base commit."""
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, **kwargs)


def download_sdist(dest: Path) -> Path:
    """The ``lightning==2.6.6`` sdist from PyPI."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(dest)]
    subprocess.run([*command, f"lightning=={VERSION}"], check=True, capture_output=True)
    return next(dest.glob(f"lightning-{VERSION}.tar.gz"))


def extract_sdist(sdist: Path, out: Path) -> None:
    """Lays the sdist's files over ``out``, its egg-info too: building from the tree reads the data files from it."""
    with tarfile.open(sdist) as archive, tempfile.TemporaryDirectory() as tmp:
        archive.extractall(tmp, filter="data")
        root = Path(tmp) / f"lightning-{VERSION}"
        for item in root.rglob("*"):
            relative = item.relative_to(root)
            if item.is_dir():
                continue
            target = out / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(item, target)


def export_repo_paths(repo: Path, tag: str, out: Path) -> int:
    """Writes the files under :data:`REPO_PATHS` at ``tag`` into ``out``; returns how many were missing blobs."""
    listing = git("ls-tree", "-r", "-z", tag, "--", *REPO_PATHS, cwd=repo).stdout.split(b"\0")
    missing = 0
    for entry in filter(None, listing):
        meta, path = entry.split(b"\t", 1)
        mode, kind, sha = meta.split()
        if kind != b"blob":
            continue
        blob = subprocess.run(["git", "cat-file", "blob", sha.decode()], cwd=repo, capture_output=True)
        if blob.returncode != 0:
            missing += 1  # large binaries the snapshot lacks; none of them is code the series touches
            continue
        target = out / path.decode()
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(blob.stdout)
        if mode == b"100755":
            target.chmod(0o755)
    return missing


def build(out: Path, sdist: Path | None, lightning_repo: Path | None, tag: str) -> Path:
    """Creates ``out`` as a git repository holding the base tree; returns ``out``."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    if lightning_repo is not None:
        missing = export_repo_paths(lightning_repo, tag, out)
        print(f"docs/ and tests/ from {lightning_repo} at {tag} ({missing} binary blobs absent from the snapshot)")
    with tempfile.TemporaryDirectory() as tmp:
        sdist = sdist or download_sdist(Path(tmp))
        extract_sdist(sdist, out)
    git("init", "-q", "-b", "base", cwd=out)
    git("add", "-A", cwd=out)
    git("commit", "-q", "-m", f"Lightning {VERSION}", cwd=out)
    print(f"base: {out} ({git('rev-parse', 'HEAD', cwd=out).stdout.decode().strip()})")
    return out


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sdist", type=Path, help=f"lightning-{VERSION}.tar.gz (default: download it from PyPI)")
    parser.add_argument("--lightning-repo", type=Path, help="a clone of Lightning-AI/pytorch-lightning")
    parser.add_argument("--tag", default="2.6.5", help="the repository tag to take docs/ and tests/ from")
    args = parser.parse_args(argv)
    build(args.out, args.sdist, args.lightning_repo, args.tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
