"""Compiles what the strategy runs, after the strategy has wrapped the model, and undoes it when the run ends.

The Trainer calls :class:`_CompileConnector` at three points of a run::

    Trainer(use_compile=...)  ->  __init__         validate the value (errors surface here)
    trainer.fit(model) ...    ->  on_run_start     decide what this run compiles; unwrap a compiled input
      strategy.setup()                             DDP / FSDP wrap, precision, device
                              ->  compile          compile the module the strategy calls, in place
      the stage's loop
                              ->  teardown         every module back to uncompiled

Compiling in place (``nn.Module.compile`` style) keeps the strategy's model of the same type, so Lightning's
``isinstance(model, DistributedDataParallel)`` checks hold, and keeps the ``state_dict`` keys of an eager run.

"""

from typing import Any, Callable, Optional

import torch
from torch import nn
from torch._dynamo import OptimizedModule

import lightning.pytorch as pl
from lightning.pytorch.strategies import (
    DDPStrategy,
    DeepSpeedStrategy,
    FSDPStrategy,
    ModelParallelStrategy,
    SingleDeviceStrategy,
    Strategy,
)
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.compile import to_uncompiled
from lightning.pytorch.utilities.model_helpers import is_overridden  # patch: regions
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from lightning_compile_patch.cache import _warm_start  # patch: cache
from lightning_compile_patch.config import (
    _USE_COMPILE_INPUT,
    _CompileConfig,
    _config_from_compile_kwargs,
    _parse_use_compile,
)
from lightning_compile_patch.log_boundary import _LogBoundary
from lightning_compile_patch.regions import _compile_regions, _find_regions, _rest_of_model  # patch: regions
from lightning_compile_patch.report import _CompileReport, _CompileSummary

#: The LightningModule methods each stage calls through the strategy.
_STEP_METHODS = {
    TrainerFn.FITTING: ("training_step", "validation_step"),
    TrainerFn.VALIDATING: ("validation_step",),
    TrainerFn.TESTING: ("test_step",),
    TrainerFn.PREDICTING: ("predict_step",),
}
_STEP_METHODS_ALL = ("training_step", "validation_step", "test_step", "predict_step")
_SUPPORTED_STRATEGIES = (SingleDeviceStrategy, DDPStrategy, FSDPStrategy, ModelParallelStrategy)
_MISSING = object()


class _CompileConnector:
    """Owns ``Trainer(use_compile=...)``.

    Args:
        trainer: The Trainer this connector belongs to.
        use_compile: ``None`` re-applies ``torch.compile`` to a compiled model after the strategy wraps it; ``False``
            keeps Lightning's behaviour unchanged; ``True`` or a dict of ``torch.compile`` arguments compiles every
            model after the strategy wraps it.

    """

    def __init__(self, trainer: "pl.Trainer", use_compile: _USE_COMPILE_INPUT) -> None:
        self.trainer = trainer
        self.config = _parse_use_compile(use_compile)
        self._reapply_compiled_models = use_compile is None
        #: The ``torch.compile`` arguments of the compiled model last passed in, to re-apply after the wrap.
        self._compiled_input: Optional[_CompileConfig] = None
        self._run_config: Optional[_CompileConfig] = None
        #: How to undo what this run compiled, in the order it was done.
        self._undo: list[Callable[[], None]] = []
        #: What else to do when the run ends (save the compile cache).
        self._on_teardown: list[Callable[[], None]] = []
        self._fell_back = False
        self._report: Optional[_CompileReport] = None
        #: What the compiler did in the last run that compiled anything.
        self.last_summary: Optional[_CompileSummary] = None

    def verify_strategy(self) -> None:
        """Rejects a strategy that ``use_compile`` cannot compile, while the Trainer is being constructed."""
        if self.config is not None:
            _verify_strategy_supports_use_compile(self.trainer.strategy)

    def unwrap(self, model: Any) -> Any:
        """Takes a model passed to ``fit``/``validate``/``test``/``predict`` out of its ``torch.compile`` wrapper.

        Lightning would otherwise compile the model's methods right away, before the strategy wraps it. When this run
        compiles after the wrap instead, the wrapper's arguments are kept (``use_compile=None``) or replaced by
        ``use_compile``'s, and the plain LightningModule goes on. With ``use_compile=False``, nothing changes.

        """
        if model is None:
            return model  # the stage reuses the Trainer's model, and with it the compiled input's arguments
        self._compiled_input = None
        if not isinstance(model, OptimizedModule) or (self.config is None and not self._reapply_compiled_models):
            return model
        if self.config is not None:
            rank_zero_warn(
                "The model passed to the Trainer was already compiled with `torch.compile`, and"
                " `Trainer(use_compile=...)` is set too: `use_compile` wins. The model is unwrapped and compiled"
                " once, after the strategy has wrapped it, with the `use_compile` arguments."
            )
            return model._orig_mod
        compile_kwargs = getattr(model, "_compile_kwargs", None)
        if compile_kwargs is None:
            rank_zero_warn(
                "The model was compiled before `lightning` was imported, so the arguments of its `torch.compile` call"
                " are unknown and it cannot be compiled again after the strategy wraps it. It runs as Lightning"
                " compiles it by default. Import `lightning` before calling `torch.compile`, or pass a plain model"
                " and `Trainer(use_compile=...)`."
            )
            return model
        _verify_strategy_supports_use_compile(self.trainer.strategy)
        self._compiled_input = _config_from_compile_kwargs(compile_kwargs)
        return model._orig_mod

    def on_run_start(self, model: "pl.LightningModule") -> bool:
        """Decides what this run compiles, before anything about the model changes.

        Returns:
            Whether the run compiles anything.

        """
        config = self.config or self._compiled_input
        if config is None:
            return False
        _verify_strategy_supports_use_compile(self.trainer.strategy)
        if config.regions is not None and not is_overridden("configure_model", model):  # patch: regions
            _find_regions(model, config.regions)  # patch: regions
        if model._compiler_ctx is not None:
            # compiled with ``from_compiled`` by hand: undo it, so that the model is compiled once, after the wrap
            _undo_stock_compile(model)
        self._run_config = config
        return True

    def compile(self) -> None:
        """Compiles, in place, what the strategy calls in the current stage. The strategy has wrapped the model."""
        config = self._run_config
        if config is None:
            return
        trainer = self.trainer
        strategy = trainer.strategy
        module = trainer.lightning_module
        if config.cache is not None:  # patch: cache
            self._on_teardown.append(_warm_start(config, trainer))  # patch: cache
        report = self._report = _CompileReport(trainer.state.fn.value, type(strategy).__name__, _backend_name(config))
        report.start()
        boundary = _LogBoundary(module)
        self._undo.append(boundary.install())
        self._undo.append(_apply_optimize_ddp(config, strategy))

        step_kwargs = config.compile_kwargs
        if config.regions is not None:  # patch: regions
            blocks = _find_regions(module, config.regions)  # patch: regions
            self._undo.append(_compile_regions(blocks, config.compile_kwargs, shared=True))  # patch: regions
            rest = _rest_of_model(module, blocks)  # patch: regions
            self._undo.append(_compile_regions(rest, config.compile_kwargs, shared=False))  # patch: regions
            step_kwargs = {**step_kwargs, "fullgraph": False}  # patch: regions

        def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
            guarded = self._guarded(torch.compile(fn, **step_kwargs), fn)
            return boundary.around(report.timed(guarded), original=fn)

        if strategy.model is not module:
            # DDP, FSDP: the strategy calls every step through the wrapper's forward, so one compiled call starts at
            # the wrapper's own forward and covers the step and the loss
            self._undo.append(_replace_module_call(strategy.model, compiled))
            return
        # no wrapper (single device, or every stage but fit): the strategy calls the step methods directly
        for name in _STEP_METHODS[trainer.state.fn]:
            self._undo.append(_replace_method(module, name, compiled))

    def teardown(self) -> None:
        """Returns every module this run compiled to uncompiled, in the reverse order of compilation."""
        self._uncompile()
        while self._on_teardown:
            self._on_teardown.pop()()
        if self._report is not None:
            self.last_summary = self._report.finish()
            self._report = None
        self._run_config = None
        self._fell_back = False

    def _uncompile(self) -> None:
        """Undoes what this run compiled, latest first."""
        while self._undo:
            self._undo.pop()()

    def _guarded(self, compiled: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
        """Calls ``compiled``; says which run failed, and with ``fallback="eager"``, runs on without compiling."""

        def run(*args: Any, **kwargs: Any) -> Any:
            if self._fell_back:
                return original(*args, **kwargs)
            try:
                return compiled(*args, **kwargs)
            except (torch._dynamo.exc.TorchDynamoException, torch._dynamo.exc.FailOnRecompileLimitHit) as error:
                if self._run_config is None or self._run_config.fallback != "eager":
                    _undo_forward_redirection(self.trainer.lightning_module)
                    raise RuntimeError(self._failure_message(error)) from error
                rank_zero_warn(
                    f"{self._failure_message(error, fallback=True)} It continues uncompiled (`fallback='eager'`)."
                )
                self._fell_back = True
                self._uncompile()
                return original(*args, **kwargs)
            except Exception as error:
                if hasattr(error, "add_note"):  # Python 3.11+
                    error.add_note(f"(raised in the {self._describe_run()})")
                raise

        return run

    def _describe_run(self) -> str:
        """The stage, the config and the strategy of this run, for messages."""
        trainer = self.trainer
        stage = trainer.state.fn.value if trainer.state.fn else "unknown"
        config = self._run_config.describe() if self._run_config is not None else "{}"
        return f"{stage} step compiled by `use_compile={config}` under {type(trainer.strategy).__name__}"

    def _failure_message(self, error: BaseException, fallback: bool = False) -> str:
        """What failed, where, and (unless falling back) what to do about it."""
        first_paragraph = str(error).strip().split("\n\n")[0].replace("\n", " ")
        reason = f"{type(error).__name__}: {first_paragraph}"
        message = f"`use_compile` could not compile the {self._describe_run()}: {reason}."
        if fallback:
            return message
        return (
            f"{message} Every module is left uncompiled. Pass `'fallback': 'eager'` in `use_compile` to continue"
            " uncompiled with a warning instead, or `use_compile=False` to leave compilation to Lightning."
        )


def _undo_stock_compile(model: "pl.LightningModule") -> None:
    """Undoes what ``from_compiled`` did to ``model``, leaving no instance attribute behind."""
    to_uncompiled(model)
    for name in ("forward", *_STEP_METHODS_ALL):
        method = model.__dict__.get(name)
        if getattr(method, "__self__", None) is model and method.__func__ is getattr(type(model), name, None):
            del model.__dict__[name]  # a bound method of the class: the same as no instance attribute


def _undo_forward_redirection(module: "pl.LightningModule") -> None:
    """Puts back the ``forward`` that Lightning's ``_ForwardRedirection`` replaced, if a compile failure left it."""
    forward = module.__dict__.get("forward")
    code = getattr(forward, "__code__", None)
    if code is not None and code.co_name == "wrapped_forward" and "original_forward" in code.co_freevars:
        module.forward = forward.__closure__[code.co_freevars.index("original_forward")].cell_contents


def _verify_strategy_supports_use_compile(strategy: Strategy) -> None:
    """Raises if ``strategy`` is one that ``use_compile`` does not know how to compile."""
    if (
        isinstance(strategy, _SUPPORTED_STRATEGIES)
        and not isinstance(strategy, DeepSpeedStrategy)
        and not (type(strategy).__name__.endswith("XLAStrategy"))
    ):
        return
    names = ", ".join(s.__name__ for s in _SUPPORTED_STRATEGIES)
    raise ValueError(
        f"`Trainer(use_compile=...)` does not support the strategy `{type(strategy).__name__}`; it supports {names}"
        " and their subclasses. Use one of those, or set `use_compile=False` and compile the model yourself."
    )


def _apply_optimize_ddp(config: _CompileConfig, strategy: Strategy) -> Callable[[], None]:
    """Sets ``torch._dynamo.config.optimize_ddp`` for this run when DDP is compiled, and returns the undo."""
    import torch._dynamo.config as dynamo_config

    previous = dynamo_config.optimize_ddp
    if not isinstance(strategy, DDPStrategy):
        return lambda: None
    dynamo_config.optimize_ddp = _resolve_optimize_ddp(config.optimize_ddp, strategy.world_size, previous)

    def undo() -> None:
        dynamo_config.optimize_ddp = previous

    return undo


def _resolve_optimize_ddp(choice: Any, world_size: int, current: Any) -> Any:
    """The ``optimize_ddp`` value to compile DDP with.

    ``"auto"`` splits DDP's graph into buckets only with more than one process: the split is what lets gradient
    all-reduce overlap the backward pass, and with one process there is nothing to overlap, so it is pure cost. A value
    the user set in ``torch._dynamo.config`` themselves (anything but the default ``True``) is kept.

    """
    if choice != "auto":
        return choice
    if current is not True:
        return current
    return world_size > 1


def _backend_name(config: _CompileConfig) -> str:
    """A readable name for the backend, which may be a callable."""
    backend = config.backend
    return backend if isinstance(backend, str) else getattr(backend, "__name__", type(backend).__name__)


def _replace_module_call(module: nn.Module, compiled: Callable[[Callable], Callable]) -> Callable[[], None]:
    """Compiles the call of ``module`` in place, as ``nn.Module.compile`` does, and returns the undo."""
    previous = module._compiled_call_impl
    module._compiled_call_impl = compiled(module._call_impl)

    def undo() -> None:
        module._compiled_call_impl = previous

    return undo


def _replace_method(module: nn.Module, name: str, compiled: Callable[[Callable], Callable]) -> Callable[[], None]:
    """Compiles one method of ``module`` on the instance, and returns the undo."""
    shadowed = module.__dict__.get(name, _MISSING)
    setattr(module, name, compiled(getattr(module, name)))

    def undo() -> None:
        if shadowed is _MISSING:
            module.__dict__.pop(name, None)
        else:
            setattr(module, name, shadowed)

    return undo
