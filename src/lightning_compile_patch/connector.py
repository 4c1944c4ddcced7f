"""``Trainer(use_compile=...)``: compile what the strategy runs, after the strategy has wrapped the model.

The Trainer calls the connector when it is built, in ``fit``/``validate``/``test``/``predict`` (``unwrap``), at the
start of ``_run``, right after ``strategy.setup`` (``compile``, in place) and in ``_teardown``. Each module of
``compile_features`` names a :class:`_CompileFeature` as ``FEATURE``, imported only when a Trainer compiles.

"""

import contextlib
import difflib
import functools
import importlib
import inspect
import pkgutil
from collections.abc import Mapping
from typing import Any, Callable, ClassVar, Optional, Union, cast

import torch
from torch._dynamo import OptimizedModule

import lightning.pytorch as pl
import lightning_compile_patch.features as compile_features
from lightning.fabric.utilities.imports import _TORCH_GREATER_EQUAL_2_6
from lightning.fabric.wrappers import _unwrap_compiled
from lightning.pytorch.utilities.compile import _verify_strategy_supports_compile, from_compiled, to_uncompiled
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

_USE_COMPILE = Optional[Union[bool, dict[str, Any]]]


class _CompileFeature:
    """A feature beyond the core: built with the ``use_compile`` dict (raising on a bad value), it owns ``keys`` of it.

    Hooks run by ascending ``order`` (``wrap`` nests the lowest innermost), ``teardown`` in reverse, on every path.
    """

    #: The keys of the ``use_compile`` dict this feature owns, each with a one-line description for error messages.
    keys: ClassVar[dict[str, str]] = {}
    order: ClassVar[int] = 0

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options

    def verify(self, connector: "_CompileConnector") -> None:
        """At the end of ``Trainer.__init__``: checks of the value against the Trainer's strategy."""

    def on_run_start(self, connector: "_CompileConnector", model: "pl.LightningModule") -> None:
        """Before the strategy's setup: checks that can fail before the data is prepared."""

    def setup(self, connector: "_CompileConnector") -> None:
        """After ``strategy.setup``: may change ``connector.run_kwargs``, or compile and add to ``connector.undo``."""

    def wrap(self, connector: "_CompileConnector", compiled: Callable, original: Callable) -> Callable:
        """Wraps each compiled callable the strategy calls; ``original`` is what it replaces."""
        return compiled

    def teardown(self, connector: "_CompileConnector") -> None:
        """Undoes what ``on_run_start`` and ``setup`` did."""


class _CompileConnector:
    """Compiles after the wrap: with ``None`` a compiled model passed in, with ``True`` or a dict every model."""

    def __init__(self, trainer: "pl.Trainer", use_compile: _USE_COMPILE) -> None:
        self.trainer = trainer
        self.use_compile = use_compile
        self.enabled = use_compile is not None and use_compile is not False  # compile every model after the wrap
        if self.enabled and not _TORCH_GREATER_EQUAL_2_6:  # the oldest it is tested with; its features need 2.6
            raise RuntimeError(
                f"`Trainer(use_compile=...)` needs torch 2.6 or newer, but torch {torch.__version__} is installed."
                " Upgrade torch, or remove `use_compile`."
            )
        self.features: list[_CompileFeature] = []
        self.compile_kwargs: dict[str, Any] = {}  # of `torch.compile`, from the dict
        if self.enabled:
            self._build_features(use_compile)
        self.run_kwargs: Optional[dict[str, Any]] = None  # of the run in progress; None: it compiles nothing
        self._input_kwargs: Optional[dict[str, Any]] = None
        self._active: list[_CompileFeature] = []
        self.undo: list[Callable[[], Any]] = []  # what this run compiled, to undo latest first

    def _build_features(self, use_compile: _USE_COMPILE) -> None:
        features = _feature_classes()
        options = _parse_use_compile(use_compile, {key: d for f in features for key, d in f.keys.items()})
        self.compile_kwargs = {key: value for key, value in options.items() if key in _torch_compile_keys()}
        self.features = [feature(options) for feature in features]

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
            self._input_kwargs = dict(compile_kwargs or {})  # a copy: a run changes what it compiles with
        return module

    def on_run_start(self, model: "pl.LightningModule") -> None:
        """Decides what this run compiles, before the strategy sets the model up."""
        kwargs = self.compile_kwargs if self.enabled else self._input_kwargs
        self.run_kwargs = None if kwargs is None else dict(kwargs)  # a copy: features may change it for the run
        if self.run_kwargs is None:
            return
        if not self.enabled and not self.features:
            self._build_features({})  # a compiled model passed in: the features with their defaults
        # fit validates under `torch.no_grad`; under `torch.inference_mode` (whose tensors have other dispatch keys),
        # `validate` would compile the validation step a second time
        loop = self.trainer.validate_loop
        if loop.inference_mode:
            loop.inference_mode = False
            self.undo.append(functools.partial(setattr, loop, "inference_mode", True))
        if model._compiler_ctx is not None:
            to_uncompiled(model)  # compiled by hand with `from_compiled`: compile once, after the wrap
        for feature in self.features:
            self._active.append(feature)
            feature.on_run_start(self, model)

    def compile(self) -> None:
        """Compiles, in place, what the strategy calls in this stage, after the strategy has wrapped the model."""
        if self.run_kwargs is None:
            return
        for feature in self._active:
            feature.setup(self)
        module, wrapper = self.trainer.lightning_module, self.trainer.strategy.model
        assert wrapper is not None
        if wrapper is not module:
            # DDP, FSDP: the strategy calls every step through the wrapper's forward, so one compiled call covers the
            # wrapper's own forward, the step and the loss
            wrapper.compile(**self.run_kwargs)
            wrapper._compiled_call_impl = self.wrap(cast(Callable, wrapper._compiled_call_impl), wrapper._call_impl)
            self.undo.append(lambda: setattr(wrapper, "_compiled_call_impl", None))
            return
        # no wrapper (one device, or a stage without one): the strategy calls the step methods directly
        given = module.__dict__.get("_compile_kwargs")  # torch keeps the compiled input's arguments on the module
        from_compiled(torch.compile(module, **self.run_kwargs))  # type: ignore[arg-type]
        module.__dict__.update({"_compile_kwargs": given} if given is not None else {})
        self.undo.append(lambda: to_uncompiled(module))
        assert module._compiler_ctx is not None
        for name in ("training_step", "validation_step", "test_step", "predict_step"):
            original = module._compiler_ctx[f"original_{name}"]
            if callable(original):  # `validation_step = None` turns the loop off
                setattr(module, name, self.wrap(getattr(module, name), original))

    def wrap(self, compiled: Callable, original: Callable) -> Callable:
        """The features' wrappers around ``compiled``; it shows ``original``'s signature, which Lightning reads."""
        for feature in self._active:
            compiled = feature.wrap(self, compiled, original)
        return functools.update_wrapper(functools.partial(compiled), original, updated=())

    def uncompile(self) -> None:
        while self.undo:
            self.undo.pop()()

    def teardown(self) -> None:
        active, self._active, self.run_kwargs = self._active, [], None
        with contextlib.ExitStack() as stack:  # every step runs, even after one that raised
            for feature in active:
                stack.callback(feature.teardown, self)
            stack.callback(self.uncompile)


@functools.cache
def _feature_classes() -> tuple[type[_CompileFeature], ...]:
    """The ``FEATURE`` of every module in ``compile_features``, by ``order``: imported on first use."""
    modules = pkgutil.iter_modules(compile_features.__path__)
    features = [importlib.import_module(f"{compile_features.__name__}.{m.name}").FEATURE for m in modules]
    return tuple(sorted(features, key=lambda feature: feature.order))


def _torch_compile_keys() -> list[str]:
    return [name for name in inspect.signature(torch.compile).parameters if name != "model"]


def _parse_use_compile(use_compile: Any, feature_keys: dict[str, str]) -> dict[str, Any]:
    """Checks a ``use_compile`` value and returns its dict (empty for ``None``, ``True`` and ``False``)."""
    if use_compile is None or isinstance(use_compile, bool):
        return {}
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
    return dict(use_compile)
