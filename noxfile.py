"""Sessions: `lint`, `tests`, `tests_torch`, `real_models`, `wheel`, `parity` (what CI runs), `demo`, `patches`,
`lightning_suite` (Lightning's own tests, stock and compiled), `lightning_ci` (Lightning's own tests of the files the
series touches, on Lightning master, torch 2.1.2 and 2.9.1 with DeepSpeed; not in CI's list).

torch is installed first and pinned, and every later install is constrained to it: `torch==2.13.0` is a CPU wheel on
local disk here, while other versions are CUDA builds (about 4 GB with their nvidia libraries, which run on CPU too),
and `transformers`' newest release would pull a newer torch.

CI's disk is small and not ours: every session but `demo` (which CI does not run) deletes its environment when it ends
(set ``LCP_KEEP_ENVS=1`` to keep them and reuse them next time), and a CUDA torch is installed one requirement at a
time, so that pip never holds all of its downloads beside the installed copy. The largest session then needs about 7 GB
at its peak.
"""

import functools
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nox

#: Every session writes bytecode for what it imports, even where the shell says not to (PYTHONDONTWRITEBYTECODE, set on
#: this project's machines): its first process writes it, and every later one reads it (each test worker, each rank a
#: test spawns, inductor's compile workers). Installed with `--no-compile` and not written, importing torch and
#: Lightning took 12 to 13 s in each process, against 4.5 to 5 s from bytecode.
os.environ["PYTHONDONTWRITEBYTECODE"] = ""
nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True

ROOT = Path(__file__).parent
TORCH = "torch==2.13.0"
LIGHTNING = ("lightning==2.6.6", "pytorch-lightning==2.6.6")
PYTEST_WORKERS = os.environ.get("LCP_PYTEST_WORKERS", "2")
KEEP_ENVS = os.environ.get("LCP_KEEP_ENVS") == "1"
#: Lightning master at the base of `patches/lightning-master/`: its archive, or a clone at that commit.
LIGHTNING_MASTER = os.environ.get(
    "LCP_LIGHTNING_MASTER", str(ROOT.parent / "shared" / "lightning-tests" / "lightning-master-7f0c3436cd.tar.gz")
)
#: Lightning 2.6.5's tests (those of 2.6.6): their archive, or a clone at the tag (`tools/lightning_suite/run.py`).
LIGHTNING_TESTS = os.environ.get(
    "LCP_LIGHTNING_TESTS", str(ROOT.parent / "shared" / "lightning-tests" / "lightning-2.6.5-tests.tar.gz")
)


def pip_install(session: nox.Session, *args: str, **kwargs: Any) -> None:
    """`pip install --no-compile`: a session imports a part of what it installs (of torch, above all), and byte-compiles
    that part on import (see `PYTHONDONTWRITEBYTECODE` above) rather than all of it at install: torch 2.13.0 installs in
    11 s against 28 s, Lightning with the package in 17 s against 25 s."""
    session.install("--no-compile", *args, **kwargs)


def require_lightning_sources(session: nox.Session, path: str, variable: str) -> None:
    """Fails before installing anything when Lightning's sources that a session reads are not where it looks."""
    if not Path(path).exists():
        session.error(
            f"{path} does not exist. Lightning's sources are read from `../shared/lightning-tests/` beside this clone:"
            f" clone the project beside `shared/` (as CI does), or set {variable} to the archive, or to a clone of"
            " Lightning at that commit."
        )


#: The torch versions the behaviour suite also runs on, besides 2.13.0: the oldest supported, Lightning's CI torch, the
#: newest this machine keeps on disk, the newest release. CI runs the oldest and the newest (`CI_TORCH`), where torch
#: differs most from 2.13: each leg is a 4 GB install; the others run with `nox -s "tests_torch(torch='2.14.1')"`.
OTHER_TORCH = ("2.6.0", "2.9.1", "2.14.1", "2.15.0")
CI_TORCH = ("2.6.0", "2.15.0")
CI_SESSIONS = ["lint", "tests", "real_models", "wheel", "parity", "lightning_suite"]
#: The libraries of `downstream` that CI installs: the two with small installs (the others bring Ray, Optuna, numba).
CI_DOWNSTREAM = "pytorch_tabular,pytorch_forecasting"
nox.options.sessions = [*CI_SESSIONS, f"downstream(libraries='{CI_DOWNSTREAM}')"]
nox.options.sessions += [f"tests_torch(torch='{t}')" for t in CI_TORCH]


def discards_env(run: Callable[..., None]) -> Callable[..., None]:
    """Deletes the session's environment when it ends, pass or fail, unless ``LCP_KEEP_ENVS=1``."""

    @functools.wraps(run)
    def session_then_discard(session: nox.Session, **params: str) -> None:
        try:
            run(session, **params)
        finally:
            if not KEEP_ENVS:
                shutil.rmtree(session.virtualenv.location, ignore_errors=True)

    return session_then_discard


def install_torch(session: nox.Session, torch: str, constraints: Path) -> None:
    """``torch`` itself, then, for a CUDA build, each of its requirements in its own pip call.

    A CUDA build is about 4 GB with its nvidia libraries. Installed in one call, pip downloads all of them (about 3 GB)
    before it installs any; one at a time, the download folder holds one package. `--no-cache-dir`: not kept a second
    time in pip's cache.
    """
    if torch == TORCH:  # the CPU wheel on local disk
        pip_install(session, torch)
        return
    # this machine's pip configuration caps torch at the newest release it keeps on disk (2.14.1); the session reads
    # no configuration file, so that a newer torch (2.15) installs from the registry with no step by hand
    session.env["PIP_CONFIG_FILE"] = os.devnull
    pip_install(session, "--no-cache-dir", "--no-deps", torch)
    listed = "import importlib.metadata as m; print(*m.requires('torch'), sep='\\n')"
    requirements = session.run("python", "-c", listed, silent=True).splitlines()
    for requirement in (r for r in requirements if "extra ==" not in r):
        pip_install(session, "--no-cache-dir", "-c", str(constraints), requirement)


def install(session: nox.Session, *extras: str, torch: str = TORCH, pins: tuple[str, ...] = ()) -> None:
    """torch first, then Lightning and the package (editable) with ``extras``, all constrained to that torch and to
    ``pins`` (an extra's requirement held at one release)."""
    # beside the environment, not in `session.create_tmp()`: that sets TMPDIR inside the repository for the tests
    constraints = Path(session.virtualenv.location) / "constraints.txt"
    constraints.write_text("".join(f"{line}\n" for line in (torch, *pins)))
    install_torch(session, torch, constraints)
    pip_install(session, "-c", str(constraints), *LIGHTNING, "-e", f".[{','.join(extras)}]" if extras else ".")


@nox.session
@discards_env
def tests(session: nox.Session) -> None:
    """The behaviour suite against stock Lightning with `import lightning_compile_patch`, on torch 2.13.0.

    With it, pyproject's other test paths: the benchmarks' tests, and the workbench's tools' tests (`tools/tests`).
    """
    install(session, "test")
    pytest_args = ("-n", PYTEST_WORKERS, "--ignore=tests/real_models", "--ignore=tests/downstream", *session.posargs)
    session.run("python", "-m", "pytest", *pytest_args, env={"LCP_TARGET": "package"})


@nox.session
@nox.parametrize("torch", OTHER_TORCH)
@discards_env
def tests_torch(session: nox.Session, torch: str) -> None:
    """The behaviour suite on another torch: `nox -s "tests_torch(torch='2.6.0')"`, or all four with `tests_torch`."""
    install(session, "test", torch=f"torch=={torch}")
    # the behaviour suite (`tests/`) only: the seed script, the benchmarks' and the workbench's tests check the
    # project's scripts, not behaviour (on 2.13.0, in `tests`); the slow tests (multi-process and inductor cases, about
    # two thirds of the suite's time) run on 2.13.0 in `tests`, which keeps CI under 45 minutes: `-- -m ""` runs
    # them here too
    skip = ("--ignore=tests/real_models", "--ignore=tests/downstream", "--ignore=tests/test_seed.py")
    pytest_args = ("-n", PYTEST_WORKERS, "tests", *skip, "-m", "not slow", *session.posargs)
    session.run("python", "-m", "pytest", *pytest_args, env={"LCP_TARGET": "package"})


#: Libraries built on Lightning, each of which builds its own Trainer from its user's arguments (`tests/downstream`):
#: the module each case needs, and its pin on the package registry.
DOWNSTREAM = {
    "neuralforecast": "neuralforecast==3.3.0",
    "darts": "darts==0.48.1",
    "pytorch_tabular": "pytorch-tabular==1.2.0",
    "pytorch_forecasting": "pytorch-forecasting==1.8.0",
}


@nox.session
@nox.parametrize("libraries", ["all", CI_DOWNSTREAM])
@discards_env
def downstream(session: nox.Session, libraries: str) -> None:
    """Models of libraries built on Lightning, trained eager and with `use_compile` passed through their own arguments.

    `downstream(libraries='all')` installs all four (with Ray, Optuna, statsmodels: a few minutes); CI runs the two
    whose installs are small. Options after `--` go to pytest.
    """
    install(session, "test")
    chosen = list(DOWNSTREAM) if libraries == "all" else libraries.split(",")
    constraints = Path(session.virtualenv.location) / "constraints.txt"
    constraints.write_text(constraints.read_text() + "".join(f"{pin}\n" for pin in LIGHTNING))
    # pytorch-tabular 1.2.0 imports `requests` without requiring it (the others bring it)
    pip_install(session, "-c", str(constraints), *(DOWNSTREAM[name] for name in chosen), "requests")
    table = ROOT / ".nox" / "downstream.md"  # each case's steps, compiled and eager, and why
    table.unlink(missing_ok=True)
    pytest_args = ("-n", PYTEST_WORKERS, "tests/downstream", *session.posargs)
    session.run(
        "python",
        "-m",
        "pytest",
        *pytest_args,
        env={"LCP_DOWNSTREAM": ",".join(chosen), "LCP_DOWNSTREAM_TABLE": str(table)},
    )


@nox.session
@discards_env
def real_models(session: nox.Session) -> None:
    """HF transformers (Llama, BERT, ViT) and Lightning's demo Transformer through the Trainer (`tests/real_models`)."""
    # held at one release in the one install (the extra alone takes the newest, which a second install replaced)
    install(session, "test,real-models", pins=("transformers==5.24.0",))
    session.run("python", "-m", "pytest", "-n", PYTEST_WORKERS, "tests/real_models", *session.posargs)


@nox.session
@discards_env
def wheel(session: nox.Session) -> None:
    """Builds the wheel, installs it (not the source tree) in a fresh environment, and runs one compiled fit from it."""
    dist = Path(session.create_tmp()) / "dist"
    pip_install(session, "build")
    session.run("python", "-m", "build", "--wheel", "--outdir", str(dist), ".")
    [built] = dist.glob("lightning_compile_patch-*.whl")
    constraints = Path(session.create_tmp()) / "constraints.txt"
    constraints.write_text(TORCH + "\n")
    pip_install(session, TORCH)
    pip_install(session, "-c", str(constraints), LIGHTNING[0], str(built))
    session.chdir(session.create_tmp())  # away from the source tree: the import must come from the wheel
    session.run("python", str(ROOT / "tools" / "wheel_smoke.py"))


@nox.session(venv_backend="virtualenv")  # nox's own dependency: it seeds pip in 1 s, where `venv` takes 5 to 10
def demo(session: nox.Session) -> None:
    """The main job on CPU: a small GPT trained eagerly, with Lightning's own compile and with `use_compile`."""
    # One pip run, to leave the demo its two minutes on a loaded machine. `--no-compile`: byte-compiling all of torch
    # at install takes longer (47 s against 13 s on a loaded 2-core machine) than compiling, on import, the part the
    # demo imports; `pytorch-lightning` is not needed. The package is imported from `src/` rather than installed: an
    # editable install builds it in an isolated environment of its own (7 s idle, twice that loaded), and the `wheel`
    # session tests the installed package. The environment is kept (about 1 GB; the next `nox -s demo` reuses it):
    # deleting it took 34 s beside the test suite.
    pip_install(session, TORCH, LIGHTNING[0])  # one resolve: Lightning's torch is this torch
    # Beside the test suite, importing torch and Lightning took 10 s without bytecode, 3.9 s with it (see above).
    env = {"PYTHONPATH": str(ROOT / "src")}
    session.run("python", "examples/demo.py", *session.posargs, env=env)


@nox.session
@discards_env
def lint(session: nox.Session) -> None:
    pip_install(session, "ruff==0.15.9")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def patches(session: nox.Session) -> None:
    """Regenerates patches/ from the package: `nox -s patches -- PATH/TO/pytorch-lightning` (a clone of Lightning)."""
    if not session.posargs:
        session.error("pass a clone of Lightning-AI/pytorch-lightning (its 2.6.5 tag holds the docs and tests)")
    pip_install(session, "pip")
    base = Path(session.create_tmp()) / "lightning-base"
    session.run("python", "tools/lightning_base.py", "--out", str(base), "--lightning-repo", session.posargs[0])
    session.run("python", "tools/patchset.py", "write", "--base-name", "2.6.6", "--base", str(base))
    session.run("python", "tools/patchset.py", "check", "--base-name", "2.6.6", "--base", str(base))


@nox.session
@discards_env
def parity(session: nox.Session) -> None:
    """The behaviour suite against Lightning 2.6.6 built with patches/ applied, and without this package.

    Also checks patches/ against the package (drift), runs the series' own upstream-style tests, and each rung a
    maintainer would merge against Lightning master and two mutants (`tools/upstream/rung_tests.py`).
    """
    require_lightning_sources(session, LIGHTNING_MASTER, "LCP_LIGHTNING_MASTER")
    pip_install(session, TORCH)
    pip_install(session, LIGHTNING[0], "pytest>=8", "pytest-xdist>=3.5", "pytest-timeout", "hypothesis", "pyyaml")
    pip_install(session, "jsonargparse[signatures,jsonnet]>=4.39")  # what Lightning master's CLI needs (its CLI tests)
    base = Path(session.create_tmp()) / "lightning-base"
    session.run("python", "tools/lightning_base.py", "--out", str(base))
    session.run("python", "tools/patchset.py", "check", "--base-name", "2.6.6", "--base", str(base))
    session.run("python", "tools/patchset.py", "check", "--base-name", "master")
    git_identity = {"GIT_COMMITTER_NAME": "parity", "GIT_COMMITTER_EMAIL": "parity@lightning-compile-patch.invalid"}
    series = sorted(str(p) for p in (ROOT / "patches" / "lightning-2.6.6").glob("*.patch"))
    # the sdist has Lightning's src/ but neither docs/ nor tests/: apply what it has, which is what gets installed
    session.run("git", "-C", str(base), "am", "-q", "--include=src/*", *series, external=True, env=git_identity)
    pip_install(session, "--no-deps", "--force-reinstall", str(base))
    # the slow tests (multi-process and inductor cases) run against the package in `tests`; the rest here
    suite = ("-n", PYTEST_WORKERS, "tests", "--ignore=tests/real_models", "--ignore=tests/downstream", "-m", "not slow")
    suite += tuple(session.posargs)
    session.run("python", "-m", "pytest", *suite, env={"LCP_TARGET": "upstream"})
    harness = str(ROOT / "tools" / "upstream" / "harness")
    session.run("python", "-m", "pytest", "-n", PYTEST_WORKERS, "tools/upstream/tests", env={"PYTHONPATH": harness})
    # the rungs a maintainer would merge, each alone on Lightning master: their tests fail on master, pass with the
    # rung, and fail on two mutants of the compile point (before the launch, as master; after the `on_fit_start` hooks)
    session.run(
        "python",
        "tools/upstream/rung_tests.py",
        "--lightning",
        LIGHTNING_MASTER,
        "--workers",
        PYTEST_WORKERS,
        "--table",
        str(ROOT / ".nox" / "rung_tests.md"),
    )


#: What Lightning's own tests of the suite's selection need beside Lightning (its `requirements/pytorch/test.txt` and
#: `extra.txt` at 2.6.5, less what the selection skips or does not import: no torchvision, which does not load with
#: torch 2.13.0 CPU, no onnx, deepspeed, or loggers' services).
LIGHTNING_TEST_REQUIREMENTS = (
    "pytest==9.0.2",
    "pytest-xdist>=3.5",
    "pytest-timeout",
    "pytest-rerunfailures",
    "cloudpickle",
    "psutil",
    "scikit-learn",
    "pandas",
    "tensorboard",
    "torchmetrics",
    "omegaconf",
    "hydra-core",
    "jsonargparse[signatures]>=4.39",
    "rich",
    "pyyaml",
)


@nox.session
@discards_env
def lightning_suite(session: nox.Session) -> None:
    """Lightning's own tests stock and compiled (aot_eager), compared test by test; fails on a new failure.

    The tests come from `LCP_LIGHTNING_TESTS` (default: `../shared/lightning-tests/lightning-2.6.5-tests.tar.gz`, or a
    clone of Lightning at 2.6.5). Options after `--` go to `tools/lightning_suite/run.py`: `--selection full`,
    `--modes stock,compiled,regions`, `--flavour pytorch_lightning`, ...
    """
    require_lightning_sources(session, LIGHTNING_TESTS, "LCP_LIGHTNING_TESTS")
    install(session)
    constraints = Path(session.virtualenv.location) / "constraints.txt"
    pip_install(session, "-c", str(constraints), *LIGHTNING_TEST_REQUIREMENTS)
    out = Path(session.create_tmp()) / "lightning_suite"
    # the table also beside the environments: the session's own folder goes when it ends (`discards_env`)
    table = ROOT / ".nox" / "lightning_suite.md"
    # every Trainer compiled without Dynamo's reset between tests (one long process per worker, as users run a sweep or
    # a notebook: the stricter of the two compiled modes, which gave the same results on 2026-12-03), then stock on the
    # tests that failed compiled, which is all the comparison needs; compiled imports the package too, so a new failure
    # from the import alone shows there. `-- --modes stock,compiled,imported` (without `--stock-where-failed`) adds the
    # reset mode and the import with `use_compile` unset (CI's 50 minutes leave no room for them), `-- --selection full`
    # is the whole tree (docs/compatibility.md)
    modes = ("--selection", "ci", "--modes", "stock,compiled_no_reset", "--stock-where-failed")
    args = ("--out", str(out), "--table", str(table), "--workers", PYTEST_WORKERS, *modes, *session.posargs)
    session.run("python", "tools/lightning_suite/run.py", *args)


#: Lightning's CI: its "oldest" torch, and the torch of its type checks (`requirements/typing.txt`).
LIGHTNING_CI_TORCH = ("2.1.2", "2.9.1")
#: Lightning's own CI takes DeepSpeed from `requirements/pytorch/strategies.txt`; built here without its ops.
DEEPSPEED = "deepspeed==0.16.9"


@nox.session
@nox.parametrize("torch", LIGHTNING_CI_TORCH)
@discards_env
def lightning_ci(session: nox.Session, torch: str) -> None:
    """Lightning's own tests of what the series touches: stock, with the core, with all of it (`tools/lightning_ci.py`).

    Lightning master's tests, from its source tree (``PYTHONPATH=src``), with its test requirements and DeepSpeed, all
    constrained to ``torch``. Arguments after ``--`` go to `tools/lightning_ci.py run` (``--patches``, ``--workers``).
    """
    started = time.monotonic()
    location = Path(session.virtualenv.location)
    constraints = location / "constraints.txt"
    constraints.write_text(f"torch=={torch}\n")
    install_torch(session, f"torch=={torch}", constraints)
    requirements = location / "lightning-requirements.txt"
    tool = str(ROOT / "tools" / "lightning_ci.py")
    session.run("python", tool, "requirements", "--lightning", LIGHTNING_MASTER, "--out", str(requirements))
    # pytest-xdist is not Lightning's (its CI runs one process): only for `--workers N`
    pip_install(session, "--no-cache-dir", "-c", str(constraints), "-r", str(requirements), "pytest-xdist")
    # DeepSpeed's setup.py imports torch and pkg_resources: no build isolation, and a setuptools that still has it
    pip_install(session, "wheel<0.47", "setuptools<80.10.3")
    pip_install(
        session, "--no-cache-dir", "--no-build-isolation", "-c", str(constraints), DEEPSPEED, env={"DS_BUILD_OPS": "0"}
    )
    installed = time.monotonic()
    session.log(f"lightning_ci(torch={torch}): installed in {installed - started:.0f} s")
    try:
        session.run("python", tool, "run", "--lightning", LIGHTNING_MASTER, *session.posargs)
    finally:
        ran = time.monotonic() - installed
        session.log(f"lightning_ci(torch={torch}): install {installed - started:.0f} s, run {ran:.0f} s")
