"""Compiled autograd: the backward pass is traced when it runs and compiled, with DDP's all-reduces inside its graph.

``use_compile={"compiled_autograd": True}`` compiles the backward with the same ``torch.compile`` arguments as the step;
a dict gives the backward arguments of its own. Compiled autograd is entered for the run, in each process (so it works
under ``ddp_spawn`` and the subprocess launcher, with nothing set in the parent), and left when the run ends, on every
path. Every backward pass in the run goes through it, a callback's included.

Under DDP, compiled autograd needs DDP's python reducer, which DDP chooses once, when it is built. In each rank:

=====================  ===============================================  ===============================================
when                   what                                             why
=====================  ===============================================  ===============================================
before DDP is built    ``torch._dynamo.config.optimize_ddp =            the C++ reducer cannot be traced: compiled
                       "python_reducer"``                               autograd refuses it
after the wrap         check that DDP uses the python reducer           a hook may have reset ``optimize_ddp``
around each forward    broadcast the buffers where DDP would            the python reducer skips DDP's
(eager)                                                                 ``_pre_forward`` and ``_post_forward``
the run ends           remove the reducer's gradient hooks, restore     or a later ``backward()`` still all-reduces,
                       what DDP set for the process                     and Dynamo keeps tracing DDP's file
=====================  ===============================================  ===============================================

"""

import inspect
from collections.abc import Mapping
from typing import Any, Callable

import torch
from torch.nn.parallel import DistributedDataParallel

import lightning.pytorch as pl
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning_compile_patch.compile_features import _CompileFeature, _CompileOptions
from lightning_compile_patch.compile_features import _private_names as private_names
from lightning_compile_patch.compile_features._run import _CompileRun

_KEY = "compiled_autograd"


class _CompiledAutograd(_CompileFeature):
    """Compiles the backward with compiled autograd, and under DDP all-reduces inside it (DDP's python reducer)."""

    keys = {
        _KEY: "True, or a dict of `torch.compile` arguments for the backward: compile the backward (compiled autograd)"
    }
    order = 45
    runs_with = {
        "optimize_ddp": ((None, "auto", "python_reducer"), "under DDP, compiled autograd needs DDP's python reducer"),
        "fallback": (
            (None,),
            "after a compile error the run would go on with the backward still compiled and, under DDP, with the python"
            " reducer",
        ),
    }

    def __init__(self, options: _CompileOptions) -> None:
        self.value = options.keys.get(_KEY)
        self.enabled = self.value is not None and self.value is not False
        if not self.enabled:
            return
        if self.value is not True and not isinstance(self.value, Mapping):
            raise TypeError(
                f"`Trainer(use_compile={{'{_KEY}': {self.value!r}}})` must be `True` (the backward is compiled with the"
                f" step's `torch.compile` arguments) or a dict of `torch.compile` arguments, such as"
                f" `{{'{_KEY}': {{'backend': 'aot_eager'}}}}`."
            )
        known = [name for name in inspect.signature(torch.compile).parameters if name != "model"]
        unknown = [key for key in (self.value if self.value is not True else {}) if key not in known]
        if unknown:
            raise ValueError(
                f"`Trainer(use_compile={{'{_KEY}': {{{unknown[0]!r}: ...}}}})` is not a `torch.compile` argument."
                f" Valid keys: {known}."
            )
        if private_names.compiled_autograd_switch() is None:
            raise RuntimeError(
                f"`Trainer(use_compile={{'{_KEY}': ...}})` needs torch>=2.6 (`compiled_autograd._enable`), and torch"
                f" {torch.__version__} is installed. Upgrade torch, or remove '{_KEY}'."
            )

    def verify(self, trainer: "pl.Trainer") -> None:
        if not self.enabled:
            return
        strategy = trainer.strategy
        if not isinstance(strategy, (DDPStrategy, SingleDeviceStrategy)):
            raise ValueError(
                f"`Trainer(use_compile={{'{_KEY}': ...}})` supports one device and DDP, not"
                f" {type(strategy).__name__}. Remove '{_KEY}', or use `strategy='ddp'`."
            )
        if not isinstance(strategy, DDPStrategy):
            return
        # what the python reducer does not support: it all-reduces each parameter's gradient from a hook of its own
        ddp_kwargs, comm_hook = private_names.ddp_options(strategy)
        unsupported = {
            "bucket_cap_mb_list": "it has no buckets",
            "find_unused_parameters": "ranks whose unused parameters differ would all-reduce different tensors",
        }
        for name, why in unsupported.items():
            if ddp_kwargs.get(name):
                raise ValueError(
                    f"`Trainer(use_compile={{'{_KEY}': ...}})` runs DDP with its python reducer, which does not support"
                    f" `{name}` ({why}). Remove `{name}` from the DDPStrategy, or remove '{_KEY}'."
                )
        if comm_hook is not None:
            raise ValueError(
                f"`Trainer(use_compile={{'{_KEY}': ...}})` runs DDP with its python reducer, which calls a"
                f" communication hook per parameter, not per bucket. Remove `ddp_comm_hook`, or remove '{_KEY}'."
            )

    def on_run_start(self, run: _CompileRun, model: "pl.LightningModule") -> None:
        if not self.enabled:
            return
        captures = private_names.backward_graphs_compiled()
        run.note(lambda: _captured(private_names.backward_graphs_compiled() - captures))
        trainer = run.trainer
        if isinstance(trainer.strategy, DDPStrategy) and trainer.state.fn == TrainerFn.FITTING:  # DDP wraps to fit only
            _use_python_reducer(run)

    def setup(self, run: _CompileRun) -> Mapping[str, Any]:
        if not self.enabled:
            return {}
        wrapper = run.trainer.strategy.model
        if isinstance(wrapper, DistributedDataParallel):
            if not private_names.ddp_uses_python_reducer(wrapper):
                raise RuntimeError(
                    f"`Trainer(use_compile={{'{_KEY}': ...}})` set DDP's python reducer, but DDP was built with its C++"
                    " reducer, which compiled autograd cannot trace: `torch._dynamo.config.optimize_ddp` was changed"
                    " after `fit` started (in a `setup` or `configure_model` hook?). Leave it to `use_compile`."
                )
            run.defer(private_names.remove_reducer_hooks, wrapper, scope="run")
        backward_kwargs = run.run_kwargs if self.value is True else self.value
        switch = private_names.compiled_autograd_switch()
        assert switch is not None
        run.enter(switch(torch.compile(**(backward_kwargs or {}))), scope="run")
        return {}

    def wrap(self, run: _CompileRun, compiled: Callable, original: Callable) -> Callable:
        wrapper = run.trainer.strategy.model
        if not (self.enabled and isinstance(wrapper, DistributedDataParallel)):
            return compiled
        ddp: DistributedDataParallel = wrapper
        if not private_names.ddp_uses_python_reducer(ddp):
            return compiled

        def synced(*args: Any, **kwargs: Any) -> Any:
            # what DDP's `_pre_forward`/`_post_forward` do with buffers, and skip under the python reducer
            private_names.sync_ddp_buffers(ddp, before=True)
            output = compiled(*args, **kwargs)
            private_names.sync_ddp_buffers(ddp, before=False)
            ddp.require_forward_param_sync = torch.is_grad_enabled() and ddp.require_backward_grad_sync
            return output

        return synced


def _captured(captures: int) -> str:
    """What the run's summary line says of compiled autograd."""
    return f"compiled autograd: {captures} backward graph{'s' if captures != 1 else ''} compiled"


def _use_python_reducer(run: _CompileRun) -> None:
    """Sets the python reducer for the DDP built next; the run restores what this and DDP set for the process."""
    run.replace(private_names.dynamo_config, "optimize_ddp", "python_reducer", scope="run")
    # DDP sets them when it is built: they are put back when the run ends
    for name in private_names.INDUCTOR_DDP_SETTINGS:
        run.replace(private_names.inductor_config, name, getattr(private_names.inductor_config, name), scope="run")
    if not private_names.ddp_file_traced():  # DDP adds its file to Dynamo's inline list when it is built
        run.defer(private_names.stop_tracing_ddp_file, scope="run")


FEATURE = _CompiledAutograd
