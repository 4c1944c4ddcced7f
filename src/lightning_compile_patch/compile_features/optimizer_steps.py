"""Manual optimization under ``use_compile``: the optimizer's and the scheduler's steps run outside the compiled graph.

With ``automatic_optimization = False`` the step itself calls ``opt.zero_grad()``, ``opt.step()`` and ``sch.step()``,
so Dynamo traced the optimizer's update into the step: it guards on every value of the optimizer's ``param_groups``
(the learning rate, Adam's betas) and on the optimizer object, so each change of the learning rate, and each optimizer
of a GAN, compiled the optimizer's code again, until the recompile limit; and the traced update rounds differently from
torch's eager one (the loss drifted from eager's by 6e-5). Automatic optimization never traced them: Lightning calls
the optimizer outside the step.

For a run with manual optimization, ``LightningOptimizer.step`` and ``zero_grad``, each configured scheduler's ``step``
and the module's ``toggle_optimizer``/``untoggle_optimizer`` are compiler-disabled: the step's graph breaks at each call
and torch's own eager code runs it, exactly as without ``use_compile``. The forward and the loss are still compiled.

"""

from collections.abc import Mapping
from typing import Any, Callable

import torch

from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning_compile_patch.compile_connector import _CompileConnector, _CompileFeature, _CompileOptions, _flag

_MODULE_METHODS = ("toggle_optimizer", "untoggle_optimizer")


def _zero_grad(self: LightningOptimizer, *args: Any, **kwargs: Any) -> Any:
    """``LightningOptimizer.zero_grad``: the wrapped class's own (``LightningOptimizer`` defines none)."""
    return super(LightningOptimizer, self).zero_grad(*args, **kwargs)  # type: ignore[misc]


def _defining(cls: type, name: str) -> type:
    """The class of ``cls``'s MRO whose own ``name`` an instance of ``cls`` calls."""
    return next(klass for klass in cls.__mro__ if name in vars(klass))


class _OptimizerSteps(_CompileFeature):
    """Keeps the optimizers' and schedulers' steps of a manual-optimization step out of the compiled graph."""

    keys = {"eager_optimizer_steps": "True: manual optimization's `opt.step()` and `sch.step()` run outside the graph"}

    def __init__(self, options: _CompileOptions) -> None:
        _flag(options, "eager_optimizer_steps")

    def setup(self, connector: _CompileConnector) -> Mapping[str, Any]:
        trainer = connector.trainer
        module = trainer.lightning_module
        if module.automatic_optimization:
            return {}  # Lightning steps the optimizer outside the compiled step
        connector.replace(LightningOptimizer, "step", torch.compiler.disable(LightningOptimizer.step))
        if "zero_grad" in vars(LightningOptimizer):
            connector.replace(LightningOptimizer, "zero_grad", torch.compiler.disable(LightningOptimizer.zero_grad))
        else:
            # inherited from the optimizer's class (each instance has a class of its own, a subclass of both):
            # defined on `LightningOptimizer` for the run, and removed again
            LightningOptimizer.zero_grad = torch.compiler.disable(_zero_grad)  # type: ignore[attr-defined]
            connector.callback(delattr, LightningOptimizer, "zero_grad")
        for cls in {_defining(type(config.scheduler), "step") for config in trainer.lr_scheduler_configs}:
            connector.replace(cls, "step", torch.compiler.disable(vars(cls)["step"]))
        for name in _MODULE_METHODS:
            method: Callable[..., Any] = getattr(module, name)
            connector.replace(module, name, torch.compiler.disable(method))
        return {}


FEATURE = _OptimizerSteps
