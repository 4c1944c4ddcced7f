"""Compiles a ``torch.compile``-d model's steps in each process, where the strategy's launcher pickles the model.

Compiled steps do not pickle: for a launcher that pickles the model (``strategy="ddp_spawn"``),
:meth:`_CompileConnector.unwrap` takes the LightningModule out of its ``torch.compile`` wrapper, and in each process
:meth:`~_CompileConnector.compile` compiles its steps in place, with the same arguments, right after ``strategy.setup``.

"""

import contextlib
import difflib
import inspect
import os
from collections.abc import Mapping
from typing import Any, Callable, Optional, Union, cast

import torch
from torch._dynamo import OptimizedModule

import lightning.pytorch as pl
from lightning.fabric.utilities.imports import _TORCH_GREATER_EQUAL_2_6
from lightning.fabric.wrappers import _unwrap_compiled
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from lightning.pytorch.utilities.compile import _verify_strategy_can_compile, from_compiled, to_uncompiled
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

_USE_COMPILE = Optional[Union[bool, dict[str, Any]]]


class _CompileConnector:
    """Compiles what a run compiles, in each stage, once the strategy has set the model up."""

    def __init__(self, trainer: "pl.Trainer", use_compile: _USE_COMPILE = None) -> None:
        self.trainer = trainer
        self.use_compile = use_compile  # as given, for messages
        self.enabled = use_compile is not None and use_compile is not False  # compile every model after the wrap
        if self.enabled and not _TORCH_GREATER_EQUAL_2_6:  # the oldest it is tested with
            raise RuntimeError(
                f"`Trainer(use_compile=...)` needs torch 2.6 or newer, but torch {torch.__version__} is installed."
                " Upgrade torch, or remove `use_compile`."
            )
        self.compile_kwargs = _parse_use_compile(use_compile)
        #: The arguments of a compiled model passed in.
        self._input_kwargs: Optional[Mapping[str, Any]] = None
        self._undo: list[Callable[[], Any]] = []

    def verify_strategy(self) -> None:
        """Rejects a strategy that cannot run compiled, while the Trainer is being constructed."""
        if self.enabled:
            _verify_strategy_can_compile(self.trainer.strategy)

    def unwrap(self, model: Any) -> Any:
        """Unwraps a compiled model the launcher pickles (``ddp_spawn``): each process compiles it instead."""
        if model is not self.trainer.lightning_module:  # the same model: compiled, as on fork
            self._input_kwargs = None
        if self.enabled:  # `use_compile=False` compiles nothing of its own: a model compiled by hand runs as without it
            _verify_one_compile(model, self.use_compile, self.compile_kwargs)
        if not isinstance(model, OptimizedModule) or not isinstance(model._orig_mod, pl.LightningModule):
            return model  # Lightning's own checks refuse what it cannot run, as before
        if model._orig_mod._compiler_ctx is not None:  # passed compiled again: its own steps are compiled, not these
            to_uncompiled(model)
        if self.enabled:  # compiled with `use_compile`'s own arguments: compiled once, after the wrap
            return model._orig_mod
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
        kwargs = self.compile_kwargs if self.enabled else self._input_kwargs
        if kwargs is None or (self.enabled and _compiles_nothing(kwargs)):
            return
        module = self.trainer.lightning_module
        # the strategy runs the steps, directly or inside its wrapper (DDP, FSDP): they are compiled in place
        # `inspect.unwrap`: past Fabric's capture of `torch.compile`, which this compile has no use for
        from_compiled(cast(OptimizedModule, inspect.unwrap(torch.compile)(module, **kwargs)))
        if self.enabled:  # a model the Trainer compiled on its own is plain again after the run
            self.defer(to_uncompiled, module)

    def defer(self, undo: Callable[..., Any], *args: Any) -> None:
        """Calls ``undo(*args)`` when the run's changes are undone (at its teardown), latest first."""
        # not a `functools.partial`, whose arguments a `deepcopy` of the Trainer mid-run (Lightning's tests do) copies
        self._undo.append(lambda: undo(*args))

    def teardown(self) -> None:
        """Undoes what the run compiled and set, latest first, every step even after one raised."""
        undo, self._undo = self._undo, []
        with contextlib.ExitStack() as stack:  # callbacks run last-in, first-out
            for step in undo:
                stack.callback(step)


def _verify_one_compile(model: Any, use_compile: Any, kwargs: Mapping[str, Any]) -> None:
    """Refuses a model compiled by hand otherwise than ``use_compile`` asks: which of the two to run is unclear."""
    if isinstance(model, OptimizedModule):
        given = getattr(model, "_compile_kwargs", None)
        if given is not None and _explicit(given) == _explicit(kwargs):
            return  # the compile that `use_compile` asks for
        how = "before `lightning` was imported" if given is None else f"with `torch.compile(model, **{dict(given)})`"
        plain = "`model._orig_mod`"
    elif getattr(model, "_compiler_ctx", None) is not None:
        how = "with `from_compiled`, or left compiled by an earlier run of a compiled model,"
        plain = "`to_uncompiled(model)`"
    else:
        return
    raise ValueError(
        f"The model passed in was compiled {how} and `Trainer(use_compile={use_compile!r})` asks for a compile of its"
        f" own. Pass the uncompiled model ({plain}), or remove `use_compile`."
    )


def _compiles_nothing(kwargs: Mapping[str, Any]) -> bool:
    """Whether ``torch.compile`` with ``kwargs`` returns the module itself (``disable=True``, Dynamo off).

    If so, says that the run trains uncompiled, and why.

    """
    if torch.compile(_never_run, **kwargs) is not _never_run:
        return False
    if kwargs.get("disable"):
        why = "`use_compile={'disable': True}`"
    elif os.environ.get("TORCHDYNAMO_DISABLE") == "1":
        why = "`TORCHDYNAMO_DISABLE=1`"
    else:
        why = "`torch.compile` returns the model unchanged"
    rank_zero_info(f"`Trainer(use_compile=...)`: compiling is off ({why}), so this run trains uncompiled.")
    return True


def _explicit(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``torch.compile`` arguments without those that have its default value, a ``None`` read as what it stands for."""
    # `mode=None` is "default"; `backend=None` is inductor, torch 2.13's default in the signature (2.6's: "inductor")
    meaning = {"mode": "default", "backend": "inductor"}
    defaults = {name: p.default for name, p in inspect.signature(torch.compile).parameters.items()}
    defaults = {**defaults, **{key: value for key, value in meaning.items() if defaults.get(key) is None}}
    kwargs = {key: meaning.get(key) if value is None and key in meaning else value for key, value in kwargs.items()}
    return {key: value for key, value in kwargs.items() if value != defaults.get(key, inspect.Parameter.empty)}


def _torch_compile_keys() -> list[str]:
    return [name for name in inspect.signature(torch.compile).parameters if name != "model"]


def _parse_use_compile(use_compile: Any) -> dict[str, Any]:
    """Checks a ``use_compile`` value, with ``torch.compile`` itself."""
    if use_compile is None or isinstance(use_compile, bool):
        return {}
    if not isinstance(use_compile, Mapping):
        raise TypeError(
            f"`Trainer(use_compile={use_compile!r})` is not supported: pass `True`, `False`, `None` or a dict of"
            f" `torch.compile` arguments such as `use_compile={{'mode': 'max-autotune'}}`."
        )
    known = _torch_compile_keys()
    for key in use_compile:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"`Trainer(use_compile=...)` got the unknown key {key!r}.{hint} Valid keys: {known}.")
    torch_kwargs = dict(use_compile)
    _check_compile_kwargs(torch_kwargs)
    return torch_kwargs


def _never_run() -> None:
    """What the dry ``torch.compile`` call of :func:`_check_compile_kwargs` compiles: it is never called."""


def _check_compile_kwargs(kwargs: Mapping[str, Any]) -> None:
    """Checks ``torch.compile`` arguments when the Trainer is built, rather than minutes later at the first step.

    ``torch.compile`` checks them itself: a dry call on a function that is never run builds the backend, which looks
    up its name and applies the mode and the options, so every value torch accepts passes and every value it refuses
    fails with its own reason. What torch takes without a check (the type of a flag, of the backend) is checked here.

    """
    for key in ("fullgraph", "disable", "dynamic"):
        if kwargs.get(key) is not None and not isinstance(kwargs[key], bool):
            raise TypeError(f"`Trainer(use_compile={{{key!r}: {kwargs[key]!r}}})` must be a bool.")
    for key in ("mode", "name"):
        if kwargs.get(key) is not None and not isinstance(kwargs[key], str):
            raise TypeError(f"`Trainer(use_compile={{{key!r}: {kwargs[key]!r}}})` must be a string.")
    if kwargs.get("options") is not None and not isinstance(kwargs["options"], Mapping):
        raise TypeError("`Trainer(use_compile={'options': ...})` must be a dict of backend options.")
    backend = kwargs.get("backend", "inductor")
    if not callable(backend) and not isinstance(backend, str):
        raise TypeError(f"`Trainer(use_compile={{'backend': {backend!r}}})` must be a backend name or a callable.")
    try:
        torch.compile(_never_run, **kwargs)
    except Exception as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        names = torch.compiler.list_backends(exclude_tags=()) if isinstance(backend, str) else []
        close = [name for name in difflib.get_close_matches(str(backend), names, n=1) if name != backend]
        hint = f" Did you mean {close[0]!r}?" if close else ""
        kind = TypeError if reason.startswith("Unexpected type") else ValueError  # an option of the wrong type
        raise kind(f"`torch.compile` refuses `Trainer(use_compile=...)`'s arguments: {reason}{hint}") from error
