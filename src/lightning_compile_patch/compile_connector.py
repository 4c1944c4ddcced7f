"""``Trainer(use_compile=...)``: compile what the strategy runs, after the strategy has wrapped the model.

The Trainer calls the connector when it is built, in ``fit``/``validate``/``test``/``predict`` (``unwrap``), at the
start of ``_run``, right after ``strategy.setup`` (``compile``, in place) and in ``_teardown``. Each module of
``compile_features`` names a :class:`_CompileFeature` as ``FEATURE``, imported only when a Trainer compiles.

The compile arguments flow one way, as values: ``use_compile`` is parsed once into frozen :class:`_CompileOptions`;
each run takes its arguments from them (or from the compiled model passed in), and each feature may derive new ones
only through :meth:`_CompileFeature.compile_kwargs`, which returns a value. Everything a run changes outside itself (an
attribute, a torch setting, an environment variable) goes through :meth:`_CompileConnector.replace` or
:meth:`~_CompileConnector.setenv`, which record it in one of two scopes: ``"compile"`` (what is compiled, undone by
:meth:`~_CompileConnector.uncompile`) and ``"run"`` (the run's settings, undone in ``teardown``).

"""

import contextlib
import difflib
import functools
import importlib
import inspect
import os
import pkgutil
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal, Optional, Union

import torch
from torch._dynamo import OptimizedModule

import lightning.pytorch as pl
import lightning_compile_patch.compile_features as compile_features
from lightning.fabric.utilities.imports import _TORCH_GREATER_EQUAL_2_6
from lightning.fabric.wrappers import _unwrap_compiled
from lightning.pytorch.trainer.states import TrainerStatus
from lightning.pytorch.utilities.compile import _verify_strategy_supports_compile, from_compiled, to_uncompiled
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

_USE_COMPILE = Optional[Union[bool, dict[str, Any]]]
_Scope = Literal["compile", "run"]


class _Frozen(dict):
    """A dict that refuses changes, and that pickles (``ddp_spawn`` pickles the Trainer) and copies as one."""

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("the compile arguments of a run are a value: derive new ones instead of changing these")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _refuse  # type: ignore[assignment]

    def __reduce__(self) -> tuple:
        return type(self), (dict(self),)


@dataclass(frozen=True)
class _CompileOptions:
    """``use_compile`` parsed once: the ``torch.compile`` arguments, and the values of the features' own keys."""

    torch_kwargs: Mapping[str, Any] = field(default_factory=_Frozen)
    keys: Mapping[str, Any] = field(default_factory=_Frozen)


class _CompileFeature:
    """A feature beyond the core: built with the parsed options (raising on a bad value), it owns ``keys`` of them.

    Hooks run in the order of :func:`_feature_classes`, ``teardown`` in reverse, on every path. ``order`` only says how
    ``wrap`` nests, lowest innermost:

    ====  ================  =====================================================================
    5     step_outputs      puts the module's lists behind their views for the compiled call only
    5     param_groups      refreshes the optimizers' views that a traced ``self.optimizers()`` returns
    10    log_deferral      replays ``self.log`` right after the compiled call, inside the others
    45    compiled_autograd syncs DDP's buffers around the compiled call
    80    fallback          catches a compile error and runs the step eagerly instead
    90    compile_errors    names the run in a compile error that nothing inside caught
    95    run_summary       counts the step as compiled or eager: outermost, so a fallback counts
    ====  ================  =====================================================================

    """

    #: The keys of the ``use_compile`` dict this feature owns, each with a one-line description for error messages.
    keys: ClassVar[dict[str, str]] = {}
    order: ClassVar[int] = 0
    #: What the feature says of the run in progress for its summary line, such as how regions were compiled.
    summary_note: Optional[str] = None
    #: Whether the run went on uncompiled after a compile error.
    fell_back: bool = False

    def __init__(self, options: _CompileOptions) -> None:
        """Reads and checks the feature's own keys of ``options``."""

    def verify(self, connector: "_CompileConnector") -> None:
        """At the end of ``Trainer.__init__``: checks of the value against the Trainer's strategy."""

    def on_run_start(self, connector: "_CompileConnector", model: "pl.LightningModule") -> None:
        """Before the strategy's setup: checks that can fail before the data is prepared, and the run's settings."""

    def compile_kwargs(self, connector: "_CompileConnector", kwargs: Mapping[str, Any]) -> Mapping[str, Any]:
        """The ``torch.compile`` arguments of every compile in the run, derived from ``kwargs``; returns a new value."""
        return kwargs

    def setup(self, connector: "_CompileConnector") -> Mapping[str, Any]:
        """After ``strategy.setup``: may compile parts of the model; returns arguments that apply to the step only."""
        return {}

    def wrap(
        self, connector: "_CompileConnector", compiled: Callable, original: Callable, module_call: bool
    ) -> Callable:
        """Wraps each compiled callable the strategy calls; ``original`` is what it replaces.

        ``module_call``: ``compiled`` is a wrapper's (DDP's, FSDP's) whole call, not one step method.

        """
        return compiled

    def teardown(self, connector: "_CompileConnector") -> None:
        """Ends what the feature tracks of the run; what it changed through the connector is undone by it."""


#: The connector of the compiled run in progress in this process, if any: Dynamo's counters, caches and settings are
#: process-wide, so two compiled runs at once would count each other's graphs and restore each other's settings.
_RUNNING: list["_CompileConnector"] = []


class _CompileConnector:
    """Compiles after the wrap: with ``None`` a compiled model passed in, with ``True`` or a dict every model."""

    def __init__(self, trainer: "pl.Trainer", use_compile: _USE_COMPILE) -> None:
        self.trainer = trainer
        self.use_compile = use_compile  # as given, for messages
        self.enabled = use_compile is not None and use_compile is not False  # compile every model after the wrap
        if self.enabled and not _TORCH_GREATER_EQUAL_2_6:  # the oldest it is tested with; its features need 2.6
            raise RuntimeError(
                f"`Trainer(use_compile=...)` needs torch 2.6 or newer, but torch {torch.__version__} is installed."
                " Upgrade torch, or remove `use_compile`."
            )
        self.options = _CompileOptions()
        self.features: list[_CompileFeature] = []
        if self.enabled:
            self.options = _parse_use_compile(
                use_compile, {k: d for f in _feature_classes() for k, d in f.keys.items()}
            )
            self.features = [feature(self.options) for feature in _feature_classes()]
        #: The arguments of a compiled model passed in, when ``use_compile`` is unset.
        self._input_kwargs: Optional[Mapping[str, Any]] = None
        #: The run's ``torch.compile`` arguments as given, and as every compile of the run uses them (``None``: the run
        #: compiles nothing).
        self.given: Optional[Mapping[str, Any]] = None
        self.run_kwargs: Optional[Mapping[str, Any]] = None
        #: What the last run that compiled did (set by the run summary, if installed).
        self.last_summary: Optional[Any] = None
        self._active: list[_CompileFeature] = []
        self._undo: dict[_Scope, list[Callable[[], Any]]] = {"compile": [], "run": []}

    def verify_strategy(self) -> None:
        """Rejects a strategy that cannot run compiled, while the Trainer is being constructed."""
        if self.enabled:
            _verify_strategy_supports_compile(None, self.trainer.strategy)
        for feature in self.features:
            feature.verify(self)

    def unwrap(self, model: Any) -> Any:
        """Takes a model out of its ``torch.compile`` wrapper, to compile it after the strategy wraps it instead."""
        if model is None:
            return model  # the stage reuses the Trainer's model, and with it the compiled input's arguments
        self._input_kwargs = None
        if not isinstance(model, OptimizedModule) or self.use_compile is False or not _TORCH_GREATER_EQUAL_2_6:
            return model
        _verify_strategy_supports_compile(None, self.trainer.strategy)  # where Lightning checks a compiled model
        if not self.enabled and getattr(model, "_compile_kwargs", None) is None:
            rank_zero_warn("The model was compiled before `lightning` was imported: it is not compiled after the wrap.")
            return model
        module, compile_kwargs = _unwrap_compiled(model)
        if self.enabled:
            rank_zero_warn("The model passed in is compiled and `Trainer(use_compile)` is set too: `use_compile` wins.")
        else:
            self._input_kwargs = _Frozen(dict(compile_kwargs or {}))
        return module

    def on_run_start(self, model: "pl.LightningModule") -> None:
        """Decides what this run compiles, before the strategy sets the model up."""
        given = self.options.torch_kwargs if self.enabled else self._input_kwargs
        if given is None:
            return
        if _RUNNING and _RUNNING[0] is not self and _RUNNING[0].trainer.state.status != TrainerStatus.RUNNING:
            # a run that ended without its teardown (Lightning's `_interrupt` raised before it): end it now
            _RUNNING[0].teardown()
        if _RUNNING and _RUNNING[0] is not self:
            raise RuntimeError(
                "`use_compile`: another Trainer's compiled run is in progress in this process. Dynamo's counters and"
                " settings are process-wide, so compiled runs go one at a time: wait for the other run to end, or run"
                " this one in another process."
            )
        _RUNNING[:] = [self]
        if not self.enabled and not self.features:
            self.features = [feature(self.options) for feature in _feature_classes()]  # with their defaults
        self.given = given
        # fit validates under `torch.no_grad`; under `torch.inference_mode` (whose tensors have other dispatch keys),
        # `validate` would compile the validation step a second time
        if self.trainer.validate_loop.inference_mode:
            self.replace(self.trainer.validate_loop, "inference_mode", False, scope="run")
        if model._compiler_ctx is not None:
            to_uncompiled(model)  # compiled by hand with `from_compiled`: compile once, after the wrap
        self._active = list(self.features)
        for feature in self._active:
            feature.on_run_start(self, model)
        kwargs: Mapping[str, Any] = given
        for feature in self._active:
            kwargs = feature.compile_kwargs(self, kwargs)
        self.run_kwargs = _Frozen(dict(kwargs))

    def compile(self) -> None:
        """Compiles, in place, what the strategy calls in this stage, after the strategy has wrapped the model."""
        if self.run_kwargs is None:
            return
        step_only: dict[str, Any] = {}
        for feature in self._active:
            step_only.update(feature.setup(self))
        kwargs = {**self.run_kwargs, **step_only}
        module, wrapper = self.trainer.lightning_module, self.trainer.strategy.model
        assert wrapper is not None
        if wrapper is not module:
            # DDP, FSDP: the strategy calls every step through the wrapper's forward, so one compiled call covers the
            # wrapper's own forward, the step and the loss
            compiled = torch.compile(
                wrapper._call_impl, **kwargs
            )  # what `nn.Module.compile` does, undone after the run
            self.replace(wrapper, "_compiled_call_impl", self._wrap(compiled, wrapper._call_impl, module_call=True))
            return
        # no wrapper (one device, or a stage without one): the strategy calls the step methods directly
        given = module.__dict__.get("_compile_kwargs")  # torch keeps the compiled input's arguments on the module
        from_compiled(torch.compile(module, **kwargs))  # type: ignore[arg-type]
        module.__dict__.update({"_compile_kwargs": given} if given is not None else {})
        self.callback(to_uncompiled, module)
        assert module._compiler_ctx is not None
        for name in ("training_step", "validation_step", "test_step", "predict_step"):
            original = module._compiler_ctx[f"original_{name}"]
            if callable(original):  # `validation_step = None` turns the loop off
                setattr(module, name, self._wrap(getattr(module, name), original, module_call=False))

    def _wrap(self, compiled: Callable, original: Callable, module_call: bool) -> Callable:
        """The features' wrappers around ``compiled``; it shows ``original``'s signature, which Lightning reads."""
        for feature in sorted(self._active, key=lambda feature: feature.order):
            compiled = feature.wrap(self, compiled, original, module_call)
        return functools.update_wrapper(functools.partial(compiled), original, updated=())

    def replace(self, target: Any, name: str, value: Any, scope: _Scope = "compile") -> None:
        """Sets ``target.name`` to ``value`` until the end of ``scope``, then puts back what was there.

        An attribute of an object's own ``__dict__`` (or of a module, such as ``torch._dynamo.config``) gets its value
        back; one that came from the class is removed from the instance again.

        """
        if name in getattr(target, "__dict__", {}) or isinstance(target, types.ModuleType):
            before = getattr(target, name)
            self.callback(lambda: setattr(target, name, before), scope=scope)
        else:
            self.callback(lambda: target.__dict__.pop(name, None), scope=scope)
        setattr(target, name, value)

    def setenv(self, name: str, value: str, scope: _Scope = "run") -> None:
        """Sets the environment variable ``name`` until the end of ``scope``, then puts back what was there."""
        before = os.environ.get(name)
        os.environ[name] = value
        if before is None:
            self.callback(lambda: os.environ.pop(name, None), scope=scope)
        else:
            self.callback(lambda: os.environ.__setitem__(name, before), scope=scope)

    def enter(self, context: contextlib.AbstractContextManager, scope: _Scope = "run") -> Any:
        """Enters ``context`` (torch's own ``config.patch``, a switch) until the end of ``scope``."""
        value = context.__enter__()
        self.callback(lambda: context.__exit__(None, None, None), scope=scope)
        return value

    def callback(self, undo: Callable[..., Any], *args: Any, scope: _Scope = "compile") -> None:
        """Calls ``undo(*args)`` at the end of ``scope``: for what is undone by a function of its own."""
        # a closure, not a `functools.partial`: a Trainer that a callback deep-copies mid-run (Lightning's own tests do)
        # copies functions by reference, while a partial's arguments (a config module) would be copied and cannot be
        self._undo[scope].append(lambda: undo(*args))

    def uncompile(self) -> None:
        """Undoes what this run compiled, latest first; the run's settings stay until its teardown."""
        self._unwind("compile")

    def _unwind(self, scope: _Scope) -> None:
        undo = self._undo[scope]
        with contextlib.ExitStack() as stack:  # every step runs, even after one that raised
            while undo:
                stack.callback(undo.pop(0))

    def teardown(self) -> None:
        """Ends the run: the features, then what was compiled, then the run's settings; each even after one raised."""
        active, self._active, self.run_kwargs, self.given = self._active, [], None, None
        with contextlib.ExitStack() as stack:  # callbacks run last-in, first-out
            stack.callback(self._release)
            stack.callback(self._unwind, "run")
            stack.callback(self.uncompile)
            for feature in active:
                stack.callback(feature.teardown, self)

    def _release(self) -> None:
        if _RUNNING and _RUNNING[0] is self:
            _RUNNING.clear()


@functools.cache
def _feature_classes() -> tuple[type[_CompileFeature], ...]:
    """The ``FEATURE`` of every module in ``compile_features``, by name: imported on first use."""
    modules = pkgutil.iter_modules(compile_features.__path__)
    return tuple(importlib.import_module(f"{compile_features.__name__}.{m.name}").FEATURE for m in modules)


def _torch_compile_keys() -> list[str]:
    return [name for name in inspect.signature(torch.compile).parameters if name != "model"]


def _parse_use_compile(use_compile: Any, feature_keys: dict[str, str]) -> _CompileOptions:
    """Checks a ``use_compile`` value and splits it into ``torch.compile`` arguments and the features' keys."""
    if use_compile is None or isinstance(use_compile, bool):
        return _CompileOptions()
    if not isinstance(use_compile, Mapping):
        raise TypeError(
            f"`Trainer(use_compile={use_compile!r})` is not supported: pass `True`, `False`, `None` or a dict of"
            f" `torch.compile` arguments such as `use_compile={{'mode': 'max-autotune'}}`."
        )
    torch_keys = _torch_compile_keys()
    for key in use_compile:
        if key not in torch_keys and key not in feature_keys:
            close = difflib.get_close_matches(str(key), [*torch_keys, *feature_keys], n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            own = "".join(f"; {name!r}: {description}" for name, description in feature_keys.items())
            raise ValueError(
                f"`Trainer(use_compile=...)` got the unknown key {key!r}.{hint} Valid keys: {torch_keys}{own}."
            )
    return _CompileOptions(
        torch_kwargs=_Frozen({k: v for k, v in use_compile.items() if k in torch_keys}),
        keys=_Frozen({k: v for k, v in use_compile.items() if k not in torch_keys}),
    )
