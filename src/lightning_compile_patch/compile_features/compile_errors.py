"""What happens when compilation fails, whatever ``use_compile`` sets: an error that names the run, and the next run.

* A compile error deep inside Dynamo says what failed to trace, not which Trainer run it belongs to. It is raised
  again here with the stage, the strategy and the ``use_compile`` value, after every module is uncompiled, and says how
  to go on (``fallback="eager"``, in ``fallback.py``, catches it before it gets here). Any other error a step raises
  gets a note that names the run.
* The backward: AOTAutograd compiles it lazily, inside ``loss.backward()``, outside the compiled step. Where torch
  can compile it together with the forward (``force_non_lazy_backward_lowering``, torch 2.13+), it does so for the
  run, so that a backward that cannot compile fails, or falls back, exactly like the forward. This is also the rule
  for manual optimization: its steps may run the backward twice through one graph (``retain_graph=True``, a closure,
  two optimizers stepped from one loss), which a backward compiled with the forward refuses (it donates the buffers it
  saves), so there the backward stays lazy, as torch compiles it by default. On torch before 2.13, an error of the
  backward is named the same way, from the strategy's ``backward``.
* An error of the step's own code that Dynamo wraps: a ``TypeError`` raised by a torch op on fake tensors, or by a
  builtin that Dynamo evaluates while it traces (``isinstance(x, list[int])``), reaches the user as Dynamo's
  ``TorchRuntimeError`` or ``InternalTorchDynamoError``, which an ``except TypeError`` in the step or around
  ``trainer.fit`` does not catch. The named error is then also of the original type, and says how to run the step as
  written (``fallback="eager"``, or ``torch.compiler.disable`` around the call). An error raised in Dynamo's own code
  that is not one of Dynamo's exceptions (an ``AssertionError`` such as "Guard failed on the same frame it was
  created") is a compile error too, which ``fallback="eager"`` catches.
* The next run: when a compiled step raises (a bad batch, a failed assert), Dynamo marks the code it was compiling
  "skip" for the rest of the process, and every later run of the step would be eager. When a run fails, the code
  objects that Dynamo converted during that run, and only those, are reset, so the next run compiles again.

"""

import re
import traceback
from collections.abc import Mapping
from typing import Any, Callable, Optional

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerStatus
from lightning_compile_patch.compile_features import _CompileFeature, _CompileOptions, _flag
from lightning_compile_patch.compile_features import _private_names as private_names
from lightning_compile_patch.compile_features._run import _CompileRun

#: The interpreter's own errors of a call's arguments, which surface in Dynamo's frame that makes the call.
_ARGUMENT_BINDING = re.compile(
    r"\(\) (missing \d+ required|takes (from )?\d+ |got an unexpected keyword|got multiple values)"
)


def is_compile_error(error: BaseException) -> bool:
    """Whether ``error`` is a failure of torch to compile: one of Dynamo's errors, or raised in Dynamo's own code."""
    if isinstance(error, private_names.COMPILE_ERRORS):
        return True
    if not isinstance(error, Exception):
        return False  # KeyboardInterrupt, SystemExit: the user's, wherever they arrive
    if isinstance(error, TypeError) and _ARGUMENT_BINDING.search(str(error)):
        return False  # a step called with arguments it does not take: the user's error, raised as eager raises it
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and frames[-1].filename.startswith(private_names.DYNAMO_DIR)


def user_error(error: BaseException) -> Optional[BaseException]:
    """The error of a call the step makes that Dynamo turned into its own (a ``TypeError`` of a torch op), if any.

    Dynamo raises ``TorchRuntimeError`` (an op on fake tensors raised) or ``InternalTorchDynamoError`` (a builtin it
    evaluated raised) while handling that error: it is the first error in the chain whose type is not torch's.

    """
    if not isinstance(error, private_names.WRAPPING_ERRORS):
        return None
    cause = error.__cause__ or error.__context__
    while cause is not None:
        if type(cause).__module__.partition(".")[0] != "torch" and isinstance(cause, Exception):
            return cause
        cause = cause.__cause__ or cause.__context__
    return None


class _CompileErrors(_CompileFeature):
    """Names the run in a compile error, leaves every module uncompiled, and lets the next run compile again."""

    keys = {"compile_errors": "True: a compile error names the run and what to do, and the next run compiles afresh"}
    order = 90  # outside `fallback`: it names what `fallback` did not catch

    def __init__(self, options: _CompileOptions) -> None:
        _flag(options, "compile_errors")
        self._codes_before: Optional[int] = None

    def on_run_start(self, run: _CompileRun, model: "pl.LightningModule") -> None:
        self._codes_before = len(private_names.converted_codes())
        if private_names.NON_LAZY_BACKWARD and model.automatic_optimization:
            run.replace(private_names.functorch_config, "force_non_lazy_backward_lowering", True, scope="run")

    def setup(self, run: _CompileRun) -> Mapping[str, Any]:
        if not private_names.NON_LAZY_BACKWARD:
            _name_backward_errors(run)
        return {}

    def wrap(self, run: _CompileRun, compiled: Callable, original: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return compiled(*args, **kwargs)
            except Exception as error:
                if is_compile_error(error):
                    run.uncompile()
                    raise named_error(run, error) from error
                if hasattr(error, "add_note"):  # Python 3.11+
                    error.add_note(f"(raised in the {describe_run(run)})")
                raise

        return call

    def teardown(self, run: _CompileRun) -> None:
        codes_before, self._codes_before = self._codes_before, None
        if codes_before is not None and run.trainer.state.status == TrainerStatus.INTERRUPTED:
            run.reset(code for ref in private_names.converted_codes()[codes_before:] if (code := ref()) is not None)


def _name_backward_errors(run: _CompileRun) -> None:
    """On torch before 2.13: a backward that fails to compile raises an error naming the run."""
    strategy = run.trainer.strategy
    backward = strategy.backward

    def named(*args: Any, **kwargs: Any) -> Any:
        try:
            return backward(*args, **kwargs)
        except private_names.COMPILE_ERRORS as error:
            run.uncompile()
            raise RuntimeError(
                f"{failure_message(run, error, fallback=False)} (It failed in the backward: `fallback` applies"
                " to the backward from torch 2.13 on.)"
            ) from error

    run.replace(strategy, "backward", named, scope="run")


def describe_run(run: _CompileRun) -> str:
    """The stage, the ``use_compile`` value and the strategy of the run, for messages."""
    trainer = run.trainer
    stage = trainer.state.fn.value if trainer.state.fn else "unknown"
    value = _short(run.use_compile)
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


def named_error(run: _CompileRun, error: BaseException) -> Exception:
    """The error that stops the run: a ``RuntimeError`` naming it, and of the type of the user's error it wraps, if any.

    A ``TypeError`` of the step's own code stays a ``TypeError`` to the user's handlers (as a subclass of both), with
    the message of what failed and how to run the step as written.

    """
    cause = user_error(error)
    if cause is None or type(cause) is RuntimeError:
        return RuntimeError(failure_message(run, error, fallback=False))
    kind = type(cause)
    said = str(cause).strip().split("\n\n")[0].replace("\n", " ")  # without what Dynamo appended
    message = (
        f"`use_compile` could not compile the {describe_run(run)}: a call in the step raised `{kind.__name__}:"
        f" {said}` while Dynamo traced it, and Dynamo turned it into its own `{type(error).__name__}`, which an"
        f" `except {kind.__name__}` in the step does not catch (it is raised here as a `{kind.__name__}`). Every module"
        " is left uncompiled. To run the step as written, pass `'fallback': 'eager'` in `use_compile` (it continues"
        " uncompiled, with a warning), or wrap the call that raises in `torch.compiler.disable`."
    )
    bases = (kind,) if issubclass(kind, RuntimeError) else (RuntimeError, kind)
    try:
        named: type[Exception] = type(f"UseCompile{kind.__name__}", bases, {"__module__": __name__})
        instance = named.__new__(named, message)
        instance.args = (message,)
    except Exception:  # a layout that does not combine with RuntimeError's, or a class that refuses a message
        return RuntimeError(message)
    return instance


def failure_message(run: _CompileRun, error: BaseException, fallback: bool) -> str:
    """What failed, where, and (unless falling back) what to do about it."""
    first_paragraph = str(error).strip().split("\n\n")[0].replace("\n", " ")
    reason = f"{type(error).__name__}: {first_paragraph.rstrip('. ')}"
    message = f"`use_compile` could not compile the {describe_run(run)}: {reason}."
    if fallback:
        return message
    return (
        f"{message} Every module is left uncompiled. Pass `'fallback': 'eager'` in `use_compile` to continue"
        " uncompiled with a warning instead, or remove `use_compile` to train uncompiled."
    )


FEATURE = _CompileErrors
