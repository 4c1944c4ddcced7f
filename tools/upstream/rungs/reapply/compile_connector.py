"""Compiles a ``torch.compile``-d model's steps in each process, where the strategy's launcher pickles the model.

Compiled steps do not pickle: for a launcher that pickles the model (``strategy="ddp_spawn"``),
:meth:`_CompileConnector.unwrap` takes the LightningModule out of its ``torch.compile`` wrapper, and in each process
:meth:`~_CompileConnector.compile` compiles its steps in place, with the same arguments, right after ``strategy.setup``.

"""

from collections.abc import Mapping
from typing import Any, Optional, cast

import torch
from torch._dynamo import OptimizedModule

import lightning.pytorch as pl
from lightning.fabric.wrappers import _unwrap_compiled
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from lightning.pytorch.utilities.compile import _verify_strategy_can_compile, from_compiled, to_uncompiled
from lightning.pytorch.utilities.rank_zero import rank_zero_warn


class _CompileConnector:
    """Compiles what a run compiles, in each stage, once the strategy has set the model up."""

    def __init__(self, trainer: "pl.Trainer") -> None:
        self.trainer = trainer
        #: The arguments of a compiled model passed in.
        self._input_kwargs: Optional[Mapping[str, Any]] = None

    def unwrap(self, model: Any) -> Any:
        """Unwraps a compiled model the launcher pickles (``ddp_spawn``): each process compiles it instead."""
        if model is not self.trainer.lightning_module:  # the same model: compiled, as on fork
            self._input_kwargs = None
        if not isinstance(model, OptimizedModule) or not isinstance(model._orig_mod, pl.LightningModule):
            return model  # Lightning's own checks refuse what it cannot run, as before
        if model._orig_mod._compiler_ctx is not None:  # passed compiled again: its own steps are compiled, not these
            to_uncompiled(model)
        launcher = self.trainer.strategy.launcher
        # `spawn` and `forkserver` pickle the model for the new processes; `fork` and a new script (`ddp`) do not
        pickles = isinstance(launcher, _MultiProcessingLauncher) and not launcher.is_interactive_compatible
        known = getattr(model, "_compile_kwargs", None) is not None  # Fabric's capture; `_unwrap_compiled` needs them
        if pickles and not known:
            rank_zero_warn(
                "The model's `torch.compile` arguments are unknown (it was compiled before `lightning` was imported),"
                " so its steps are compiled before the launch, and the launcher cannot pickle them for its processes."
                " Import `lightning` before calling `torch.compile`, or use `strategy='ddp'`."
            )
        if not pickles or not known:
            return model  # Lightning compiles its steps as it is passed in (`from_compiled`), as before
        _verify_strategy_can_compile(self.trainer.strategy)  # where Lightning checks a compiled model
        module, self._input_kwargs = _unwrap_compiled(model)
        return module

    def compile(self) -> None:
        """Compiles, in place, what the strategy runs in this stage, now that the strategy has set the model up."""
        kwargs = self._input_kwargs
        if kwargs is None:
            return
        module = self.trainer.lightning_module
        # the strategy runs the steps, directly or inside its wrapper (DDP, FSDP): they are compiled in place
        from_compiled(cast(OptimizedModule, torch.compile(module, **kwargs)))
