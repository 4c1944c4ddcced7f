"""What happens when compilation fails: an error that names the run, or ``fallback="eager"``; and the next run.

A compile error deep inside Dynamo says what failed to trace, not which Trainer run it belongs to. The error raised
here names the stage, the strategy and the ``use_compile`` value, leaves every module uncompiled, and says how to go on.
With ``use_compile={"fallback": "eager"}``, the run warns once instead and continues uncompiled.

* The backward: AOTAutograd compiles it lazily, inside ``loss.backward()``, outside the compiled step. Where torch
  can compile it together with the forward (``force_non_lazy_backward_lowering``, torch 2.13+), it does so here, so
  a backward that cannot compile fails, or falls back, exactly like the forward. On older torch, and under manual
  optimization (whose steps may run the backward twice through one graph, which a backward compiled with the forward
  refuses), the error is raised from the backward, named the same way, and ``fallback`` cannot apply to it.
* The next run: when a compiled step raises (a bad batch, a failed assert), Dynamo marks the code it was compiling
  "skip" for the rest of the process, and every later run of the step would be eager. When a run fails, the code
  objects that Dynamo converted during that run, and only those, are reset, so the next run compiles again.

"""

import contextlib
from typing import Any, Callable, Optional

import torch
import torch._functorch.config as functorch_config
from torch._dynamo.convert_frame import input_codes

from lightning.pytorch.trainer.states import TrainerStatus
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from lightning_compile_patch.connector import _CompileConnector, _CompileFeature

#: torch 2.13+ can compile the backward together with the forward.
_NON_LAZY_BACKWARD = hasattr(functorch_config, "force_non_lazy_backward_lowering")

_CHOICES = (None, "eager")
#: What a failed compile raises; ``FailOnRecompileLimitHit`` (torch 2.6+) is outside Dynamo's hierarchy.
_COMPILE_ERRORS = tuple(
    error
    for error in (torch._dynamo.exc.TorchDynamoException, getattr(torch._dynamo.exc, "FailOnRecompileLimitHit", None))
    if error is not None
)


class _Fallback(_CompileFeature):
    """Names the run in a compile error; with ``fallback="eager"``, warns and continues uncompiled instead."""

    keys = {"fallback": "None (default: a compile error stops the run) or 'eager' (warn once, continue uncompiled)"}
    order = 90  # outermost: it catches what every other wrapper raises

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        self.fallback = options.get("fallback")
        if not any(self.fallback is choice for choice in _CHOICES):
            raise ValueError(
                f"`Trainer(use_compile={{'fallback': {self.fallback!r}}})` is not supported. Choose `None` (a compile"
                " error stops the run) or 'eager' (warn once and continue uncompiled)."
            )
        self.fell_back = False
        self._codes_before: Optional[int] = None
        self._restore_backward: Optional[Callable[[], None]] = None

    def on_run_start(self, connector: _CompileConnector, model: Any) -> None:
        self.fell_back = False
        self._codes_before = len(input_codes.seen)

    def setup(self, connector: _CompileConnector) -> None:
        if not _NON_LAZY_BACKWARD:
            self._restore_backward = _name_backward_errors(connector)

    def wrap(self, connector: _CompileConnector, compiled: Callable, original: Callable) -> Callable:
        def run(*args: Any, **kwargs: Any) -> Any:
            if self.fell_back:
                return original(*args, **kwargs)
            try:
                with _backward_with_forward(connector.trainer.lightning_module):
                    return compiled(*args, **kwargs)
            except _COMPILE_ERRORS as error:
                if self.fallback != "eager":
                    connector.uncompile()
                    raise RuntimeError(_failure_message(connector, error, fallback=False)) from error
                rank_zero_warn(
                    f"{_failure_message(connector, error, fallback=True)} It continues uncompiled (`fallback='eager'`)."
                )
                self.fell_back = True
                connector.uncompile()
                return original(*args, **kwargs)
            except Exception as error:
                if hasattr(error, "add_note"):  # Python 3.11+
                    error.add_note(f"(raised in the {_describe_run(connector)})")
                raise

        return run

    def teardown(self, connector: _CompileConnector) -> None:
        restore, self._restore_backward = self._restore_backward, None
        if restore is not None:
            restore()
        if self._codes_before is not None and connector.trainer.state.status == TrainerStatus.INTERRUPTED:
            for ref in input_codes.seen[self._codes_before :]:
                code = ref()
                if code is not None:
                    torch._C._dynamo.eval_frame.reset_code(code)  # clears its cache entries and its "skip" mark
        self._codes_before = None


def _backward_with_forward(module: Any) -> contextlib.AbstractContextManager:
    """Has AOTAutograd compile the backward while it compiles the forward, where torch can.

    Not under manual optimization: a backward compiled with the forward donates the buffers it saves, and then refuses
    a second backward through the same graph (``retain_graph=True``, a closure, two optimizers stepped from one loss),
    which a manual step may run. There the backward stays lazy, as torch compiles it by default.

    """
    if _NON_LAZY_BACKWARD and module.automatic_optimization:
        return functorch_config.patch(force_non_lazy_backward_lowering=True)
    return contextlib.nullcontext()


def _name_backward_errors(connector: _CompileConnector) -> Callable[[], None]:
    """On torch before 2.13: a backward that fails to compile raises an error naming the run; returns the undo."""
    strategy = connector.trainer.strategy
    backward = strategy.backward

    def named(*args: Any, **kwargs: Any) -> Any:
        try:
            return backward(*args, **kwargs)
        except _COMPILE_ERRORS as error:
            connector.uncompile()
            raise RuntimeError(
                f"{_failure_message(connector, error, fallback=False)} (It failed in the backward: `fallback` applies"
                " to the backward from torch 2.13 on.)"
            ) from error

    strategy.backward = named  # type: ignore[method-assign]
    return lambda: strategy.__dict__.pop("backward", None)


def _describe_run(connector: _CompileConnector) -> str:
    """The stage, the ``use_compile`` value and the strategy of the run, for messages."""
    trainer = connector.trainer
    stage = trainer.state.fn.value if trainer.state.fn else "unknown"
    value = _short(connector.use_compile)
    return f"{stage} step compiled by `use_compile={value}` under {type(trainer.strategy).__name__}"


def _short(value: Any) -> str:
    """A short ``repr`` that names callables and classes instead of printing them."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key!r}: {_short(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(map(_short, value)) + ("," if len(value) == 1 else "") + ")"
    if callable(value):
        return getattr(value, "__name__", type(value).__name__)
    return repr(value)


def _failure_message(connector: _CompileConnector, error: BaseException, fallback: bool) -> str:
    """What failed, where, and (unless falling back) what to do about it."""
    first_paragraph = str(error).strip().split("\n\n")[0].replace("\n", " ")
    reason = f"{type(error).__name__}: {first_paragraph}"
    message = f"`use_compile` could not compile the {_describe_run(connector)}: {reason}."
    if fallback:
        return message
    return (
        f"{message} Every module is left uncompiled. Pass `'fallback': 'eager'` in `use_compile` to continue"
        " uncompiled with a warning instead, or `use_compile=False` to leave compilation to Lightning."
    )


FEATURE = _Fallback
