"""Models of libraries built on Lightning, each of which builds its own Trainer: run by ``nox -s downstream``.

The libraries come from the package registry (``noxfile.py`` pins them). Outside that session they are not installed,
and these tests are not collected: ``tests`` ignores this folder.
"""

import importlib
import importlib.util
import os
from collections.abc import Iterator

import pytest

#: The libraries the session installed (`LCP_DOWNSTREAM`, set by `nox -s downstream`): their cases must run.
INSTALLED = [name for name in os.environ.get("LCP_DOWNSTREAM", "").split(",") if name]

# imported once, before any test: each sets environment variables of its own as it is imported (ray, numba, ...), and
# pytorch-tabular imports tensorboardX during a run where it is installed, which sets CRC32C_SW_MODE
for _name in [*INSTALLED, "tensorboardX"]:
    if _name in INSTALLED or importlib.util.find_spec(_name) is not None:
        importlib.import_module(_name)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselects the cases of libraries the session did not install; `tests/downstream` alone runs nothing."""
    chosen = [item for item in items if item.callspec.params.get("case", "").split("-")[0] in INSTALLED]
    config.hook.pytest_deselected(items=[item for item in items if item not in chosen])
    items[:] = chosen


#: Set by Lightning's `seed_everything`, which the libraries call themselves (pytorch-tabular's `fit(seed=...)`).
SEED_ENV = ("PL_GLOBAL_SEED", "PL_SEED_WORKERS")


@pytest.fixture(autouse=True)
def _libraries_seed_everything() -> Iterator[None]:
    before = {key: os.environ.get(key) for key in SEED_ENV}
    yield
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
