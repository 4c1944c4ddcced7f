"""What happens when compilation fails: an error that names the run, or ``fallback="eager"``.

A compile error deep inside Dynamo says what failed to trace, not which Trainer run it belongs to. The error raised
here names the stage, the strategy and the ``use_compile`` value, leaves every module uncompiled, and says how to go on.
With ``use_compile={"fallback": "eager"}``, the run warns once instead and continues uncompiled.

"""

from typing import Any, Callable

import torch

from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from lightning_compile_patch.connector import _CompileConnector, _CompileFeature

_CHOICES = (None, "eager")
#: What a failed compile raises; ``FailOnRecompileLimitHit`` exists from torch 2.7 on, outside Dynamo's hierarchy.
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

    def setup(self, connector: _CompileConnector) -> None:
        self.fell_back = False

    def wrap(self, connector: _CompileConnector, compiled: Callable, original: Callable) -> Callable:
        def run(*args: Any, **kwargs: Any) -> Any:
            if self.fell_back:
                return original(*args, **kwargs)
            try:
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
