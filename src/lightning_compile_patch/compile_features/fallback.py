"""``use_compile={"fallback": "eager"}``: when compilation fails, warn once and continue, compiled where it can be.

Without it, a compile error stops the run with an error that names it (``compile_errors.py``). With it, the frame
whose compile failed is run uncompiled from then on, and the call is run again at once (and so on, for a frame it calls
that fails in turn): the rest of the step (what it calls, compiled in parts by ``in_parts.py``, or a method compiled on
its own) stays compiled, and the warning says so. A frame fails as it is entered, before any of it runs; where it is
called from the step's own code, the part of the step before the call runs again, as it does for the eager rerun.
Where that fails too, or where the backend itself failed (it would fail on any frame), every module is uncompiled and
every later step of the run runs eagerly (the run summary counts them as eager, with the cause "fallback"), and the
warning says that. The next run compiles again.
A compile error is one of Dynamo's errors (an error of the step's own code that Dynamo wrapped among them, such as a
``TypeError`` of a torch op on fake tensors: the eager step then raises it, or handles it, as written), or any error
raised in Dynamo's own code (``compile_errors.is_compile_error``).

"""

import time
import types
from typing import Any, Callable, Optional

import lightning.pytorch as pl
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from lightning_compile_patch.compile_features import _CompileFeature, _CompileOptions
from lightning_compile_patch.compile_features import _private_names as private_names
from lightning_compile_patch.compile_features._run import _CompileRun
from lightning_compile_patch.compile_features.compile_errors import failure_message, is_compile_error

_CHOICES = (None, "eager")
#: How many frames one call runs uncompiled, one after another as each fails, before the run goes on wholly uncompiled
#: (pytorch-forecasting's DeepAR fails in seven nested ones, inside its validation step's sampling).
_MOST_FRAMES = 16


class _Fallback(_CompileFeature):
    """With ``fallback="eager"``, a compile error warns and the run continues uncompiled."""

    keys = {"fallback": "None (default: a compile error stops the run) or 'eager' (warn once, continue uncompiled)"}
    order = 80  # outside the other wrappers, whose compile errors it catches; inside `compile_errors`

    def __init__(self, options: _CompileOptions) -> None:
        self.fallback = options.keys.get("fallback")
        # compared by value, and as a string: "eager" may come from JSON, YAML, the CLI or an environment variable
        if self.fallback is not None and not (isinstance(self.fallback, str) and self.fallback in _CHOICES):
            raise ValueError(
                f"`Trainer(use_compile={{'fallback': {self.fallback!r}}})` is not supported. Leave 'fallback' out (or"
                " pass `None`) to stop the run on a compile error, or pass 'eager' to warn once and continue"
                " uncompiled."
            )

    def on_run_start(self, run: _CompileRun, model: "pl.LightningModule") -> None:
        self.skipped: set[types.CodeType] = set()  # the frames whose compile failed in this run

    def wrap(self, run: _CompileRun, compiled: Callable, original: Callable) -> Callable:
        if self.fallback != "eager":
            return compiled

        # DDP's own call (compiled under its python reducer) runs the step through Lightning's forward redirection,
        # which puts its `wrapped_forward` on the module for the call: the part that ran before an error may have taken
        # it off already, and the call run again must find it there
        module = run.trainer.lightning_module
        wrapper = run.trainer.strategy.model
        wrapper_call = wrapper is not None and original == private_names.module_call(wrapper)

        def call(*args: Any, **kwargs: Any) -> Any:
            if run.fell_back:
                return original(*args, **kwargs)
            redirected = module.__dict__.get("forward") if wrapper_call else None

            def redirect() -> None:
                if redirected is not None:  # the call again runs the step, not the module's own forward
                    module.forward = redirected  # type: ignore[method-assign]

            started_us = time.time_ns() // 1000
            try:
                return compiled(*args, **kwargs)
            except Exception as error:
                if not is_compile_error(error):  # the step's own error: the eager step would raise it too
                    raise
                failed = error
            first = failed
            skipped: list[types.CodeType] = []
            while not isinstance(failed, private_names.BACKEND_FAILED) and len(skipped) < _MOST_FRAMES:
                code = _failed_code(started_us)
                if code is None or code in self.skipped:
                    break
                # that frame runs uncompiled from now on, what it calls compiled; its compile failed as it was entered
                self.skipped.add(code)
                skipped.append(code)
                run.run_uncompiled(code, scope="run")
                redirect()
                started_us = time.time_ns() // 1000
                try:
                    out = compiled(*args, **kwargs)
                except Exception as error:
                    if not is_compile_error(error):
                        raise
                    failed = error
                    continue
                names = ", ".join(_frame_name(code) for code in skipped)
                rank_zero_warn(
                    f"{failure_message(run, first, fallback=True)} It continues with {names} uncompiled, and"
                    " the rest compiled (`fallback='eager'`)."
                )
                return out
            message = failure_message(run, failed, fallback=True)
            rank_zero_warn(f"{message} It continues uncompiled (`fallback='eager'`).")
            run.fall_back()
            redirect()
            return original(*args, **kwargs)

        return call


def _frame_name(code: types.CodeType) -> str:
    """``fn``, or ``the rest of `fn` after line 12`` for the code Dynamo resumes ``fn`` with after a graph break."""
    resumed = private_names.RESUME_FUNCTION.fullmatch(code.co_name)
    return f"the rest of `{resumed['function']}` after line {resumed['line']}" if resumed else f"`{code.co_name}`"


def _failed_code(since_us: float) -> Optional[types.CodeType]:
    """The code object of the newest frame whose compile failed since ``since_us``, from Dynamo's records."""
    return next(iter(private_names.failed_codes(since_us)), None)


FEATURE = _Fallback
