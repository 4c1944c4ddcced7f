"""The private names the compile features read, in one place: each entry, what it is for, and its versions.

torch has no public API yet for what several features need: which graphs ran, why a frame was skipped, resetting
one code object's compiled entries, turning compiled autograd on for a run. Nor does Lightning for a few of its objects
(the strategy's ``LightningOptimizer`` list, its DDP arguments), nor CPython for the calling frame. Each such name is
reached here and nowhere else, behind a function or constant named for what the features do with it, so that a release
that moves one breaks one line, and a test per CI torch (``tests/test_private_names.py``) calls every entry as the
features do; that test also fails on a private name read outside this module.

The range after each entry is the torch versions it is read on (where it is looked up with ``getattr``, the versions
that have it); CI calls each on torch 2.6, 2.13 and 2.15 (2.14 with its nox session), and Lightning's own CI imports
it on 2.1 and 2.9. DDP's private attributes, which compiled autograd needs under the python reducer, are here too.
Lightning's are read on Lightning 2.1 to 2.6 and master.

"""

import operator
import os
import re
import sys
import types
import weakref
from typing import Any, Callable, Optional

import torch
import torch._dynamo.config
import torch._functorch.config
import torch._inductor.config
from lightning_utilities.core.imports import compare_version
from torch._dynamo import convert_frame
from torch._dynamo import utils as dynamo_utils
from torch.nn.parallel import DistributedDataParallel

# Settings, which features change per run through the run, which restores them.

#: Dynamo's settings (2.1-2.15): ``optimize_ddp`` chosen per run; ``suppress_errors`` and the recompile limit read.
dynamo_config = torch._dynamo.config
#: AOTAutograd's settings: ``force_non_lazy_backward_lowering`` set per run (2.13-2.15).
functorch_config = torch._functorch.config
#: Inductor's settings: the two that building a DDP under the python reducer sets for the process (2.6-2.15).
inductor_config = torch._inductor.config

#: Dynamo's recompile limit: ``recompile_limit`` on 2.7-2.15, ``cache_size_limit`` on 2.1-2.6.
RECOMPILE_LIMIT = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"


def recompile_limit() -> int:
    """How many compiled entries Dynamo keeps for one code object before it runs that code uncompiled (2.1-2.15)."""
    return int(getattr(dynamo_config, RECOMPILE_LIMIT))


def errors_suppressed() -> bool:
    """Whether ``suppress_errors`` hides compile errors and runs the frame uncompiled instead (2.1-2.15)."""
    return bool(dynamo_config.suppress_errors)


#: The logger Dynamo tells a recompile-limit hit on, its only report of one (2.1-2.15).
RECOMPILE_LIMIT_LOGGER = convert_frame.__name__


#: How Dynamo names a frame in that message: ``'training_step' (/path/model.py:12)`` (2.1-2.15).
FRAME_IN_MESSAGE = re.compile(r"'(?P<name>[^']*)' \((?P<file>.*):(?P<line>\d+)\)")
#: Between the parts of Dynamo's reason for a graph break that led to another one (2.8-2.15).
CHAINED_BREAK = "*** While handling this graph break, another graph break occurred: ***"
#: Whether compilation metrics tell a frame Dynamo compiled with no graph from one it skipped (2.13-2.15; 2.6 records a
#: frame skipped for a graph break in a loop as no failure, with no graph, alike).
GRAPHLESS_FRAMES_TOLD = compare_version("torch", operator.ge, "2.13.0")
#: The sources of every value under one of the Trainer's loops, as Dynamo names them
#: (``L['self']._trainer.fit_loop.epoch_progress.current.completed``), whichever module or wrapper the compiled frame
#: starts from: Lightning's private ``LightningModule._trainer`` (2.0-2.6), in Dynamo's names of sources (2.8-2.15).
TRAINER_LOOP_SOURCES = r".*\._trainer\.(fit|validate|test|predict)_loop\..*"
#: Whether ``torch.compiler.config.dynamic_sources`` takes regular expressions (2.8-2.15, pytorch#151766; 2.7 takes
#: exact names only).
DYNAMIC_SOURCES_MATCH_PATTERNS = compare_version("torch", operator.ge, "2.8.0")


def is_recompile_limit_hit(message: str) -> bool:
    """Whether a record of ``RECOMPILE_LIMIT_LOGGER`` tells a hit, as ``hit config.recompile_limit (8)`` (2.1-2.15)."""
    return "hit config." in message and ("recompile_limit" in message or "cache_size_limit" in message)


#: Whether the backward can be compiled together with the forward (``force_non_lazy_backward_lowering``, 2.13-2.15).
NON_LAZY_BACKWARD = hasattr(functorch_config, "force_non_lazy_backward_lowering")

# Counters (``torch._dynamo.utils.counters``, 2.1-2.15): totals for the process, read as differences over a run.


def graphs_compiled() -> int:
    """How many graphs Dynamo has compiled in this process."""
    return int(dynamo_utils.counters["stats"]["unique_graphs"])


def graph_breaks() -> dict[str, int]:
    """How many graph breaks Dynamo has made in this process, by reason."""
    return dict(dynamo_utils.counters["graph_break"])


def backward_graphs_compiled() -> int:
    """How many backward graphs compiled autograd has captured in this process."""
    return int(dynamo_utils.counters["compiled_autograd"]["captures"])


def compilation_metrics() -> list[Any]:
    """Dynamo's record of its last 64 frame compiles, oldest first (``get_compilation_metrics``: 2.2-2.15, not 2.1).

    Each has the frame (``co_name``, ``co_filename``, ``co_firstlineno``), ``fail_type`` and ``fail_reason`` where it
    failed or was skipped, ``graph_op_count``, ``cache_size`` (its entries before: a recompile when above 0) and times.

    """
    return list(getattr(dynamo_utils, "get_compilation_metrics", list)())


def started_us(metrics: Any) -> float:
    """When a frame's compile started, in microseconds since the epoch.

    ``start_time_us`` on 2.6-2.15, ``start_time`` in seconds on 2.2-2.5.

    """
    return getattr(metrics, "start_time_us", None) or (getattr(metrics, "start_time", None) or 0) * 1e6


def compiles_since(since_us: float) -> list[Any]:
    """The compilation metrics of the frames Dynamo converted since ``since_us``, newest first."""
    recent = []
    for metrics in reversed(compilation_metrics()):
        if started_us(metrics) < since_us:
            break  # the rest are older still
        recent.append(metrics)
    return recent


def frame_key(frame: Any) -> tuple[Optional[str], Optional[str], Optional[int]]:
    """How compilation metrics name a frame's code: its name, file and first line, read off the metrics or a code."""
    return getattr(frame, "co_name", None), getattr(frame, "co_filename", None), getattr(frame, "co_firstlineno", None)


def failed_codes(since_us: float) -> list[types.CodeType]:
    """The code objects whose compile failed (or Dynamo skipped) since ``since_us``, the newest failure first."""
    keys = dict.fromkeys(frame_key(m) for m in compiles_since(since_us) if getattr(m, "fail_type", None))
    codes = [code for code in (ref() for ref in reversed(converted_codes())) if code is not None]
    return [code for key in keys for code in codes if frame_key(code) == key]


# Code objects: Dynamo keeps compiled entries, a recompile count and a "skip" mark per code object, for the process.


def converted_codes() -> list["weakref.ref[types.CodeType]"]:
    """Every code object Dynamo has converted in this process, in order, as weak references.

    ``input_codes.seen`` (2.1-2.15), which ``torch._dynamo.reset()`` empties.

    """
    return convert_frame.input_codes.seen


#: The code objects Dynamo made of the frames it converted (``output_codes``, 2.6-2.15; without it, empty).
OUTPUT_CODES: Any = getattr(convert_frame, "output_codes", ())


def cache_entries(code: types.CodeType) -> int:
    """How many compiled entries Dynamo holds for ``code`` (``_debug_get_cache_entry_list``, 2.1-2.15)."""
    return len(torch._C._dynamo.eval_frame._debug_get_cache_entry_list(code))


def per_code_reset() -> bool:
    """Whether this torch lists and resets one code object's entries (:func:`cache_entries`, :func:`reset_code`)."""
    eval_frame = torch._C._dynamo.eval_frame
    return hasattr(eval_frame, "_debug_get_cache_entry_list") and hasattr(eval_frame, "reset_code")


def reset_code(code: types.CodeType) -> None:
    """Drops ``code``'s compiled entries, its recompile count and its "skip" mark (``reset_code``, 2.1-2.15)."""
    torch._C._dynamo.eval_frame.reset_code(code)


def skip_code(code: types.CodeType) -> None:
    """Dynamo runs ``code`` uncompiled as a frame of its own, and still inlines it into a traced caller.

    The Python ``skip_code`` on 2.13-2.15, which also records it; the C one on 2.1-2.12.

    """
    skip = getattr(torch._dynamo.eval_frame, "skip_code", None)
    (skip or torch._C._dynamo.eval_frame.skip_code)(code)


def compiler_disabled(function: Any) -> Optional[str]:
    """Why ``function`` is marked ``torch.compiler.disable`` (``""`` without a reason), or ``None`` where it is not.

    ``_torchdynamo_disable`` on its wrapper (2.1-2.15), the ``reason`` in ``_torchdynamo_disable_msg`` (2.7-2.15).

    """
    if not getattr(function, "_torchdynamo_disable", False):
        return None
    return str(getattr(function, "_torchdynamo_disable_msg", None) or "")


# Backends and errors.


def backend(name_or_callable: Any, mode: Optional[str], options: Optional[dict], dynamic: Optional[bool]) -> Any:
    """The backend ``torch.compile`` builds from its arguments, for a feature that wraps it.

    ``_TorchCompileInductorWrapper`` for inductor, ``_TorchCompileWrapper`` otherwise (2.1-2.15).

    """
    if name_or_callable is None or name_or_callable == "inductor":
        return torch._TorchCompileInductorWrapper(mode, options, dynamic)
    return torch._TorchCompileWrapper(name_or_callable, mode, options, dynamic)


#: Texts of Dynamo's graph-break reasons that name torch's own code, which breaks there on purpose or cannot be traced,
#: and whose code it is: DDP runs its inner module call outside the outer graph (``_inside_ddp_forward``), its C++
#: reducer and logger cannot be traced (2.14 steps into DDP's forward and breaks at them), and FSDP2's hooks are
#: compiler-disabled (2.6-2.15).
TORCH_BREAKS = {"_inside_ddp_forward": "DDP", "of class `Reducer`": "DDP", "of class `Logger`": "DDP", "fsdp": "FSDP"}
#: What a failed compile raises (2.1-2.15); ``FailOnRecompileLimitHit`` (2.6+) is outside Dynamo's hierarchy.
COMPILE_ERRORS: tuple[type[BaseException], ...] = tuple(
    error
    for error in (torch._dynamo.exc.TorchDynamoException, getattr(torch._dynamo.exc, "FailOnRecompileLimitHit", None))
    if error is not None
)
#: What a compile raises when the backend failed on a graph (2.1-2.15): it would fail on any other frame too.
BACKEND_FAILED = torch._dynamo.exc.BackendCompilerFailed
#: What Dynamo raises when the traced code's own call raised: an op on fake tensors, or a builtin it evaluated.
WRAPPING_ERRORS = (torch._dynamo.exc.TorchRuntimeError, torch._dynamo.exc.InternalTorchDynamoError)
#: Where Dynamo's own Python code lives: an exception raised there is a failure to compile, whatever its type.
DYNAMO_DIR = os.path.dirname(torch._dynamo.__file__) + os.sep


# Compiled autograd and DDP (2.6-2.15).


def compiled_autograd_switch() -> Optional[Callable[..., Any]]:
    """The context manager that turns compiled autograd on with a compiler, or ``None`` where torch has none.

    ``compiled_autograd._enable`` (2.6-2.15), the same on each; older torch is not tested with it.

    """
    if torch.__version__ < "2.6":  # `TorchVersion` compares with a string
        return None
    try:
        from torch._dynamo import compiled_autograd
    except ImportError:
        return None
    return getattr(compiled_autograd, "_enable", None)


_DDP_FILE = "torch.nn.parallel.distributed"


def ddp_file_traced() -> bool:
    """Whether Dynamo traces DDP's own module: building a DDP under the python reducer adds it (2.6-2.15)."""
    return _DDP_FILE in torch._dynamo.trace_rules.LEGACY_MOD_INLINELIST


def stop_tracing_ddp_file() -> None:
    """Undoes what building a DDP under the python reducer added to Dynamo's inline list (2.6-2.15)."""
    torch._dynamo.trace_rules.LEGACY_MOD_INLINELIST.discard(_DDP_FILE)
    torch._dynamo.trace_rules.get_legacy_mod_inlinelist.cache_clear()


def ddp_uses_python_reducer(wrapper: Any) -> bool:
    """Whether ``wrapper`` is a DDP built with its python reducer, which compiled autograd can trace (2.6-2.15)."""
    return isinstance(wrapper, DistributedDataParallel) and bool(getattr(wrapper, "_use_python_reducer", False))


def remove_reducer_hooks(wrapper: DistributedDataParallel) -> None:
    """Removes the python reducer's gradient hooks, which DDP leaves on the parameters (2.6-2.15).

    Otherwise a later ``backward()`` would still all-reduce.

    """
    for handle in wrapper._accum_grad_hooks:
        handle.remove()
    wrapper._accum_grad_hooks.clear()


def sync_ddp_buffers(wrapper: DistributedDataParallel, before: bool) -> None:
    """Broadcasts the buffers where DDP's ``_pre_forward`` (``before``) or ``_post_forward`` would.

    Under the python reducer DDP skips both (2.6-2.15).

    """
    if wrapper._check_sync_bufs_pre_fwd() if before else wrapper._check_sync_bufs_post_fwd():
        wrapper._sync_buffers()


def inductor_default_cache_dir() -> str:
    """Inductor's on-disk cache directory when ``TORCHINDUCTOR_CACHE_DIR`` is unset (2.7-2.15)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return default_cache_dir()


# Modules: ``nn.Module.compile`` keeps its compiled call on the module (2.2-2.15).

#: The attribute ``nn.Module.compile`` sets to the module's compiled call, which ``__call__`` runs in its place.
COMPILED_CALL = "_compiled_call_impl"


def compiled_call(module: torch.nn.Module) -> Optional[Callable[..., Any]]:
    """The compiled call ``module.compile()`` set, or ``None`` where the module is not compiled in place."""
    return getattr(module, COMPILED_CALL, None)


def module_call(module: torch.nn.Module) -> Callable[..., Any]:
    """The module's own call, hooks and ``forward``, which its compiled call replaces (``_call_impl``)."""
    return module._call_impl


def tensor_parallel_hooks(module: torch.nn.Module) -> bool:
    """Whether ``parallelize_module`` (``distribute_module``) put its hooks on ``module``.

    Its mark ``_distribute_module_applied`` is read on 2.13-2.15; torch 2.6 sets none, so there it reads ``False``.

    """
    return bool(getattr(module, "_distribute_module_applied", False))


#: What building a DDP under the python reducer sets in inductor's settings, for the whole process (2.6-2.15).
INDUCTOR_DDP_SETTINGS = ("_fuse_ddp_communication", "_fuse_ddp_bucket_size")


# Graphs and frames.


def undisabled(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """What a backend's compiled graph runs, without the ``torch.compiler.disable`` wrapper the backend put around it.

    Dynamo puts a wrapper of its own around whatever a backend returns (every version), so a backend that wraps
    another's graph (the summary's) calls what the inner wrapper stands for: the same, in three Python calls fewer. A
    wrapper that disables only its own frame (``recursive=False``) is kept (2.1-2.15).

    """
    if getattr(compiled, "_torchdynamo_disable", False) and getattr(compiled, "_torchdynamo_disable_recursive", True):
        return getattr(compiled, "_torchdynamo_orig_callable", compiled)
    return compiled


def run_like(run: Callable[..., Any], compiled: Callable[..., Any]) -> Callable[..., Any]:
    """``run``, a wrapper of a backend's compiled graph, called as ``compiled`` is.

    That is, with its inputs as one list where ``compiled`` takes them so (AOTAutograd's ``_boxed_call``, 2.1-2.15).

    """
    run._boxed_call = getattr(compiled, "_boxed_call", False)
    return run


def wrapped_function(function: Any) -> Any:
    """What ``function`` wraps, or ``None``.

    ``functools.wraps``'s ``__wrapped__``; Dynamo's ``_torchdynamo_orig_callable``, the function that a
    ``torch.compile`` or ``torch.compiler.disable`` wrapper stands for (2.1-2.15); a partial's ``func``.

    """
    names = ("__wrapped__", "_torchdynamo_orig_callable", "func")
    return next((inner for name in names if (inner := getattr(function, name, None)) is not None), None)


#: ``frame_above(n)``: the frame ``n`` calls above the function that calls it (CPython's ``sys._getframe``, every
#: version). Bound, not wrapped: it runs on every compiled step.
frame_above = sys._getframe


#: Dynamo's name for the code it resumes a function with after a graph break: ``torch_dynamo_resume_in_<fn>_at_<line>``
#: (2.1-2.15).
RESUME_FUNCTION = re.compile(r"torch_dynamo_resume_in_(?P<function>.+)_at_(?P<line>\d+)")


def resumed_function(name: str) -> Optional[str]:
    """The name of the function that the code named ``name`` resumes after a graph break, or ``None``."""
    match = RESUME_FUNCTION.fullmatch(name)
    return match["function"] if match else None


# Lightning's objects (2.1-2.6), read where Lightning has no public accessor.


def lightning_optimizers(strategy: Any) -> list[Any]:
    """The ``LightningOptimizer`` wrappers that ``self.optimizers()`` returns, one per optimizer of the strategy."""
    return list(strategy._lightning_optimizers)


def ddp_options(strategy: Any) -> tuple[dict[str, Any], Optional[Callable[..., Any]]]:
    """A ``DDPStrategy``'s keyword arguments for ``DistributedDataParallel``, and its communication hook."""
    return dict(strategy._ddp_kwargs), strategy._ddp_comm_hook


def forward_redirection(strategy: Any) -> Optional[Any]:
    """The strategy's ``_ForwardRedirection``: it runs a step through the wrapper's ``forward`` (FSDP)."""
    return getattr(strategy, "_forward_redirection", None)
