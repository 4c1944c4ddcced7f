"""The features of ``Trainer(use_compile=...)``, and the seam they plug into.

Each feature is a module of this package, named after the key of the ``use_compile`` dict that turns it on, that names
its ``_CompileFeature`` as ``FEATURE``. The connector builds the features a Trainer's ``use_compile`` asks for, and for
each compiled run calls their hooks in the order of :data:`FEATURES` (``teardown`` in reverse). A hook gets the run
(``_run._CompileRun``): the Trainer, the run's compile arguments, and the one owner of everything the run changes
outside itself. It never gets the connector, nor another feature. A Lightning that has some of these modules only (a
fork that took some of the patches that add them) runs those, in this order.

"""

import functools
import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from lightning_compile_patch.compile_features._run import _CompileRun

#: The feature modules, in the order their hooks run.
FEATURES: tuple[str, ...] = (
    "cache",
    "compile_budget",
    "compile_errors",
    "compiled_autograd",  # before `optimize_ddp`, whose "auto" keeps the python reducer that this one sets
    "no_grad_evaluation",
    "fallback",
    "defer_logging",
    "dynamic_loop_counters",
    "eager_metrics",
    "optimize_ddp",
    "eager_optimizer_steps",
    "dynamic_lr",
    "regions",
    "in_parts",  # after `regions`: a module a region compiled is left as it is
    "summary",
    "list_outputs",
    "check_tensor_parallel",  # after `regions`: what a region compiles with its hooks passes the check
    "stage_guards",
)
#: The LightningModule's step methods, which the strategy runs.
STEPS = ("training_step", "validation_step", "test_step", "predict_step")


class _Frozen(dict):
    """A dict that refuses changes, and that pickles (``ddp_spawn`` pickles the Trainer) and copies as one."""

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("the compile arguments of a run are a value: derive new ones instead of changing these")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _refuse  # type: ignore[assignment]

    def __reduce__(self) -> tuple:
        return type(self), (dict(self),)


@dataclass(frozen=True)
class _CompileOptions:
    """``use_compile`` parsed once: the ``torch.compile`` arguments, and the values of the features' own keys."""

    torch_kwargs: Mapping[str, Any] = field(default_factory=_Frozen)
    keys: Mapping[str, Any] = field(default_factory=_Frozen)


class _CompileFeature:
    """A feature beyond the core: built with the parsed options (raising on a bad value), it owns ``keys`` of them.

    A feature is built only for a Trainer whose ``use_compile`` sets one of its keys (or the connector's ``defaults``
    do), so a feature left unset changes nothing; a feature may say otherwise in its own :meth:`wanted` (logging
    deferral, on the 2.6.6 ladder, runs unless its key is ``False``). Hooks run in the order of :data:`FEATURES`,
    ``teardown`` in reverse, on every path. ``order`` only says how ``wrap`` nests, lowest innermost:

    ====  ================  =====================================================================
    1     summary           marks where the step's compiled code starts (a step is counted where
                            the strategy runs it), and times the first compiled step
    5     list_outputs      puts the module's lists behind their views for the compiled call only
    5     dynamic_lr        refreshes the optimizers' views that a traced ``self.optimizers()`` returns
    10    defer_logging     replays ``self.log`` right after the compiled call, inside the others
    45    compiled_autograd syncs DDP's buffers around the compiled call
    80    fallback          catches a compile error and runs the step eagerly instead
    90    compile_errors    names the run in a compile error that nothing inside caught
    ====  ================  =====================================================================

    A feature with nothing to do for a run's module returns ``compiled`` as it is: each wrapper is a call on every
    step.

    """

    #: The keys of the ``use_compile`` dict this feature owns, each with a one-line description for error messages.
    keys: ClassVar[dict[str, str]] = {}
    order: ClassVar[int] = 0
    #: Other keys of ``use_compile`` that the feature runs only with some values of: each with those values (``None``:
    #: the key left out) and why. The Trainer refuses any other combination when it is built.
    runs_with: ClassVar[dict[str, tuple[tuple[Any, ...], str]]] = {}

    @classmethod
    def wanted(cls, keys: Mapping[str, Any]) -> bool:
        """Whether a Trainer whose ``use_compile`` (with the connector's ``defaults``) has ``keys`` builds it."""
        return any(keys.get(key) is not None and keys[key] is not False for key in cls.keys)

    def __init__(self, options: _CompileOptions) -> None:
        """Reads and checks the feature's own keys of ``options``."""

    def verify(self, trainer: "pl.Trainer") -> None:
        """At the end of ``Trainer.__init__``: checks of the value against the Trainer's strategy."""

    def on_run_start(self, run: "_CompileRun", model: "pl.LightningModule") -> None:
        """Before the strategy's setup: checks that can fail before the data is prepared, and the run's settings."""

    def compile_kwargs(self, run: "_CompileRun", kwargs: Mapping[str, Any]) -> Mapping[str, Any]:
        """The run's ``torch.compile`` arguments, derived from ``kwargs``; returns a new value."""
        return kwargs

    def setup(self, run: "_CompileRun") -> Mapping[str, Any]:
        """After ``strategy.setup``: may compile parts of the model; returns arguments that apply to the step only."""
        return {}

    def wrap(self, run: "_CompileRun", compiled: Callable, original: Callable) -> Callable:
        """Wraps each compiled callable the strategy calls (a step, DDP's call); ``original``: what it replaces."""
        return compiled

    def teardown(self, run: "_CompileRun") -> None:
        """Ends what the feature tracks of the run; what it changed through the run is undone by it."""


def _flag(options: _CompileOptions, key: str) -> bool:
    """The value of a feature's key that turns it on or off; raises if it is not a bool."""
    value = options.keys.get(key, False)
    if not isinstance(value, bool):
        raise TypeError(f"`Trainer(use_compile={{{key!r}: {value!r}}})` must be `True` or `False`.")
    return value


def _build_features(classes: tuple[type[_CompileFeature], ...], options: _CompileOptions) -> list[_CompileFeature]:
    """The features that ``options`` turn on, in hook order; refuses a combination that one of them cannot run with."""
    keys = options.keys
    features = [feature(options) for feature in classes if feature.wanted(keys)]
    for feature in features:
        own = next(iter(feature.keys))
        for key, (values, why) in feature.runs_with.items():
            if keys.get(key) not in values:
                named = [repr(value) for value in values if value is not None]
                to = f", or set it to {' or '.join(named)}" if named else ""
                raise ValueError(
                    f"`Trainer(use_compile={{{own!r}: ..., {key!r}: {keys[key]!r}}})` cannot be combined: {why}."
                    f" Remove {key!r}{to}, or remove {own!r}."
                )
    return features


@functools.cache
def _feature_classes() -> tuple[type[_CompileFeature], ...]:
    """The ``FEATURE`` of each module that ``FEATURES`` lists and this Lightning has, in its order."""
    classes = []
    for name in FEATURES:
        module = f"{__name__}.{name}"
        try:
            classes.append(importlib.import_module(module).FEATURE)
        except ModuleNotFoundError as error:
            if error.name != module:
                raise
            # the patch that adds this feature is not in this Lightning
    return tuple(classes)
