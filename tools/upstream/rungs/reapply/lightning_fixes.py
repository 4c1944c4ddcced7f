"""The re-apply rung's version of the fixed Lightning functions that a later rung changes again.

The package's ``lightning_fixes`` holds the last rung's version; ``tools/patchset.py`` takes a function from here for
the re-apply patch, and from the package for every other.

"""

from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy, SingleDeviceStrategy, Strategy


def _verify_strategy_can_compile(strategy: Strategy) -> None:
    """Raises if ``strategy`` cannot run a compiled model: one compiled already, or one the Trainer is to compile."""
    supported_strategies: tuple[type[Strategy], ...] = (SingleDeviceStrategy, DDPStrategy, FSDPStrategy)
    if not isinstance(strategy, supported_strategies) or isinstance(strategy, DeepSpeedStrategy):
        supported_strategy_names = ", ".join(s.__name__ for s in supported_strategies)
        raise RuntimeError(
            f"Using a compiled model is incompatible with the current strategy: `{type(strategy).__name__}`."
            f" Only {supported_strategy_names} support compilation. Either switch to one of the supported"
            " strategies or avoid passing in compiled model."
        )
