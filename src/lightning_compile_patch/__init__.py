"""Compile Lightning training after the strategy has wrapped the model.

Import this package once, at startup, before building a ``Trainer``::

    import lightning_compile_patch  # noqa: F401
    from lightning.pytorch import Trainer

    trainer = Trainer(strategy="ddp", use_compile=True)

The import patches ``Trainer`` of every installed Lightning flavour (``lightning.pytorch`` and ``pytorch_lightning``).
Importing it again changes nothing; :func:`remove` undoes the patch.

"""

from lightning_compile_patch.patch import apply, is_applied, remove

__version__ = "0.1.0"
__all__ = ["apply", "is_applied", "remove"]

apply()
