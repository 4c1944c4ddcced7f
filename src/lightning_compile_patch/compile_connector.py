"""Compiles what a run compiles, in each process, right after ``strategy.setup``: ``Trainer(use_compile=...)``.

* ``use_compile`` (``True`` or a dict of ``torch.compile`` arguments) is parsed once and checked by ``torch.compile``
  itself when the Trainer is built; the features its dict turns on (``compile_features``) are built then too.
* :meth:`_CompileConnector.unwrap` takes a model passed in out of its ``torch.compile`` wrapper where the run compiles
  it after the setup: under ``use_compile``, and for a launcher that pickles the model (``strategy="ddp_spawn"``:
  compiled steps do not pickle).
* :meth:`~_CompileConnector.on_run_start` starts the run (``compile_features._run``) that the features' hooks get;
  :meth:`~_CompileConnector.compile` compiles the LightningModule's steps in place, and DDP's call too where DDP runs
  its python reducer; :meth:`~_CompileConnector.teardown` undoes all of it, on every path.

"""

import contextlib
import difflib
import inspect
import os
from collections.abc import Mapping
from typing import Any, Callable, ClassVar, Optional, Union, cast

import torch
from torch._dynamo import OptimizedModule

import lightning.pytorch as pl
from lightning.fabric.utilities.imports import _TORCH_GREATER_EQUAL_2_6
from lightning.fabric.wrappers import _unwrap_compiled
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from lightning.pytorch.trainer.states import TrainerStatus
from lightning.pytorch.utilities.compile import _verify_strategy_can_compile, from_compiled, to_uncompiled
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from lightning_compile_patch.compile_features import (
    STEPS,
    _build_features,
    _CompileFeature,
    _CompileOptions,
    _feature_classes,
    _Frozen,
)
from lightning_compile_patch.compile_features import _private_names as private_names
from lightning_compile_patch.compile_features._run import _CompileRun

_USE_COMPILE = Optional[Union[bool, dict[str, Any]]]


#: The connector of the compiled run in progress in this process, if any: Dynamo's counters, caches and settings are
#: process-wide, so two compiled runs at once would count each other's graphs and restore each other's settings.
_RUNNING: list["_CompileConnector"] = []


class _CompileConnector:
    """Compiles what a run compiles, in each stage, once the strategy has set the model up."""

    #: The features' keys that every ``use_compile`` of this process sets unless it sets them itself: none in Lightning;
    #: a distribution may turn features on by default.
    defaults: ClassVar[Mapping[str, Any]] = _Frozen()
    #: The features' keys for a compiled model passed in without ``use_compile``: none in Lightning; a distribution may
    #: turn on features that change nothing beyond the model and its Trainer (no backend, no process-wide setting).
    input_defaults: ClassVar[Mapping[str, Any]] = _Frozen()

    def __init__(self, trainer: "pl.Trainer", use_compile: _USE_COMPILE = None) -> None:
        self.trainer = trainer
        self.use_compile = use_compile  # as given, for messages
        self.enabled = use_compile is not None and use_compile is not False  # compile every model after the wrap
        if self.enabled and not _TORCH_GREATER_EQUAL_2_6:  # the oldest it is tested with
            raise RuntimeError(
                f"`Trainer(use_compile=...)` needs torch 2.6 or newer, but torch {torch.__version__} is installed."
                " Upgrade torch, or remove `use_compile`."
            )
        self.options = _CompileOptions()
        self.features: list[_CompileFeature] = []
        if self.enabled:
            classes = _feature_classes()
            self.options = _parse_use_compile(use_compile, {k: d for f in classes for k, d in f.keys.items()})
            keys = {**self.defaults, **self.options.keys}
            self.options = _CompileOptions(self.options.torch_kwargs, _Frozen(keys))
            self.features = _build_features(classes, self.options)
        #: The arguments of a compiled model passed in.
        self._input_kwargs: Optional[Mapping[str, Any]] = None
        #: The run in progress, what its features see of it (``None``: it compiles nothing).
        self.run: Optional[_CompileRun] = None

    def verify_strategy(self) -> None:
        """Rejects a strategy that cannot run compiled, while the Trainer is being constructed."""
        if self.enabled and not isinstance(self.trainer.strategy, ModelParallelStrategy):
            # (`ModelParallelStrategy` runs what `use_compile` compiles in `configure_model`)
            _verify_strategy_can_compile(self.trainer.strategy)
        for feature in self.features:
            feature.verify(self.trainer)

    def unwrap(self, model: Any) -> Any:
        """The model to run: a compiled one passed in unwrapped where the run compiles it after the setup instead.

        Under ``use_compile`` (after checking that it was compiled as ``use_compile`` asks), for a launcher that pickles
        the model (``ddp_spawn``), and, with ``input_defaults``, on every launcher.

        """
        if model is self.trainer.lightning_module and self._input_kwargs is not None and self.input_defaults:
            rank_zero_warn(
                "The model was passed compiled to an earlier stage of this Trainer, and now without its `torch.compile`"
                " wrapper, so this stage runs it uncompiled. Pass the compiled model, or no model, to run it compiled."
            )
        # (with `input_defaults`, the run made the model plain again: passed plain, it runs plain)
        if model is not self.trainer.lightning_module or self.input_defaults:
            self._input_kwargs = None
        if self.enabled:  # `use_compile=False` compiles nothing of its own: a model compiled by hand runs as without it
            _verify_one_compile(model, self.use_compile, self.options.torch_kwargs)
        if not isinstance(model, OptimizedModule) or not isinstance(model._orig_mod, pl.LightningModule):
            return model  # Lightning's own checks refuse what it cannot run, as before
        if model._orig_mod._compiler_ctx is not None:  # passed compiled again: its own steps are compiled, not these
            to_uncompiled(model)
        if self.enabled:  # compiled with `use_compile`'s own arguments: compiled once, after the wrap
            return model._orig_mod
        launcher = self.trainer.strategy.launcher
        # `spawn` and `forkserver` pickle the model for the new processes; `fork` and a new script (`ddp`) do not
        pickles = isinstance(launcher, _MultiProcessingLauncher) and not launcher.is_interactive_compatible
        known = getattr(model, "_compile_kwargs", None) is not None  # Fabric's capture; `_unwrap_compiled` needs them
        if pickles and not known:
            rank_zero_warn(
                "The model's `torch.compile` arguments are unknown (it was compiled before `lightning` was imported),"
                " so its steps are compiled before the launch, and the launcher cannot pickle them for its processes."
                " Import `lightning` before calling `torch.compile`, or use `strategy='ddp'`."
            )
        # the features (`input_defaults`) run in the compile after the setup, on every launcher
        if not (pickles or self.input_defaults) or not known:
            return model  # Lightning compiles its steps as it is passed in (`from_compiled`), as before
        _verify_strategy_can_compile(self.trainer.strategy)  # where Lightning checks a compiled model
        module, self._input_kwargs = _unwrap_compiled(model)
        return module

    def on_run_start(self, model: "pl.LightningModule") -> None:
        """Decides what this run compiles, before the strategy sets the model up."""
        given = self.options.torch_kwargs if self.enabled else self._input_kwargs
        if given is None or (self.enabled and _compiles_nothing(given)):
            return
        if not self.enabled and self.input_defaults and not self.features:
            keys = _Frozen(dict(self.input_defaults))
            self.options = _CompileOptions(_Frozen(), keys)
            self.features = _build_features(_feature_classes(), self.options)
        if self.enabled and self.features:  # what `use_compile`'s features change is process-wide: one run at a time
            self._claim_the_process()
        run = self.run = _CompileRun(self.trainer, self.use_compile, self.options, given, list(self.features))
        for feature in run.features:
            feature.on_run_start(run, model)
        kwargs: Mapping[str, Any] = given
        for feature in run.features:
            kwargs = feature.compile_kwargs(run, kwargs)
        run.run_kwargs = _Frozen(dict(kwargs))
        if self.enabled or self.input_defaults:  # a compiled model passed in gets the re-apply alone, by default
            run.reset_crowded_code_at_end(model)

    def compile(self) -> None:
        """Compiles, in place, what the strategy runs in this stage, now that the strategy has set the model up."""
        run = self.run
        if run is None:
            return
        step_only: dict[str, Any] = {}
        for feature in run.features:
            step_only.update(feature.setup(run))
        kwargs = _Frozen({**run.run_kwargs, **step_only})  # the steps' arguments: the run's, and the steps' own
        module = self.trainer.lightning_module
        wrapper = self.trainer.strategy.model
        if (
            wrapper is not None
            # the one setup where compiling DDP's call traces DDP's code
            and private_names.ddp_uses_python_reducer(wrapper)
            and (self.enabled or self.input_defaults)
            and self._compile_wrapper(run, wrapper, kwargs)
        ):
            return
        run.keep_copies_plain(module, ("_compiler_ctx", "forward", *STEPS))
        # the strategy runs the steps, directly or inside its wrapper (DDP, FSDP): they are compiled in place
        # `inspect.unwrap`: past Fabric's capture of `torch.compile`, which this compile has no use for
        from_compiled(cast(OptimizedModule, inspect.unwrap(torch.compile)(module, **kwargs)))
        run.defer(to_uncompiled, module)
        assert module._compiler_ctx is not None
        for name in STEPS:
            original = module._compiler_ctx[f"original_{name}"]
            if callable(original):  # `validation_step = None` turns the loop off
                setattr(module, name, run.wrap(getattr(module, name), original))

    def _compile_wrapper(self, run: _CompileRun, wrapper: torch.nn.Module, kwargs: Mapping[str, Any]) -> bool:
        """Compiles DDP's call in place to train, as Fabric does; ``False`` where the steps are compiled inside it.

        Only under DDP's python reducer (compiled autograd) is DDP's forward traced with the step: its ``_pre_forward``
        then runs compiled. Under its C++ reducer, DDP's own code runs as Python whatever compiles it, so the steps are
        compiled, as everywhere else. DDP wraps the model to fit only; fit's evaluation runs DDP's own call, into the
        validation step compiled on the module.

        """
        if kwargs.get("fullgraph"):
            # DDP's forward breaks the graph at its inner module call: its steps are compiled inside it
            rank_zero_info("`fullgraph=True`: the steps are compiled inside the strategy's wrapper, not the wrapper.")
            return False
        wrapper.compile(**kwargs)
        # `nn.Module.compile` keeps the compiled call there, and torch has no public way to undo it
        run.defer(wrapper.__dict__.pop, private_names.COMPILED_CALL, None)
        own = private_names.module_call(wrapper)
        compiled = run.wrap(cast(Callable, private_names.compiled_call(wrapper)), own)
        trainer = self.trainer

        def call(*args: Any, **kwargs: Any) -> Any:  # traced with the step to train; DDP's own call to evaluate
            return (compiled if trainer.training else own)(*args, **kwargs)

        setattr(wrapper, private_names.COMPILED_CALL, call)
        module = trainer.lightning_module
        step = module.validation_step
        if callable(step):  # `validation_step = None` turns the loop off
            run.replace(module, "validation_step", run.wrap(torch.compile(step, **kwargs), step))
        return True

    def teardown(self) -> None:
        """Ends the run in progress, if any: its features, what it compiled and its settings, then the claim."""
        run, self.run = self.run, None
        with contextlib.ExitStack() as stack:  # callbacks run last-in, first-out
            stack.callback(self._release)
            if run is not None:
                stack.callback(run.end)

    def _claim_the_process(self) -> None:
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

    def _release(self) -> None:
        if _RUNNING and _RUNNING[0] is self:
            _RUNNING.clear()


def _verify_one_compile(model: Any, use_compile: Any, kwargs: Mapping[str, Any]) -> None:
    """Refuses a model compiled by hand otherwise than ``use_compile`` asks: which of the two to run is unclear."""
    if isinstance(model, OptimizedModule):
        given = getattr(model, "_compile_kwargs", None)
        if given is not None and _explicit(given) == _explicit(kwargs):
            return  # the compile that `use_compile` asks for
        how = "before `lightning` was imported" if given is None else f"with `torch.compile(model, **{dict(given)})`"
        plain = "`model._orig_mod`"
    elif getattr(model, "_compiler_ctx", None) is not None:
        how = "with `from_compiled`, or left compiled by an earlier run of a compiled model,"
        plain = "`to_uncompiled(model)`"
    else:
        return
    raise ValueError(
        f"The model passed in was compiled {how} and `Trainer(use_compile={use_compile!r})` asks for a compile of its"
        f" own. Pass the uncompiled model ({plain}), or remove `use_compile`."
    )


def _compiles_nothing(kwargs: Mapping[str, Any]) -> bool:
    """Whether ``torch.compile`` with ``kwargs`` returns the module itself (``disable=True``, Dynamo off).

    If so, says that the run trains uncompiled, and why.

    """
    if torch.compile(_never_run, **kwargs) is not _never_run:
        return False
    if kwargs.get("disable"):
        why = "`use_compile={'disable': True}`"
    elif os.environ.get("TORCHDYNAMO_DISABLE") == "1":
        why = "`TORCHDYNAMO_DISABLE=1`"
    else:
        why = "`torch.compile` returns the model unchanged"
    rank_zero_info(f"`Trainer(use_compile=...)`: compiling is off ({why}), so this run trains uncompiled.")
    return True


def _explicit(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``torch.compile`` arguments without those that have its default value, a ``None`` read as what it stands for."""
    # `mode=None` is "default"; `backend=None` is inductor, torch 2.13's default in the signature (2.6's: "inductor")
    meaning = {"mode": "default", "backend": "inductor"}
    defaults = {name: p.default for name, p in inspect.signature(torch.compile).parameters.items()}
    defaults = {**defaults, **{key: value for key, value in meaning.items() if defaults.get(key) is None}}
    kwargs = {key: meaning.get(key) if value is None and key in meaning else value for key, value in kwargs.items()}
    return {key: value for key, value in kwargs.items() if value != defaults.get(key, inspect.Parameter.empty)}


def _torch_compile_keys() -> list[str]:
    return [name for name in inspect.signature(torch.compile).parameters if name != "model"]


def _parse_use_compile(use_compile: Any, feature_keys: dict[str, str]) -> _CompileOptions:
    """Checks a ``use_compile`` value, with ``torch.compile`` itself."""
    if use_compile is None or isinstance(use_compile, bool):
        return _CompileOptions()
    if not isinstance(use_compile, Mapping):
        raise TypeError(
            f"`Trainer(use_compile={use_compile!r})` is not supported: pass `True`, `False`, `None` or a dict of"
            f" `torch.compile` arguments such as `use_compile={{'mode': 'max-autotune'}}`."
        )
    torch_keys = _torch_compile_keys()
    known = [*torch_keys, *feature_keys]
    for key in use_compile:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            own = "".join(f"; {name!r}: {description}" for name, description in feature_keys.items())
            raise ValueError(
                f"`Trainer(use_compile=...)` got the unknown key {key!r}.{hint} Valid keys: {torch_keys}{own}."
            )
    torch_kwargs = {k: v for k, v in use_compile.items() if k in torch_keys}
    _check_compile_kwargs(torch_kwargs)
    keys = {k: v for k, v in use_compile.items() if k not in torch_keys}
    return _CompileOptions(torch_kwargs=_Frozen(torch_kwargs), keys=_Frozen(keys))


def _never_run() -> None:
    """What the dry ``torch.compile`` call of :func:`_check_compile_kwargs` compiles: it is never called."""


def _check_compile_kwargs(kwargs: Mapping[str, Any]) -> None:
    """Checks ``torch.compile`` arguments when the Trainer is built, rather than minutes later at the first step.

    ``torch.compile`` checks them itself: a dry call on a function that is never run builds the backend, which looks
    up its name and applies the mode and the options, so every value torch accepts passes and every value it refuses
    fails with its own reason. What torch takes without a check (the type of a flag, of the backend) is checked here.

    """
    for key in ("fullgraph", "disable", "dynamic", "isolate_recompiles"):
        if kwargs.get(key) is not None and not isinstance(kwargs[key], bool):
            raise TypeError(f"`Trainer(use_compile={{{key!r}: {kwargs[key]!r}}})` must be a bool.")
    for key in ("mode", "name"):
        if kwargs.get(key) is not None and not isinstance(kwargs[key], str):
            raise TypeError(f"`Trainer(use_compile={{{key!r}: {kwargs[key]!r}}})` must be a string.")
    if kwargs.get("options") is not None and not isinstance(kwargs["options"], Mapping):
        raise TypeError("`Trainer(use_compile={'options': ...})` must be a dict of backend options.")
    # the arguments of newer torch versions, which torch takes unchecked
    for key in ("shapes_spec", "dynamic_shapes"):  # torch 2.13 and 2.14 name it differently
        spec = kwargs.get(key)
        if spec is not None and not isinstance(spec, Mapping) and type(spec).__name__ != "ParamsSpec":
            raise TypeError(f"`Trainer(use_compile={{{key!r}: {spec!r}}})` must be a dict, a `ParamsSpec` or `None`.")
    limit = kwargs.get("recompile_limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        kind = ValueError if isinstance(limit, int) and not isinstance(limit, bool) else TypeError
        raise kind(f"`Trainer(use_compile={{'recompile_limit': {limit!r}}})` must be a positive int.")
    backend = kwargs.get("backend", "inductor")
    if not callable(backend) and not isinstance(backend, str):
        raise TypeError(f"`Trainer(use_compile={{'backend': {backend!r}}})` must be a backend name or a callable.")
    try:
        torch.compile(_never_run, **kwargs)
    except Exception as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        names = torch.compiler.list_backends(exclude_tags=()) if isinstance(backend, str) else []
        close = [name for name in difflib.get_close_matches(str(backend), names, n=1) if name != backend]
        hint = f" Did you mean {close[0]!r}?" if close else ""
        kind = TypeError if reason.startswith("Unexpected type") else ValueError  # an option of the wrong type
        raise kind(f"`torch.compile` refuses `Trainer(use_compile=...)`'s arguments: {reason}{hint}") from error
