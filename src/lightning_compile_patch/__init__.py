"""Compile Lightning training after the strategy has wrapped the model.

Import this package once, at startup, before building a ``Trainer``::

    import lightning_compile_patch  # noqa: F401
    from lightning.pytorch import Trainer

    trainer = Trainer(strategy="ddp", use_compile=True)

The import patches ``Trainer`` of every installed Lightning flavour (``lightning.pytorch`` and ``pytorch_lightning``).
Importing it again changes nothing; :func:`remove` undoes the patch.

"""

import sys
from typing import Any, Optional

from lightning_compile_patch._monkeypatch.patch import apply, is_applied, remove

__version__ = "0.1.0"
__all__ = ["apply", "is_applied", "last_summary", "remove"]


def last_summary(trainer: Any) -> Optional[Any]:
    """What the compiler did in ``trainer``'s last run that compiled: graphs, recompiles, graph breaks, compiled and
    eager steps, seconds. ``None`` before such a run.
    """
    connector = getattr(trainer, "_compile_connector", None)
    if connector is None:
        return None
    # the summary module beside the Trainer's connector: this flavour's (`lightning.pytorch`, `pytorch_lightning`)
    package = type(connector).__module__.rpartition(".")[0]
    summary = sys.modules.get(f"{package}.compile_features.summary")
    return summary.last_summary(trainer) if summary is not None else None


apply()
