"""The learning rate read in a compiled step (``self.optimizers().param_groups[0]["lr"]``) recompiles nothing.

Dynamo traces a ``torch.optim.Optimizer`` as an optimizer it may compile: the first read of its ``param_groups`` guards
on every value of every group, the learning rate and Adam's betas included, by value. A step that logs the learning
rate under a scheduler stepped every batch (OneCycleLR moves the betas too) compiled again at every step, and ran eager
from the recompile limit on. A Lightning optimizer is an instance of the optimizer's class, so it is traced the same.

While a step is traced, ``self.optimizers()`` returns a view of each optimizer instead: a plain object whose
``param_groups`` is the optimizer's own list, and whose every other attribute is the optimizer's. Dynamo traces the
list as a list: a float read from it is compiled for a symbolic value after its first change, and the other values are
not guarded at all. The step reads, and logs, the values themselves. Outside a traced step (eager code, a fallback)
``self.optimizers()`` is Lightning's own, and the module's methods that take an optimizer are given the optimizer
itself when a step passes them its view.

"""

import functools
from collections.abc import Mapping
from typing import Any, Callable, Optional

import torch

from lightning_compile_patch.compile_connector import _CompileConnector, _CompileFeature, _CompileOptions, _flag

#: The module's methods that take an optimizer from the step, and compare it with the Trainer's.
_TAKES_OPTIMIZER = ("toggle_optimizer", "untoggle_optimizer", "clip_gradients")


class _OptimizerView:
    """An optimizer as a traced step sees it: ``param_groups`` is its list, any other attribute is the optimizer's."""

    def __init__(self, optimizer: Any) -> None:
        vars(self).update(_optimizer=optimizer, param_groups=optimizer.param_groups)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optimizer, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._optimizer, name, value)


def _unwrapped(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def taking_optimizer(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(optimizer, _OptimizerView):
            optimizer = optimizer._optimizer
        return method(optimizer, *args, **kwargs)

    return taking_optimizer


class _ParamGroups(_CompileFeature):
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
        self._eager: Optional[Callable[..., Any]] = None

    def setup(self, connector: _CompileConnector) -> Mapping[str, Any]:
        module = connector.trainer.lightning_module
        self._eager = eager = module.optimizers
        current = self._current

        @functools.wraps(eager)
        def optimizers(use_pl_optimizer: bool = True) -> Any:
            if torch.compiler.is_compiling():
                return current[bool(use_pl_optimizer)]
            return eager(use_pl_optimizer)

        connector.replace(module, "optimizers", optimizers)
        for name in _TAKES_OPTIMIZER:
            connector.replace(module, name, _unwrapped(getattr(module, name)))
        return {}

    def wrap(self, connector: _CompileConnector, compiled: Callable, original: Callable, module_call: bool) -> Callable:
        @functools.wraps(original, updated=())
        def run(*args: Any, **kwargs: Any) -> Any:
            self._refresh()
            return compiled(*args, **kwargs)

        return run

    def _refresh(self) -> None:
        assert self._eager is not None
        for use_pl_optimizer in (True, False):
            self._current[use_pl_optimizer] = self._viewed(self._eager(use_pl_optimizer))

    def _viewed(self, optimizers: Any) -> Any:
        if not isinstance(optimizers, list):
            return self._view(optimizers)
        views = [self._view(optimizer) for optimizer in optimizers]
        return self._lists.setdefault(tuple(map(id, views)), views)

    def _view(self, optimizer: Any) -> _OptimizerView:
        view = self._views.get(id(optimizer))
        if view is None or view._optimizer is not optimizer:
            view = self._views[id(optimizer)] = _OptimizerView(optimizer)
        vars(view)["param_groups"] = optimizer.param_groups  # `load_state_dict` puts in a new list
        return view

    def teardown(self, connector: _CompileConnector) -> None:
        self._views, self._lists, self._eager = {}, {}, None
        self._current.clear()


FEATURE = _ParamGroups
