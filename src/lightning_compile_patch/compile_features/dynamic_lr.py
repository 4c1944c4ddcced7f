"""The learning rate read in a compiled step (``self.optimizers().param_groups[0]["lr"]``) recompiles nothing.

Dynamo traces a ``torch.optim.Optimizer`` as an optimizer it may compile: the first read of its ``param_groups`` guards
on every value of every group, the learning rate and Adam's betas included, by value. A step that logs the learning
rate under a scheduler stepped every batch (OneCycleLR moves the betas too) compiled again at every step, and ran eager
from the recompile limit on. A Lightning optimizer is an instance of the optimizer's class, so it is traced the same.

While a step is traced, ``self.optimizers()`` returns a view of each optimizer instead: an object whose
``param_groups`` is the optimizer's own list, and whose every other attribute is the optimizer's. Dynamo traces the
list as a list: a float read from it is compiled for a symbolic value after its first change, and the other values are
not guarded at all. The step reads, and logs, the values themselves. The view of a ``LightningOptimizer`` is a
``LightningOptimizer`` (``isinstance`` holds, in the step and out), whose ``step``, ``toggle_model`` and
``optimizer`` are the optimizer's own; it is not an instance of the wrapped ``torch.optim`` class, which is what Dynamo
guards. The views are built from the strategy's optimizers, so no hook of the module runs that the step did not call;
a module that defines ``optimizers`` itself keeps its own. Outside a traced step (eager code, a fallback)
``self.optimizers()`` is Lightning's own, and the module's methods that take an optimizer are given the optimizer
itself when a step passes them its view.

"""

import functools
import operator
from collections.abc import Mapping
from typing import Any, Callable, Optional

import torch

from lightning.pytorch.core.module import LightningModule
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.strategies import Strategy
from lightning_compile_patch.compile_features import _CompileFeature, _CompileOptions, _flag
from lightning_compile_patch.compile_features import _private_names as private_names
from lightning_compile_patch.compile_features._run import _CompileRun

#: The module's methods that take an optimizer from the step, and compare it with the Trainer's.
_TAKES_OPTIMIZER = ("toggle_optimizer", "untoggle_optimizer", "clip_gradients")
_GROUPS = operator.attrgetter("param_groups")


class _OptimizerView:
    """An optimizer as a traced step sees it: ``param_groups`` is its list, any other attribute is the optimizer's."""

    def __init__(self, optimizer: Any) -> None:
        vars(self).update(_viewed=optimizer, param_groups=optimizer.param_groups)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._viewed, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._viewed, name, value)


class _LightningOptimizerView(_OptimizerView, LightningOptimizer):
    """The view of a ``LightningOptimizer``: a ``LightningOptimizer`` whose own methods are the viewed one's."""

    @property
    def optimizer(self) -> Any:
        return self._viewed.optimizer

    def step(self, *args: Any, **kwargs: Any) -> Any:
        return self._viewed.step(*args, **kwargs)

    def toggle_model(self, *args: Any, **kwargs: Any) -> Any:
        return self._viewed.toggle_model(*args, **kwargs)


def _unwrapped(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def taking_optimizer(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(optimizer, _OptimizerView):
            optimizer = optimizer._viewed
        return method(optimizer, *args, **kwargs)

    return taking_optimizer


def _as_returned(optimizers: list[Any]) -> Any:
    """``optimizers`` as ``LightningModule.optimizers`` returns them: one on its own, more as the list."""
    return optimizers[0] if len(optimizers) == 1 else optimizers


class _DynamicLR(_CompileFeature):
    """Gives a traced step views of the optimizers, refreshed before each compiled call."""

    keys = {"dynamic_lr": "True: the learning rate read from `self.optimizers()` in a step does not recompile it"}
    order = 5  # innermost: the views are current when the compiled call starts

    def __init__(self, options: _CompileOptions) -> None:
        _flag(options, "dynamic_lr")
        self._views: dict[int, _OptimizerView] = {}
        self._lists: dict[tuple[int, ...], list[_OptimizerView]] = {}
        #: What the traced ``self.optimizers(use_pl_optimizer)`` returns, by its argument; one object per value for the
        #: run, since Dynamo guards on which object it is.
        self._current: dict[bool, Any] = {}
        #: The strategy's list of optimizers, and each one's list of groups, as ``_current`` was last refreshed.
        self._refreshed: tuple[Optional[list[Any]], list[Any]] = (None, [])
        self._strategy: Optional[Strategy] = None

    def setup(self, run: _CompileRun) -> Mapping[str, Any]:
        module = run.trainer.lightning_module
        if "optimizers" in vars(module) or type(module).optimizers is not LightningModule.optimizers:
            return {}  # the module's own `optimizers`: it returns what it chooses, and the step gets just that
        self._strategy = run.trainer.strategy
        eager, current = module.optimizers, self._current

        @functools.wraps(eager)
        def optimizers(use_pl_optimizer: bool = True) -> Any:
            if torch.compiler.is_compiling():
                return current[bool(use_pl_optimizer)]
            return eager(use_pl_optimizer)

        run.replace(module, "optimizers", optimizers)
        for name in _TAKES_OPTIMIZER:
            run.replace(module, name, _unwrapped(getattr(module, name)))
        return {}

    def wrap(self, run: _CompileRun, compiled: Callable, original: Callable) -> Callable:
        strategy = self._strategy
        if strategy is None:
            return compiled  # the module's own `optimizers`

        @functools.wraps(original, updated=())
        def call(*args: Any, **kwargs: Any) -> Any:
            # before every compiled call, so it first checks, with a few attribute reads and no call of Python, that
            # nothing changed: the strategy sets a new list when its optimizers change, and `load_state_dict` gives an
            # optimizer a new list of groups
            optimizers, (refreshed_for, groups) = strategy.optimizers, self._refreshed
            if not (
                optimizers is refreshed_for
                and len(optimizers) == len(groups)
                and all(map(operator.is_, map(_GROUPS, optimizers), groups))
            ):
                self._refresh(strategy)
            return compiled(*args, **kwargs)

        return call

    def _refresh(self, strategy: Strategy) -> None:
        # what `LightningModule.optimizers` returns, read where it reads it (no hook of the module is called)
        optimizers = strategy.optimizers
        self._current[True] = self._viewed(private_names.lightning_optimizers(strategy))
        self._current[False] = self._viewed(optimizers)
        self._refreshed = (optimizers, list(map(_GROUPS, optimizers)))

    def _viewed(self, optimizers: list[Any]) -> Any:
        views = [self._view(optimizer) for optimizer in optimizers]
        return _as_returned(self._lists.setdefault(tuple(map(id, views)), views))

    def _view(self, optimizer: Any) -> _OptimizerView:
        view = self._views.get(id(optimizer))
        if view is None or view._viewed is not optimizer:
            kind = _LightningOptimizerView if isinstance(optimizer, LightningOptimizer) else _OptimizerView
            view = self._views[id(optimizer)] = kind(optimizer)
        vars(view)["param_groups"] = optimizer.param_groups  # `load_state_dict` puts in a new list
        return view

    def teardown(self, run: _CompileRun) -> None:
        self._views, self._lists, self._strategy = {}, {}, None
        self._refreshed = (None, [])
        self._current.clear()


FEATURE = _DynamicLR
