"""``use_compile={"fallback": "eager"}``: when compilation fails, warn once and continue the run uncompiled.

Without it, a compile error stops the run with an error that names it (``compile_errors.py``). With it, the compiled
call that raised a compile error is run again eagerly, every module is uncompiled, and every later step of the run
runs eagerly too (the run summary counts them as eager, with the cause "fallback"). The next run compiles again.
A compile error is one of Dynamo's errors (an error of the step's own code that Dynamo wrapped among them, such as a
``TypeError`` of a torch op on fake tensors: the eager step then raises it, or handles it, as written), or any error
raised in Dynamo's own code (``compile_errors.is_compile_error``).

"""

from typing import Any, Callable

from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from lightning_compile_patch.compile_connector import _CompileConnector, _CompileFeature, _CompileOptions
from lightning_compile_patch.compile_features.compile_errors import failure_message, is_compile_error

_CHOICES = (None, "eager")


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

    def wrap(self, connector: _CompileConnector, compiled: Callable, original: Callable, module_call: bool) -> Callable:
        if self.fallback != "eager":
            return compiled

        def run(*args: Any, **kwargs: Any) -> Any:
            if connector.fell_back:
                return original(*args, **kwargs)
            # a wrapper's call (DDP, FSDP) runs the step through the forward redirection, which has put its
            # `wrapped_forward` on the module: the part that ran before the error may have taken it off already
            module = connector.trainer.lightning_module if module_call else None
            redirected = module.__dict__.get("forward") if module is not None else None
            try:
                return compiled(*args, **kwargs)
            except Exception as error:
                if not is_compile_error(error):  # the step's own error: the eager step would raise it too
                    raise
                message = failure_message(connector, error, fallback=True)
                rank_zero_warn(f"{message} It continues uncompiled (`fallback='eager'`).")
                connector.fall_back()
                if module is not None and redirected is not None:
                    # the eager call runs the step, not the module's own forward
                    module.forward = redirected  # type: ignore[method-assign]
                return original(*args, **kwargs)

        return run


FEATURE = _Fallback
