"""The real-model tests: HF ``transformers`` models and Lightning's demo Transformer, trained through the Trainer.

``tests/conftest.py`` is loaded as well: it imports the package (or checks the patched Lightning), starts every test
with fresh Dynamo state and restores the process state (process group, environment, working directory) after it.
"""

from collections.abc import Iterator
from typing import Any, Callable

import pytest
import torch._dynamo

from lightning.pytorch import Trainer


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "real_models: trains model families from their own libraries (transformers, Lightning demos)"
    )


def recompile_limit_hits(trainer: Trainer) -> list[str]:
    """The frames that hit Dynamo's recompile limit during the Trainer's last compiled run.

    The one place that reads the run summary: if it moves again, fix it here.
    """
    import helpers  # tests/, on the path through tests/conftest.py

    return list(helpers.last_summary(trainer).recompile_limit_hits)


@pytest.fixture
def limit_hits() -> Callable[[Trainer], list[Any]]:
    """:func:`recompile_limit_hits`, for the tests (a conftest is not importable by name next to another one)."""
    return recompile_limit_hits


@pytest.fixture(autouse=True)
def _whole_compilation_history() -> Iterator[None]:
    """Dynamo keeps the metrics of its last 64 compiles only; a deep model's regions compile more than that."""
    utils = torch._dynamo.utils
    utils.set_compilation_metrics_limit(100_000)
    yield
    utils.set_compilation_metrics_limit(utils.DEFAULT_COMPILATION_METRICS_LIMIT)
