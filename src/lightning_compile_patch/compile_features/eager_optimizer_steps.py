"""Manual optimization under ``use_compile``: the optimizer's and the scheduler's steps run outside the compiled graph.

With ``automatic_optimization = False`` the step itself calls ``opt.zero_grad()``, ``opt.step()`` and ``sch.step()``,
so Dynamo traced the optimizer's update into the step: it guards on every value of the optimizer's ``param_groups``
(the learning rate, Adam's betas) and on the optimizer object, so each change of the learning rate, and each optimizer
of a GAN, compiled the optimizer's code again, until the recompile limit; and the traced update rounds differently from
torch's eager one (the loss drifted from eager's by 6e-5). Automatic optimization never traced them: Lightning calls
the optimizer outside the step.

For a run with manual optimization, the steps are compiler-disabled on the run's own objects, never on a class that
other code shares: each ``LightningOptimizer`` already has a class of its own (Lightning builds one per instance, a
subclass of ``LightningOptimizer`` and the optimizer's class), which gets a ``step`` and a ``zero_grad`` for the run;
each configured scheduler gets, for the run, a class of its own (a subclass of its class, of the same name) with such
a ``step``; the module's ``toggle_optimizer``/``untoggle_optimizer`` are set on the module. Each calls the method it
replaces, looked up when it is called (a test's mock of the optimizer's class is what runs), so the step's graph breaks
at each call and torch's own eager code runs it, exactly as without ``use_compile``. The forward and the loss are still
compiled.

"""

from collections.abc import Mapping
from typing import Any, Callable, cast

import torch

from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning_compile_patch.compile_features import _CompileFeature, _CompileOptions, _flag
from lightning_compile_patch.compile_features import _private_names as private_names
from lightning_compile_patch.compile_features._run import _CompileRun

_MODULE_METHODS = ("toggle_optimizer", "untoggle_optimizer")


def _eager(cls: type, name: str) -> Callable[..., Any]:
    """``name`` of the class after ``cls`` in an instance's MRO, run outside the graph."""

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(super(cls, self), name)(*args, **kwargs)

    method.__name__ = method.__qualname__ = name
    return torch.compiler.disable(method)


def _new(cls: type[Any]) -> Any:
    """An instance of ``cls`` whose state pickle or ``copy`` then sets."""
    return object.__new__(cls)  # neither optimizers nor schedulers have a `__new__` of their own


def _with_eager_step(cls: type[Any]) -> type:
    """A subclass of ``cls``, of the same name, whose ``step`` runs outside the graph."""

    def __reduce_ex__(self: Any, protocol: Any) -> Any:
        # pickled and copied as an instance of ``cls``: no module holds the run's subclass, and a copy is plain
        _, _, *state = cast(Any, cls).__reduce_ex__(self, protocol)  # `cls`'s own, as `super()` would find it
        return (_new, (cls,), *state)

    own = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__reduce_ex__": __reduce_ex__}
    subclass = type(cls.__name__, (cls,), own)
    subclass.step = _eager(subclass, "step")
    return subclass


class _EagerOptimizerSteps(_CompileFeature):
    """Keeps the optimizers' and schedulers' steps of a manual-optimization step out of the compiled graph."""

    keys = {"eager_optimizer_steps": "True: manual optimization's `opt.step()` and `sch.step()` run outside the graph"}

    def __init__(self, options: _CompileOptions) -> None:
        _flag(options, "eager_optimizer_steps")

    def setup(self, run: _CompileRun) -> Mapping[str, Any]:
        trainer = run.trainer
        module = trainer.lightning_module
        if module.automatic_optimization:
            return {}  # Lightning steps the optimizer outside the compiled step
        for optimizer in private_names.lightning_optimizers(trainer.strategy):
            own = type(optimizer)  # this instance's class: `LightningOptimizer.__init__` made it
            if own is LightningOptimizer or not issubclass(own, LightningOptimizer):
                continue  # a class that others share: leave it as it is
            for name in ("step", "zero_grad"):  # neither is the class's own: set for the run, then deleted
                run.replace(own, name, _eager(own, name))
        for config in trainer.lr_scheduler_configs:
            scheduler = config.scheduler
            if callable(getattr(scheduler, "step", None)):
                run.replace(scheduler, "__class__", _with_eager_step(type(scheduler)))
        for name in _MODULE_METHODS:
            method: Callable[..., Any] = getattr(module, name)
            run.replace(module, name, torch.compiler.disable(method))
        return {}


FEATURE = _EagerOptimizerSteps
