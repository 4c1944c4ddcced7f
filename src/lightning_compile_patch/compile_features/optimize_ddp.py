"""How Dynamo compiles DDP: ``torch._dynamo.config.optimize_ddp``, chosen per run by world size.

DDPOptimizer splits the compiled graph at DDP's gradient buckets, so that each bucket's all-reduce can start while the
backward of the rest still runs. With one process there is nothing to overlap, and the split only adds graphs and
host overhead, so ``"auto"`` (the default) splits only with more than one process.

"""

from collections.abc import Mapping
from typing import Any

from torch.nn.parallel import DistributedDataParallel

from lightning.pytorch.strategies import DDPStrategy
from lightning_compile_patch.compile_features import _CompileFeature, _CompileOptions
from lightning_compile_patch.compile_features import _private_names as private_names
from lightning_compile_patch.compile_features._run import _CompileRun

_CHOICES = ("auto", True, False, "ddp_optimizer", "python_reducer", "no_optimization")


class _OptimizeDDP(_CompileFeature):
    """Sets ``optimize_ddp`` for a run under DDP, before DDP is built, and restores it when the run ends."""

    keys = {"optimize_ddp": "how DDP's graph is split into buckets: 'auto', True, False or a torch mode name"}

    @classmethod
    def wanted(cls, keys: Mapping[str, Any]) -> bool:
        return keys.get("optimize_ddp") is not None  # `False` turns the split off: a value of its own

    def __init__(self, options: _CompileOptions) -> None:
        self.choice = options.keys["optimize_ddp"]
        # `True == 1` in Python: compare types too, so that `optimize_ddp=1` is refused rather than taken for `True`
        if not any(type(self.choice) is type(choice) and self.choice == choice for choice in _CHOICES):
            raise ValueError(
                f"`Trainer(use_compile={{'optimize_ddp': {self.choice!r}}})` is not supported. Choose one of:"
                f" {', '.join(map(repr, _CHOICES))}."
            )

    def on_run_start(self, run: _CompileRun, model: Any) -> None:
        strategy = run.trainer.strategy
        if not isinstance(strategy, DDPStrategy):
            return
        # A process-wide Dynamo setting, read when a step is compiled inside DDP's forward, and for "python_reducer"
        # when DDP is built:
        # so it is set here, before the strategy wraps the model, and restored when the run ends, on every path.
        value = _resolve(self.choice, strategy.world_size, private_names.dynamo_config.optimize_ddp)
        run.replace(private_names.dynamo_config, "optimize_ddp", value, scope="run")

    def setup(self, run: _CompileRun) -> Mapping[str, Any]:
        wrapper = run.trainer.strategy.model
        if not isinstance(wrapper, DistributedDataParallel):  # one device, or a stage DDP does not wrap (it fits only)
            return {}
        python_reducer = private_names.dynamo_config.optimize_ddp == "python_reducer"
        if python_reducer and not private_names.ddp_uses_python_reducer(wrapper):
            where = "`use_compile={'optimize_ddp': 'python_reducer'}`"
            if self.choice != "python_reducer":
                where = "`torch._dynamo.config.optimize_ddp = 'python_reducer'`"
            raise RuntimeError(
                f"{where} was set before DDP was built, but DDP uses its C++ reducer. Remove `bucket_cap_mb_list` or"
                " other DDP arguments the python reducer does not support."
            )
        return {}


def _resolve(choice: Any, world_size: int, current: Any) -> Any:
    """The value to compile DDP with: ``"auto"`` splits only with more than one process, unless the user chose.

    A value the user set in ``torch._dynamo.config`` themselves (anything but the default ``True``) is kept.

    """
    if choice != "auto":
        return choice
    if current is not True:
        return current
    return world_size > 1


FEATURE = _OptimizeDDP
