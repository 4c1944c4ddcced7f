"""The behaviour suite runs against one of two targets, chosen by ``LCP_TARGET``.

* ``package`` (default): stock Lightning with ``import lightning_compile_patch``.
* ``upstream``: a Lightning with the ``patches/`` series applied, and this package *not* imported. Tests marked
  ``package_only`` (the monkeypatch itself) are skipped there, and so are ``pytorch_lightning`` cases, since the series
  patches the ``lightning`` package.

"""

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
    import lightning_compile_patch  # noqa: F401
elif TARGET == "upstream":
    import inspect

    import lightning.pytorch

    if "use_compile" not in inspect.signature(lightning.pytorch.Trainer).parameters:
        raise pytest.UsageError("LCP_TARGET=upstream needs a Lightning with the patches/ series applied")
    if "lightning_compile_patch" in sys.modules:
        raise pytest.UsageError("LCP_TARGET=upstream must not import lightning_compile_patch")
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


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    """Each test starts with empty Dynamo caches and counters, so that counts and budgets are its own."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch._dynamo.utils.clear_compilation_metrics()
    yield
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def _restore_process_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Undo what a distributed run leaves behind: the process group, env variables and the working directory."""
    environ = dict(os.environ)
    monkeypatch.chdir(tmp_path)
    optimize_ddp = torch._dynamo.config.optimize_ddp
    # DDP built under optimize_ddp="python_reducer" makes torch trace DDP's own file for the rest of the process
    trace_rules = torch._dynamo.trace_rules
    inlined = set(trace_rules.LEGACY_MOD_INLINELIST)
    yield
    trace_rules.LEGACY_MOD_INLINELIST.intersection_update(inlined)
    trace_rules.get_legacy_mod_inlinelist.cache_clear()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    os.environ.clear()
    os.environ.update(environ)
    torch._dynamo.config.optimize_ddp = optimize_ddp
