"""``use_compile={"in_parts": True}``: where Dynamo cannot compile a step whole, the modules it calls run compiled.

Dynamo gives up on a whole frame in some steps: a graph break inside a loop (truncated BPTT, a ``print`` in a ``for``),
an exception raised inside the traced code that nothing there handles ("Observed exception": a tensor subclass whose
``shape`` reads ``super().shape``), the recompile limit, or the rest of a frame after a module it refuses (an RNN on
some torch versions). It then runs the frame, and everything the frame calls from torch's own modules, uncompiled: a
step that loops over ``self.encoder(chunk)`` ran no graph at all. (After a compile error, ``fallback="eager"`` runs the
failed frame uncompiled in the same way.) So each submodule of the LightningModule that holds parameters is compiled in
place as well, at every depth, for the run::

    training_step ── Dynamo skipped it (a graph break in its loop): runs eagerly
      self.encoder(chunk) ── compiled on its own: a graph
        encoder.layers[0] ── traced inside encoder's graph (a compiled call inside traced code is inlined)
      self.lstm(x, h) ── compiled on its own too: where Dynamo refuses it (an RNN), it runs eagerly
      self.head(out) ── compiled on its own: a graph

Where the step compiles whole, its graph traces through these modules as through any other: the same graph, no graph
break, nothing compiled twice. Where it does not, the module calls it makes run their own graphs: the step is
"compiled in parts" (the run summary counts such steps apart, with their cause). A module whose own ``forward`` Dynamo
skips leaves its submodules compiled on their own in turn.

Each module is compiled through a function of its own code object: Dynamo keeps compiled entries, and counts them
against its recompile limit, per code object, so twenty ``nn.Linear`` compiled through ``nn.Linear.forward`` would
leave all but the first eight eager. Left out: metrics (kept eager by ``eager_metrics``), what another feature
compiled already (regions), and the strategy's own wrappers. It applies under a single device and DDP, whose
LightningModule holds the model's own modules; a step marked ``torch.compiler.disable`` keeps everything it calls
uncompiled, as the mark says.

"""

import sys
import time
import types
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn

from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, SingleDeviceStrategy
from lightning_compile_patch.compile_features import STEPS, _CompileFeature, _CompileOptions, _flag
from lightning_compile_patch.compile_features import _private_names as private_names
from lightning_compile_patch.compile_features._run import _CompileRun


def compile_parts(module: nn.Module, kwargs: Mapping[str, Any], replace: Callable = setattr) -> list[nn.Module]:
    """Compiles, in place, every submodule of ``module`` that holds parameters, at every depth, and returns them;
    ``replace`` (``setattr`` by default; the run's records it, for the undo) sets each one's ``forward``.

    For example::

        parts = compile_parts(model, {"backend": "inductor"})  # [model.encoder, model.encoder[0], model.head]
        model(x)  # where Dynamo skips `model.forward`, `encoder` and `head` each run a graph of their own
        compiled, eager = outcome(parts, since_us)  # which of them ran on their own, compiled or not, and why not

    """
    parts = []

    def visit(parent: nn.Module) -> None:
        for child in parent.children():
            if _left_out(child) or not any(True for _ in child.parameters()):
                continue
            # a module that holds one compiled already (a region) is left as it is, its other submodules compiled:
            # its `forward` calls the region as an opaque function, so Dynamo would skip it where it loops over them
            holds_compiled = any(_compiled_already(sub) for sub in child.modules())
            if type(child).forward is not nn.Module.forward and not holds_compiled:  # a `ModuleList` has no call
                call = _own_code(_part)
                _PARTS[child] = _Part(torch.compile(call, **kwargs), call.__code__)
                replace(child, "forward", types.MethodType(_part_forward(type(child)), child))
                parts.append(child)
            visit(child)

    visit(module)
    # called from a step Dynamo skipped, a module's `forward` would be a frame Dynamo converts on its own, every
    # module's entries on its one code object; skipped as a frame, it is still traced into a compiled caller (the
    # package's own trampoline, marked at each call, for good: it is never the user's code)
    private_names.skip_code(_part_forward(nn.Module).__code__)  # every class's shares its code
    return parts


@dataclass
class _Part:
    """A module's compiled call, when it runs on its own, and whether it has."""

    compiled: Callable[..., Any]
    #: The code object Dynamo compiles the module's call from: its entries are this module's only.
    code: types.CodeType
    ran: bool = False
    #: What torch raised on it, if it did (its compile, or its graph): it runs uncompiled from then on.
    failed: Optional[str] = None


#: The compiled call of each module compiled in parts (its `forward`, from `_part_forward`, reaches it here).
_PARTS: "weakref.WeakKeyDictionary[nn.Module, _Part]" = weakref.WeakKeyDictionary()


#: The ``forward`` of each class compiled in parts (`_part_forward`), for every run and model of the process.
_PART_FORWARDS: dict[type, Callable[..., Any]] = {}


def _part_forward(cls: type[nn.Module]) -> Callable[..., Any]:
    """The ``forward`` of a module of class ``cls`` compiled in parts: one function per class, for every run and model.

    Where a compiled caller traces it, it is the class's ``forward``, traced inside the caller's graph: nothing the
    caller's guards see changes from one run or model to the next (a function made per run would recompile the step in
    every new Trainer). Where it runs on its own, it runs the module's graph. Its signature is the class's ``forward``'s
    (``inspect.signature``, which libraries read, follows ``__wrapped__``).

    """
    if cls in _PART_FORWARDS:
        return _PART_FORWARDS[cls]

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return type(self).forward(self, *args, **kwargs)
        part = _PARTS[self]
        part.ran = True
        if part.failed is not None:
            return type(self).forward(self, *args, **kwargs)
        try:
            return part.compiled(self, *args, **kwargs)
        except Exception as error:
            # a part is what a step Dynamo gave up on gets on top, and must not stop a run that trained without it.
            # Where torch fails on it (its compile, or its graph on a tensor subclass in the batch: aot_eager's
            # "Multiple dispatch failed"), the module runs uncompiled, from now on. Where the module's own call fails,
            # the uncompiled call raises the same error, as the user's. (A graph applies its changes to buffers as it
            # ends.)
            out = type(self).forward(self, *args, **kwargs)
            part.failed = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
            return out

    forward.__wrapped__ = cls.forward
    _PART_FORWARDS[cls] = forward
    return forward


def _part(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return type(module).forward(module, *args, **kwargs)


def _own_code(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` with a code object of its own: Dynamo keeps entries, and counts recompiles, per code object."""
    code = function.__code__.replace()
    return types.FunctionType(code, function.__globals__, function.__name__, None, function.__closure__)


def outcome(parts: list[nn.Module], since_us: float) -> tuple[list[nn.Module], dict[nn.Module, str]]:
    """The modules of ``parts`` that ran on their own compiled, and those Dynamo ran uncompiled, with why.

    Uncompiled: Dynamo refused their ``forward`` (from its records since ``since_us``), or compiled nothing for them.

    """
    failed: dict[tuple, str] = {}
    # oldest first: the newest failure of a frame stays
    for metrics in reversed(private_names.compiles_since(since_us)):
        if getattr(metrics, "fail_type", None):
            reason = str(getattr(metrics, "fail_reason", "") or metrics.fail_type).strip().splitlines()[0]
            failed[private_names.frame_key(metrics)] = reason.rstrip(".:")
    compiled, eager = [], {}
    for module in parts:
        part = _PARTS.get(module)
        if part is None or not part.ran:
            continue
        forward = getattr(type(module).forward, "__code__", None)
        refused = failed.get(private_names.frame_key(forward)) if forward else None
        if part.failed is not None:
            eager[module] = f"torch failed on it: {part.failed[:200]}"
        elif refused is None and private_names.cache_entries(part.code):
            compiled.append(module)
        else:
            eager[module] = f"Dynamo skipped it: {refused}" if refused else "Dynamo skipped it"
    return compiled, eager


def _compiled_already(module: nn.Module) -> bool:
    """Whether ``module`` is compiled in place already: a region, the user's own ``module.compile()``, TorchScript."""
    return "forward" in vars(module) or private_names.compiled_call(module) is not None


def _left_out(module: nn.Module) -> bool:
    """Whether ``module`` is left as it is: a metric, compiled already, or a wrapper of torch's distributed code."""
    if _compiled_already(module):
        return True
    if type(module).__module__.startswith(("torch.distributed", "torch.nn.parallel")):
        return True
    metric = getattr(sys.modules.get("torchmetrics"), "Metric", None)  # imported only where a metric can exist
    return metric is not None and isinstance(module, metric)


class _InParts(_CompileFeature):
    """Compiles the modules a step calls, so that a step Dynamo cannot compile whole still runs compiled in parts."""

    keys = {"in_parts": "True: the modules a step calls run compiled where Dynamo cannot compile the step whole"}

    def __init__(self, options: _CompileOptions) -> None:
        _flag(options, "in_parts")

    def setup(self, run: _CompileRun) -> Mapping[str, Any]:
        strategy = run.trainer.strategy
        kwargs = run.run_kwargs or {}
        module = run.trainer.lightning_module
        if (
            not isinstance(strategy, (SingleDeviceStrategy, DDPStrategy))
            or isinstance(strategy, DeepSpeedStrategy)
            or kwargs.get("fullgraph")  # the step compiles whole, or the run stops
            or any(private_names.compiler_disabled(getattr(module, name, None)) is not None for name in STEPS)
        ):
            return {}
        since_us = time.time_ns() // 1000
        parts = compile_parts(module, kwargs, replace=run.replace)
        names = {sub: name for name, sub in module.named_modules()}
        run.note(lambda: _note(parts, names, since_us))
        return {}


def _note(parts: list[nn.Module], names: dict[nn.Module, str], since_us: float) -> Optional[str]:
    """What the run summary says: the modules that ran compiled on their own, and those Dynamo ran eagerly, with why."""
    compiled, eager = outcome(parts, since_us)
    if not compiled and not eager:
        return None  # every module ran inside the step's graph
    said = []
    if compiled:
        n = len(compiled)
        own = "1 module ran compiled on its own" if n == 1 else f"{n} modules ran compiled on their own"
        said.append(f"{own} ({_names([names[m] for m in compiled])})")
    for why in dict.fromkeys(eager.values()):
        said.append(f"{_names([names[m] for m, reason in eager.items() if reason == why])} eager ({why})")
    return f"in parts: {'; '.join(said)}"


def _names(paths: list[str], most: int = 4) -> str:
    shown = ", ".join(f"`{path}`" for path in paths[:most])
    return shown + (f" and {len(paths) - most} more" if len(paths) > most else "")


FEATURE = _InParts
