"""Sessions: `nox -s tests` (what CI runs, with `parity`), `demo`, `lint`, `patches`, `parity`, `bench`.

torch is installed first and pinned: `torch==2.13.0` is a CPU wheel on local disk here, while a plain `torch`
requirement would pull a multi-GB CUDA build.
"""

import os
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "tests", "parity"]

ROOT = Path(__file__).parent
TORCH = "torch==2.13.0"
LIGHTNING = ("lightning==2.6.6", "pytorch-lightning==2.6.6")
PYTEST_WORKERS = os.environ.get("LCP_PYTEST_WORKERS", "2")


def install(session: nox.Session, *extras: str) -> None:
    session.install(TORCH)
    session.install(*LIGHTNING, "-e", f".[{','.join(extras)}]" if extras else ".")


@nox.session
def tests(session: nox.Session) -> None:
    """The behaviour suite against stock Lightning with `import lightning_compile_patch`."""
    install(session, "test")
    session.run("python", "-m", "pytest", "-n", PYTEST_WORKERS, *session.posargs, env={"LCP_TARGET": "package"})


@nox.session
def demo(session: nox.Session) -> None:
    """The main job on CPU: a small GPT trained eagerly, then compiled after the wrap, side by side."""
    install(session)
    session.run("python", "-m", "lightning_compile_patch.demo", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
