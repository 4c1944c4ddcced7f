"""A pytest plugin that runs Lightning's own tests in one mode and records each test's outcome and compiled runs.

Loaded with ``-p lightning_suite.plugin`` (``tools/`` on ``PYTHONPATH``), configured by environment variables:

* ``LCP_SUITE_MODE``: ``stock`` (this package not imported), ``imported`` (imported, ``use_compile`` left unset) or
  ``compiled`` (every ``Trainer(...)`` built without ``use_compile`` gets ``LCP_SUITE_COMPILE``).
* ``LCP_SUITE_COMPILE``: the JSON value ``compiled`` passes, ``{"backend": "aot_eager"}`` by default; ``true`` or
  ``{"backend": "aot_eager", "regions": "auto"}`` work too, and ``false`` tests ``use_compile=False``.
* ``LCP_SUITE_FLAVOUR``: ``lightning.pytorch`` (default) or ``pytorch_lightning``, the Trainer whose default changes.
* ``LCP_SUITE_TARGET``: ``package`` (default) or ``upstream``, a Lightning with ``patches/`` applied that takes
  ``use_compile`` natively; this package is then never imported.
* ``LCP_SUITE_DYNAMO_RESET``: ``0`` keeps Dynamo's caches from test to test (see ``pytest_runtest_setup``).
* ``LCP_SUITE_RECORDS``: a folder; each process appends one JSON line per test to its own ``<worker>-<pid>.jsonl``.

A record: ``{"nodeid", "outcome": passed|failed|skipped|error, "error": first line or null, "seconds", "runs": [...]}``,
with, per ``fit``/``validate``/``test``/``predict`` called in the test's own process, what ran compiled
(``last_summary``).
"""

import functools
import importlib
import importlib.util
import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

MODE = os.environ.get("LCP_SUITE_MODE", "stock")
TARGET = os.environ.get("LCP_SUITE_TARGET", "package")
FLAVOUR = os.environ.get("LCP_SUITE_FLAVOUR", "lightning.pytorch")
DEFAULT_COMPILE = json.loads(os.environ.get("LCP_SUITE_COMPILE", '{"backend": "aot_eager"}'))
RESET_DYNAMO = os.environ.get("LCP_SUITE_DYNAMO_RESET", "1") != "0"
_ENTRY_POINTS = ("fit", "validate", "test", "predict")
_ORDER = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}

#: Each test's record so far, by node id: the xdist controller sees several tests at once, a process one at a time.
_records: dict[str, dict[str, Any]] = {}
#: The test running in this process, to which a run belongs.
_running: list[str] = []
#: The file this process appends to: ``controller`` in xdist's controller, which sees a crashed worker's last test.
_process: list[str] = []


def _summary_of(trainer: Any) -> Optional[Any]:
    """The compile summary of ``trainer``'s last run that compiled, on either target.

    The run summary keeps it in its module, beside the Trainer's connector: the package's (of this flavour), or a
    patched Lightning's (as ``lightning_compile_patch.last_summary`` finds it).

    """
    connector = getattr(trainer, "_compile_connector", None)
    if connector is None:
        return None
    summary = sys.modules.get(f"{type(connector).__module__.rpartition('.')[0]}.compile_features.summary")
    return summary.last_summary(trainer) if summary is not None else None


def _run_record(fn: str, summary: Any, error: Optional[BaseException]) -> dict[str, Any]:
    record: dict[str, Any] = {"fn": fn, "error": None if error is None else type(error).__name__}
    if summary is None:
        return {**record, "compiled": False}
    return {
        **record,
        "compiled": True,
        "stage": summary.stage,
        "graphs": summary.graphs,
        "recompiles": summary.recompiles,
        "compiled_steps": dict(summary.compiled_steps),
        "eager_steps": dict(summary.eager_steps),
        "eager_causes": dict(getattr(summary, "eager_causes", {}) or {}),
        "parts_steps": dict(
            getattr(summary, "parts_steps", {}) or {}
        ),  # their own code eagerly, what they call compiled
        "recompile_limit_hits": [str(hit) for hit in summary.recompile_limit_hits],
    }


def _recording(entry_point: Callable[..., Any]) -> Callable[..., Any]:
    """``fit``/... that record, after the run, what it compiled: a summary only if this run made a new one."""

    @functools.wraps(entry_point)
    def record(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = _summary_of(self)
        error: Optional[BaseException] = None
        try:
            return entry_point(self, *args, **kwargs)
        except BaseException as exc:
            error = exc
            raise
        finally:
            after = _summary_of(self)
            if _running and _running[-1] in _records:
                run = _run_record(entry_point.__name__, after if after is not before else None, error)
                _records[_running[-1]]["runs"].append(run)

    return record


def _defaulting(init: Callable[..., Any], value: Any) -> Callable[..., Any]:
    """``Trainer.__init__`` with ``use_compile=value`` where the caller gives none; same signature and markers."""

    @functools.wraps(init)
    def default_use_compile(self: Any, *args: Any, **kwargs: Any) -> Any:
        if "use_compile" not in kwargs and "PL_TRAINER_USE_COMPILE" not in os.environ:
            kwargs["use_compile"] = value
        return init(self, *args, **kwargs)

    return default_use_compile


def _configure_as_the_package() -> None:
    """A patched Lightning with the package's features on for every ``use_compile``, read from the package's file."""
    defaults = Path(__file__).resolve().parents[2] / "src/lightning_compile_patch/_monkeypatch/feature_defaults.py"
    spec = importlib.util.spec_from_file_location("_lcp_feature_defaults", defaults)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    connector = importlib.import_module(f"{FLAVOUR}.trainer.connectors.compile_connector")
    connector._CompileConnector.defaults = module.FEATURE_DEFAULTS
    connector._CompileConnector.input_defaults = module.INPUT_DEFAULTS


def _install() -> None:
    if MODE not in ("stock", "imported", "compiled"):
        raise pytest.UsageError(f"LCP_SUITE_MODE must be stock, imported or compiled, got {MODE!r}")
    if TARGET not in ("package", "upstream"):
        raise pytest.UsageError(f"LCP_SUITE_TARGET must be package or upstream, got {TARGET!r}")
    if MODE == "stock":
        return
    if TARGET == "package":
        importlib.import_module("lightning_compile_patch")
    else:
        _configure_as_the_package()
    trainer_cls = importlib.import_module(f"{FLAVOUR}.trainer.trainer").Trainer
    if "use_compile" not in inspect.signature(trainer_cls.__init__).parameters:
        raise pytest.UsageError(f"{FLAVOUR}.Trainer does not take `use_compile` (target {TARGET})")
    for name in _ENTRY_POINTS:
        setattr(trainer_cls, name, _recording(getattr(trainer_cls, name)))
    if MODE == "compiled":
        trainer_cls.__init__ = _defaulting(trainer_cls.__init__, DEFAULT_COMPILE)


def pytest_configure(config: pytest.Config) -> None:
    """Installs the mode, and refuses a mode that contradicts what is imported."""
    _install()
    if TARGET == "upstream" and "lightning_compile_patch" in sys.modules:
        raise pytest.UsageError("LCP_SUITE_TARGET=upstream must not import lightning_compile_patch")
    if MODE == "stock" and "lightning_compile_patch" in sys.modules:
        raise pytest.UsageError("LCP_SUITE_MODE=stock, but lightning_compile_patch was imported")
    controller = bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")
    _process[:] = ["controller" if controller else os.environ.get("PYTEST_XDIST_WORKER", "main")]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Empties Dynamo's caches before each test (unless ``LCP_SUITE_DYNAMO_RESET=0``), as in a fresh process.

    Dynamo's recompile limit counts per code object, across Trainers: after about 8 models of one class compiled in a
    process (``BoringModel``), every later run of that class runs eager, and a test's outcome would depend on which
    tests its worker ran before it.
    """
    if MODE != "stock" and RESET_DYNAMO:
        importlib.import_module("torch._dynamo").reset()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    """Opens the test's record."""
    _records[nodeid] = {"nodeid": nodeid, "outcome": "passed", "error": None, "runs": []}
    _running[:] = [nodeid]


def _first_line(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = getattr(crash, "message", None) or str(report.longrepr)
    return next((line for line in text.splitlines() if line.strip()), "")[:300]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keeps the worst outcome of setup, call and teardown, with the first line of its error."""
    record = _records.get(report.nodeid)
    if record is None:
        return
    record["seconds"] = round(record.get("seconds", 0.0) + report.duration, 3)
    if report.failed:
        outcome = "failed" if report.when == "call" else "error"
        if _ORDER[outcome] > _ORDER[record["outcome"]] and record["error"] is None:
            record.update(outcome=outcome, error=_first_line(report))
    elif report.skipped and record["outcome"] == "passed":
        record["outcome"] = "skipped"


def _write(record: dict[str, Any]) -> None:
    folder = os.environ.get("LCP_SUITE_RECORDS")
    if not folder:
        return
    path = Path(folder) / f"{_process[0] if _process else 'main'}-{os.getpid()}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps(record, default=str) + "\n")


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    """Writes the test's record."""
    record = _records.pop(nodeid, None)
    if _running == [nodeid]:
        _running.clear()
    if record is not None:
        _write(record)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Writes what is left open."""
    for record in _records.values():  # tests whose worker crashed before their logfinish
        _write(record)
    _records.clear()
