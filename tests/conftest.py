"""The behaviour suite runs against one of two targets, chosen by ``LCP_TARGET``.

* ``package`` (default): stock Lightning with ``import lightning_compile_patch``.
* ``upstream``: a Lightning with the ``patches/`` series applied, and this package *not* imported. Tests marked
  ``package_only`` (the monkeypatch itself) are skipped there, and so are ``pytorch_lightning`` cases, since the series
  patches the ``lightning`` package.

"""

import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch._dynamo
import torch.distributed

TARGET = os.environ.get("LCP_TARGET", "package")
TESTS_DIR = Path(__file__).parent
sys.path.insert(0, str(TESTS_DIR))

if TARGET == "package":
    # the patch imports no Lightning flavour; importing one sets environment variables, before the leak check
    import lightning.pytorch
    import lightning_compile_patch  # noqa: F401
elif TARGET == "upstream":
    import inspect

    import lightning.pytorch

    if "use_compile" not in inspect.signature(lightning.pytorch.Trainer).parameters:
        raise pytest.UsageError("LCP_TARGET=upstream needs a Lightning with the patches/ series applied")
    if "lightning_compile_patch" in sys.modules:
        raise pytest.UsageError("LCP_TARGET=upstream must not import lightning_compile_patch")
    # the fork configured as the package configures it: the package's features on for every `use_compile`, read from
    # the package's own file without importing the package (which would patch)
    import importlib.util

    from lightning.pytorch.trainer.connectors.compile_connector import _CompileConnector

    _defaults = TESTS_DIR.parent / "src" / "lightning_compile_patch" / "_monkeypatch" / "feature_defaults.py"
    _spec = importlib.util.spec_from_file_location("_lcp_feature_defaults", _defaults)
    assert _spec is not None
    assert _spec.loader is not None
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
    _CompileConnector.defaults = _module.FEATURE_DEFAULTS
    _CompileConnector.input_defaults = _module.INPUT_DEFAULTS
else:
    raise pytest.UsageError(f"LCP_TARGET must be 'package' or 'upstream', got {TARGET!r}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if TARGET != "upstream":
        return
    skip = pytest.mark.skip(reason="tests the monkeypatch; LCP_TARGET=upstream tests a patched Lightning")
    for item in items:
        if "package_only" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=["lightning.pytorch", "pytorch_lightning"])
def flavour(request: pytest.FixtureRequest) -> str:
    """Each Lightning flavour the patch applies to."""
    if TARGET == "upstream" and request.param == "pytorch_lightning":
        pytest.skip("the upstream series patches the `lightning` package only")
    return request.param


@pytest.fixture
def caplog(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """``caplog`` sees Lightning's loggers, as in Lightning's own conftest.

    A flavour imported while the root logger has no handler (before pytest's exist) stops its logger propagating.
    """
    prefixes = ("lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric")
    loggers = [logging.getLogger(name) for name in logging.root.manager.loggerDict if name.startswith(prefixes)]
    propagate = [logger.propagate for logger in loggers]
    for logger in loggers:
        logger.propagate = True
    yield caplog
    for logger, value in zip(loggers, propagate, strict=True):
        logger.propagate = value


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    """Each test starts with empty Dynamo caches and counters, so that counts and budgets are its own."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch._dynamo.utils.clear_compilation_metrics()
    yield
    torch._dynamo.reset()


def _process_state() -> dict:
    """The process-wide state that a run of `use_compile` may change, and must put back."""
    import torch._functorch.config

    return {
        "torch._dynamo.config": torch._dynamo.config.get_config_copy(),
        # `dynamic_sources` (loop counters) and `force_non_lazy_backward_lowering` (compile errors), set for each run
        "torch.compiler.config": torch.compiler.config.get_config_copy(),
        "torch._functorch.config": torch._functorch.config.get_config_copy(),
        # inductor sets its own default cache directory on first use: that one is torch's, not a leak
        "os.environ": {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"},
        "logging filters": {name: list(logging.getLogger(name).filters) for name in ("torch._dynamo.convert_frame",)},
    }


@pytest.fixture(autouse=True)
def _restore_process_state(tmp_path: Path) -> Iterator[None]:
    """Fails a test after which `use_compile` left process-wide state changed; undoes what torch itself leaves.

    The working directory and the process group are the test's own; torch's own leaks are reset, each with its reason.
    """
    # no `monkeypatch` here: a test's own monkeypatching is undone before this check runs
    cwd = os.getcwd()
    os.chdir(tmp_path)
    before = _process_state()
    # DDP built under optimize_ddp="python_reducer" makes torch trace DDP's own file for the rest of the process: a
    # leak of torch's, not of the package, which restores every setting it changes
    trace_rules = torch._dynamo.trace_rules
    inlined = set(trace_rules.LEGACY_MOD_INLINELIST)
    yield
    os.chdir(cwd)
    trace_rules.LEGACY_MOD_INLINELIST.intersection_update(inlined)
    trace_rules.get_legacy_mod_inlinelist.cache_clear()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    after = _process_state()
    leaked = {key for key in before if before[key] != after[key]}
    if "os.environ" in leaked:
        # Lightning's DDP launch sets its rendezvous variables (MASTER_ADDR, ...) for the process: not ours
        ours = {k for k in {*before["os.environ"], *after["os.environ"]} if not k.startswith(_LIGHTNING_ENV)}
        if all(before["os.environ"].get(k) == after["os.environ"].get(k) for k in ours):
            leaked.discard("os.environ")
        os.environ.clear()
        os.environ.update(before["os.environ"])
    for key, value in before["torch._dynamo.config"].items():
        if after["torch._dynamo.config"].get(key) != value:
            setattr(torch._dynamo.config, key, value)  # so that one leak does not fail the tests after it too
    if leaked:
        changed = {
            key: sorted(k for k in {*before[key], *after[key]} if before[key].get(k) != after[key].get(k))
            for key in leaked
        }
        pytest.fail(f"the test left process-wide state changed: {changed}")


#: Variables that Lightning's launchers and seeding, pytest and torch set for the process: not ours.
_LIGHTNING_ENV = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE_RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "RANK",
    "PL_",
    "TORCHELASTIC",
    "OMP_NUM_THREADS",
    "PYTEST_",
    # torch sets these itself: inductor on first use, and its CUDA builds (on CPU too)
    "_TORCHINDUCTOR",
    "CUDA_MODULE_LOADING",
    "DISABLE_CUPTI_LAZY_REINIT",
    "TEARDOWN_CUPTI",
)
