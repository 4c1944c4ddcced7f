"""Keeps ``self.log`` out of compiled graphs without breaking them.

Logging is bookkeeping: it walks the result collection, inspects hook signatures and may sync across processes.
Dynamo cannot trace it on recent PyTorch, and stopping the trace at each call splits the step into several graphs.
Instead, while a step is being traced, ``self.log`` and ``self.log_dict`` only record their arguments; the compiled
step replays the records eagerly, in order, as soon as it returns. Outside a compiled step both log immediately.

The replacement is traced only as part of the step that calls it, never as a frame of its own. Dynamo compiles it as
its own frame when the caller runs eagerly (a helper that Dynamo skipped, such as a loop over classes logging each
one's ``.item()``): it would then guard on the name logged, and compile again for each name, until the recompile limit.
For the run, Dynamo skips its frame (it still traces it inline), and a call from eager code logs immediately, with
Dynamo off for Lightning's own ``log``.

"""

import functools
from collections.abc import Mapping
from typing import Any, Callable, Optional

import torch
from torch import nn

from lightning_compile_patch.compile_features import _CompileFeature, _CompileOptions, _flag
from lightning_compile_patch.compile_features._run import _CompileRun

_LOG_METHODS = ("log", "log_dict")


class _LogBoundary:
    """Defers the logging calls of one module while its steps are being traced, and replays them afterwards."""

    def __init__(self, run: _CompileRun, module: nn.Module) -> None:
        self._pending: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self._eager = {name: getattr(module, name) for name in _LOG_METHODS}
        for name in _LOG_METHODS:
            run.replace(module, name, self._deferring(name))
        run.defer(self._pending.clear)
        # one code object for every replacement: skipped as a frame of its own, still traced inline
        run.run_uncompiled(self._deferring("log").__code__)

    def _deferring(self, name: str) -> Callable[..., None]:
        """The replacement for one logging method."""
        pending = self._pending

        def deferring(*args: Any, **kwargs: Any) -> None:
            if torch.compiler.is_compiling():
                # a plain list append is a side effect Dynamo replays after the graph; no graph break
                pending.append((name, args, kwargs))
                return
            self._log_now(name, args, kwargs)

        return deferring

    @torch.compiler.disable
    def _log_now(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Logs from eager code, after what was deferred; never compiled (a frame per name would recompile each)."""
        self.flush()
        self._eager[name](*args, **kwargs)

    def flush(self) -> None:
        """Replays the deferred calls, in the order they were made."""
        if not self._pending:
            return
        calls = list(self._pending)
        self._pending.clear()
        for name, args, kwargs in calls:
            self._eager[name](*args, **kwargs)

    def around(self, compiled: Callable[..., Any], *, original: Callable[..., Any]) -> Callable[..., Any]:
        """Wraps a compiled callable so that the calls deferred while it ran are replayed when it returns.

        ``original`` is what the compiled callable replaces: it stays reachable as ``__wrapped__``, so signature checks
        and ``is_overridden`` see the user's method, as they would without compilation.

        """

        @functools.wraps(original, updated=())
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                out = compiled(*args, **kwargs)
            except BaseException:
                self._pending.clear()
                raise
            if self._pending:
                self.flush()
            return out

        return call


class _DeferLogging(_CompileFeature):
    """Defers ``self.log`` while a step is traced, and replays it after the compiled step (no graph break)."""

    keys = {"defer_logging": "True (default): `self.log` in a compiled step is replayed after it, outside the graph"}
    order = 10

    @classmethod
    def wanted(cls, keys: Mapping[str, Any]) -> bool:
        # on unless turned off: Lightning 2.6's `self.log` fails under Dynamo (master compiler-disables it, #21837)
        return keys.get("defer_logging", True) is not False

    def __init__(self, options: _CompileOptions) -> None:
        if "defer_logging" in options.keys:
            _flag(options, "defer_logging")
        self._boundary: Optional[_LogBoundary] = None

    def setup(self, run: _CompileRun) -> Mapping[str, Any]:
        self._boundary = _LogBoundary(run, run.trainer.lightning_module)
        return {}

    def wrap(self, run: _CompileRun, compiled: Callable, original: Callable) -> Callable:
        assert self._boundary is not None
        return self._boundary.around(compiled, original=original)

    def teardown(self, run: _CompileRun) -> None:
        self._boundary = None


FEATURE = _DeferLogging
