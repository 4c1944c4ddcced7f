"""Fixes of Lightning's own compile helpers, which ``use_compile`` reuses.

Each function here is the fixed version of a function in Lightning's tree, written as it reads there. The upstream
series replaces Lightning's function with it (``tools/upstream/series.py``); the package installs it over Lightning's
at import (:func:`install`), so both deliveries run the same code.

* ``from_compiled`` compiled every step, so a step set to ``None`` (how a loop is turned off) raised; it now
  compiles only the steps that are callable.
* ``to_uncompiled`` left each step method behind as an instance attribute holding a bound method: the module then
  pickles the bound methods and ignores a method patched on its class. It now removes them.
* ``_ForwardRedirection.__call__`` (the Trainer's) and ``_FabricModule._redirection_through_forward`` (Fabric's) left
  the module's ``forward`` patched when the wrapper's call raised (a compile error, a hook that raised, an interrupt),
  so the next call of ``forward`` ran the step method. Both now restore it on every path.
* ``_capture_compile_kwargs`` (Fabric's) kept a deep copy of the ``torch.compile`` arguments, backend included, so the
  model compiled again after the wrap (by Fabric, and by the Trainer) compiled with a copy of a backend object: one that
  counts graphs or holds state saw none. It now keeps the backend itself.
* ``_verify_strategy_supports_compile`` checked the strategy only for a model compiled already; its check is now
  ``_verify_strategy_can_compile`` of its own, which the Trainer also calls for a model it is to compile.

"""

from copy import deepcopy
from functools import wraps
from typing import Any, Callable, Union

import torch
from torch import nn
from torch._dynamo import OptimizedModule
from torch.nn import Module

import lightning.pytorch as pl
from lightning.pytorch.strategies import (
    DDPStrategy,
    DeepSpeedStrategy,
    FSDPStrategy,
    SingleDeviceStrategy,
    Strategy,
)
from lightning.pytorch.utilities.model_helpers import _check_mixed_imports
from lightning.pytorch.utilities.types import STEP_OUTPUT


def from_compiled(model: OptimizedModule) -> "pl.LightningModule":
    """Returns an instance LightningModule from the output of ``torch.compile``.

    .. warning::  This is an :ref:`experimental <versioning:Experimental API>` feature.

    The ``torch.compile`` function returns a ``torch._dynamo.OptimizedModule``, which wraps the LightningModule
    passed in as an argument, but doesn't inherit from it. This means that the output of ``torch.compile`` behaves
    like a LightningModule, but it doesn't inherit from it (i.e. `isinstance` will fail).

    Use this method to obtain a LightningModule that still runs with all the optimizations from ``torch.compile``.

    """
    if not isinstance(model, OptimizedModule):
        raise ValueError(f"`model` is required to be a `OptimizedModule`. Found a `{type(model).__name__}` instead.")

    orig_module = model._orig_mod

    if not isinstance(orig_module, pl.LightningModule):
        _check_mixed_imports(model)
        raise ValueError(
            f"`model` is expected to be a compiled LightningModule. Found a `{type(orig_module).__name__}` instead"
        )

    orig_module._compiler_ctx = {"compiler": "dynamo", "dynamo_ctx": model.dynamo_ctx}
    for name in ("forward", "training_step", "validation_step", "test_step", "predict_step"):
        method = getattr(orig_module, name)
        orig_module._compiler_ctx[f"original_{name}"] = method
        if callable(method):  # a step set to `None` turns its loop off
            setattr(orig_module, name, model.dynamo_ctx(method))
    return orig_module


def to_uncompiled(model: Union["pl.LightningModule", "torch._dynamo.OptimizedModule"]) -> "pl.LightningModule":
    """Returns an instance of LightningModule without any compilation optimizations from a compiled model.

    .. warning::  This is an :ref:`experimental <versioning:Experimental API>` feature.

    This takes either a ``torch._dynamo.OptimizedModule`` returned by ``torch.compile()`` or a ``LightningModule``
    returned by ``from_compiled``.

    Note: this method will in-place modify the ``LightningModule`` that is passed in.

    """
    if isinstance(model, OptimizedModule):
        original = model._orig_mod
        if not isinstance(original, pl.LightningModule):
            raise TypeError(
                f"Unexpected error, the wrapped model should be a LightningModule, found {type(model).__name__}"
            )

    elif isinstance(model, pl.LightningModule):
        if model._compiler_ctx is None:
            raise ValueError(
                "`model` is required to be a compiled LightningModule. Found a non-compiled LightningModule instead."
            )
        original = model

    else:
        raise ValueError("`model` must either be an instance of OptimizedModule or LightningModule")

    ctx = original._compiler_ctx
    if ctx is not None:
        for name in ("forward", "training_step", "validation_step", "test_step", "predict_step"):
            method = ctx[f"original_{name}"]
            own = getattr(type(original), name, None)
            if getattr(method, "__self__", None) is original and getattr(method, "__func__", None) is own:
                # the class's own method: no instance attribute, as before `from_compiled`
                original.__dict__.pop(name, None)
            else:
                setattr(original, name, method)
        original._compiler_ctx = None

    return original


def _verify_strategy_supports_compile(model: "pl.LightningModule", strategy: Strategy) -> None:
    if model._compiler_ctx is not None:
        _verify_strategy_can_compile(strategy)


def _verify_strategy_can_compile(strategy: Strategy) -> None:
    """Raises if ``strategy`` cannot run a compiled model: one compiled already, or one the Trainer is to compile."""
    supported_strategies: tuple[type[Strategy], ...] = (SingleDeviceStrategy, DDPStrategy, FSDPStrategy)
    if not isinstance(strategy, supported_strategies) or isinstance(strategy, DeepSpeedStrategy):
        supported_strategy_names = ", ".join(s.__name__ for s in supported_strategies)
        raise RuntimeError(
            f"Using a compiled model is incompatible with the current strategy: `{type(strategy).__name__}`."
            f" Only {supported_strategy_names} support compilation. Either switch to one of the supported"
            " strategies, or pass the model uncompiled and without `Trainer(use_compile=...)`."
        )


def _capture_compile_kwargs(compile_fn: Callable) -> Callable:
    """Wraps the ``torch.compile`` function and captures the compile arguments.

    We extract the compile arguments so that we can reapply ``torch.compile`` in ``Fabric.setup()`` with the
    same arguments as the user passed to the original call. The arguments get stored in a dictionary
    ``_compile_kwargs`` on the returned compiled module.

    """
    # Limitation: Currently, the global compile config does not get captured on a per-model basis.
    # PyTorch will resolve this in the future: https://github.com/pytorch/pytorch/issues/116575

    @wraps(compile_fn)
    def _capture(*args: Any, **kwargs: Any) -> Any:
        if not args or not isinstance(args[0], nn.Module):
            # either torch.compile is being applied as a decorator or we're compiling something else
            return compile_fn(*args, **kwargs)

        model = args[0]
        compiled_model = compile_fn(model, **kwargs)
        # as passed, not deep copies: a backend object (one that counts graphs or holds state) compiles again, and
        # one that cannot be copied compiles at all; the caller's `options` dict is copied, its values are not
        compile_kwargs = {k: dict(v) if k == "options" and v else v for k, v in kwargs.items()}
        # from torch 2.6 this sets them on the module inside, which every compile of it shares, and which a copy or a
        # pickle of the compiled module is rebuilt from: a deep copy there, as before, which pickles as the arguments
        # do, and none where they cannot be copied (a backend holding a lock), so that the module still pickles
        try:
            compiled_model._compile_kwargs = deepcopy(compile_kwargs)
        except Exception:
            compiled_model._compile_kwargs = None
        # the compiled module's own: what this compile was given
        compiled_model.__dict__["_compile_kwargs"] = compile_kwargs
        return compiled_model

    return _capture


class _ForwardRedirection:
    def __call__(
        self, wrapper_module: Module, original_module: "pl.LightningModule", method_name: str, *args: Any, **kwargs: Any
    ) -> STEP_OUTPUT:
        """Reroutes a method call through the `wrapper_module`'s `forward` method.

        Args:
            wrapper_module: The module that has `original_module` wrapped.
            original_module: The module that was wrapped inside `wrapper_module`.
            method_name: The name of the method that should be called on the `original_module` after inputs get
                redirected through the `wrapper_module`'s `forward` method.
            *args: The positional arguments to the method `method_name`. They will get passed to a patched
                `forward` method instead.
            **kwargs: The keyword arguments to the method `method_name`. They will get passed to a patched
                `forward` method instead.

        """
        assert method_name != "forward"
        original_forward = original_module.forward

        def wrapped_forward(*_args: Any, **_kwargs: Any) -> Any:
            # Unpatch ourselves immediately before calling the method `method_name`
            # because itself may want to call the real `forward`
            original_module.forward = original_forward  # type: ignore[method-assign]
            # Call the actual method e.g. `.training_step(...)`
            method = getattr(original_module, method_name)
            out = method(*_args, **_kwargs)
            self.on_after_inner_forward(wrapper_module, original_module)
            return out

        # Patch the original_module's forward so we can redirect the arguments back to the real method
        original_module.forward = wrapped_forward  # type: ignore[method-assign]

        try:
            wrapper_output = wrapper_module(*args, **kwargs)
        finally:
            # if the call raised before `wrapped_forward` ran (an error in DDP's pre-forward, a forward pre-hook),
            # unpatch here (and only then: a `forward` the step set stays), and undo what `on_after_inner_forward`
            # may have set (DDP's gradient sync, off under manual optimization)
            if original_module.__dict__.get("forward") is wrapped_forward:
                original_module.forward = original_forward  # type: ignore[method-assign]
            self.on_after_outer_forward(wrapper_module, original_module)
        return wrapper_output

    def on_after_inner_forward(self, wrapper_module: Module, original_module: "pl.LightningModule") -> None:
        pass

    def on_after_outer_forward(self, wrapper_module: Module, original_module: "pl.LightningModule") -> None:
        pass


class _FabricModule:
    def _redirection_through_forward(self, method_name: str) -> Callable:
        assert method_name != "forward"
        original_forward = self._original_module.forward

        def wrapped_forward(*args: Any, **kwargs: Any) -> Any:
            # Unpatch ourselves immediately before calling the method `method_name`
            # because itself may want to call the real `forward`
            self._original_module.forward = original_forward
            # Call the actual method e.g. `.training_step(...)`
            method = getattr(self._original_module, method_name)
            return method(*args, **kwargs)

        # We make the caller "unknowingly" send their arguments through the forward_module's `__call__`.
        # We expect that the `forward_module` will eventually call `original_module.forward`, which we
        # have patched to redirect back to `original_module.method_name()`.
        def call_forward_module(*args: Any, **kwargs: Any) -> Any:
            # Patch the original_module's forward, so we can redirect the arguments back to the real method
            self._original_module.forward = wrapped_forward
            try:
                return self.forward(*args, **kwargs)
            finally:
                # if the call raised before `wrapped_forward` ran (a hook that raised, an interrupt), unpatch here, and
                # only then: a `forward` the step set stays
                if self._original_module.__dict__.get("forward") is wrapped_forward:
                    self._original_module.forward = original_forward

        return call_forward_module


#: Where each fix goes in Lightning's tree: the module, and the class for a method.
FIXES = {
    "from_compiled": ("lightning.pytorch.utilities.compile", None),
    "to_uncompiled": ("lightning.pytorch.utilities.compile", None),
    "_verify_strategy_supports_compile": ("lightning.pytorch.utilities.compile", None),
    "_verify_strategy_can_compile": ("lightning.pytorch.utilities.compile", None),
    "_capture_compile_kwargs": ("lightning.fabric.wrappers", None),
    "__call__": ("lightning.pytorch.strategies.strategy", "_ForwardRedirection"),
    "_redirection_through_forward": ("lightning.fabric.wrappers", "_FabricModule"),
}
