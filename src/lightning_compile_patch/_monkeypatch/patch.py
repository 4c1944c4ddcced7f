"""The monkeypatch, and nothing else: ``Trainer.__init__`` takes ``use_compile``, ``Trainer._run`` compiles after setup.

For each installed flavour (``lightning.pytorch``, ``pytorch_lightning``) it replaces these ``Trainer`` methods, at
the points where the upstream patch changes them. A flavour that is not imported yet is patched when it is, by an
import hook: importing a flavour has side effects of its own (the last one imported owns the logger of the
``rank_zero_*`` helpers they share), so the patch imports none.

* ``__init__`` gains the ``use_compile`` keyword, in its signature and docstring too, so LightningCLI and the
  ``PL_TRAINER_USE_COMPILE`` environment variable see it. The value is validated before anything else happens.
* ``fit``, ``validate``, ``test`` and ``predict`` hand a ``torch.compile``-d model to the connector first, which takes
  the LightningModule out of it, so that Lightning does not compile it before the strategy wraps it.
* ``_run`` asks the connector what the run compiles, and has it compile right after ``strategy.setup``, before any hook
  that runs steps (the tuner's ``on_fit_start`` trials), where the upstream ``_run`` calls it; ``_teardown`` (called
  after the ``on_exception`` callbacks, on every path) uncompiles first.
* Lightning's compile helpers that the connector reuses are replaced by their fixed versions (``lightning_fixes``),
  which the upstream series puts in Lightning's own files. Fabric's capture of ``torch.compile``'s arguments is one:
  ``torch.compile`` is wrapped again with the fixed capture, which keeps the backend itself rather than a copy.
* The connector's ``defaults`` turn the package's features on for every ``use_compile`` (``feature_defaults``).

"""

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import inspect
import os
import sys
import types
from collections.abc import Sequence
from typing import Any, Callable, Optional

from packaging.version import Version

from lightning_compile_patch._monkeypatch import trainer_api
from lightning_compile_patch._monkeypatch.feature_defaults import FEATURE_DEFAULTS, INPUT_DEFAULTS
from lightning_compile_patch._monkeypatch.flavours import FLAVOUR_RENAMES, connector_module, flavour_module

#: The Lightning releases this patch was tested against; anything else is refused at import.
SUPPORTED_LIGHTNING = (Version("2.6.0"), Version("2.7.0"))
#: Set to ``1`` to patch an untested Lightning release anyway (with a warning), if it has every hook the patch needs.
ALLOW_UNTESTED_ENV = "LIGHTNING_COMPILE_PATCH_ALLOW_UNTESTED"
_MARK = "__lightning_compile_patch__"
_FIXES_KEY = "lightning_fixes"
#: The ``Trainer`` methods of a run that the connector hooks into.
_RUN_HOOKS = ("_run", "_teardown")


#: The ``Trainer`` methods that take the model from the user.
_ENTRY_POINTS = ("fit", "validate", "test", "predict")


#: The distribution that installs each flavour, for its version before it is imported.
_DISTRIBUTIONS = {"lightning.pytorch": "lightning", "pytorch_lightning": "pytorch-lightning"}


def installed_flavours() -> list[str]:
    """The Lightning flavours that can be imported here."""
    return [name for name in FLAVOUR_RENAMES if importlib.util.find_spec(name.partition(".")[0]) is not None]


def apply() -> list[str]:
    """Patches every imported flavour that is not patched yet, and each other one when it is imported.

    Returns the flavours patched now.

    Raises:
        ImportError: If no Lightning is installed, or an installed one is a release this patch does not support.

    """
    flavours = installed_flavours()
    if not flavours:
        raise ImportError(
            "`lightning_compile_patch` patches Lightning's Trainer, but neither `lightning` nor `pytorch_lightning`"
            " is installed. Install one of them: `pip install 'lightning>=2.6,<2.7'`."
        )
    pending = [flavour for flavour in flavours if flavour not in sys.modules]
    for flavour in pending:
        _check_version(flavour, Version(importlib.metadata.version(_DISTRIBUTIONS[flavour])))
    _PatchOnImport.install(pending)
    return [flavour for flavour in flavours if flavour in sys.modules and _patch_flavour(flavour)]


def remove() -> None:
    """Undoes :func:`apply`: the Trainer no longer takes ``use_compile``, and Lightning behaves as it did before.

    Trainers created while patched keep working; they compile nothing once the patch is removed.

    """
    _PatchOnImport.install([])
    for flavour in installed_flavours():
        if flavour not in sys.modules:
            continue
        trainer_cls = _trainer_cls(flavour)
        originals = dict(_originals(trainer_cls))
        for target, name, original in reversed(originals.pop(_FIXES_KEY, [])):
            if original is None:  # a helper the fixes added, which Lightning does not have
                delattr(target, name)
            else:
                setattr(target, name, original)
        for name, original in originals.items():
            setattr(trainer_cls, name, original)


def is_applied(flavour: Optional[str] = None) -> bool:
    """Whether ``flavour`` (by default, any installed flavour) is patched, or will be when it is imported."""
    flavours = [flavour] if flavour else installed_flavours()
    return any(
        _originals(_trainer_cls(name)) if name in sys.modules else name in _PatchOnImport.pending for name in flavours
    )


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches a flavour right after its package is imported, wherever the import comes from."""

    pending: tuple[str, ...] = ()

    @classmethod
    def install(cls, flavours: Sequence[str]) -> None:
        """Watches for ``flavours`` (an empty list: for none, and leaves ``sys.meta_path``)."""
        sys.meta_path[:] = [finder for finder in sys.meta_path if type(finder).__name__ != cls.__name__]
        cls.pending = tuple(flavours)
        if flavours:
            sys.meta_path.insert(0, cls())

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Optional[types.ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname not in type(self).pending:
            return None
        spec = next(
            (
                found
                for finder in sys.meta_path
                if finder is not self and hasattr(finder, "find_spec")
                for found in [finder.find_spec(fullname, path, target)]
                if found is not None
            ),
            None,
        )
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_patch(module: types.ModuleType) -> None:
            exec_module(module)
            type(self).pending = tuple(name for name in type(self).pending if name != fullname)
            _patch_flavour(fullname)

        loader.exec_module = exec_then_patch  # type: ignore[method-assign]
        return spec


def _trainer_cls(flavour: str) -> type:
    return importlib.import_module(f"{flavour}.trainer.trainer").Trainer


def _originals(trainer_cls: type) -> dict[str, Callable[..., Any]]:
    """The methods the patch replaced on ``trainer_cls``, kept on the patched ``__init__``; empty if unpatched."""
    return getattr(trainer_cls.__init__, _MARK, {})


def _patch_flavour(flavour: str) -> bool:
    """Patches the Trainer of one flavour. Returns ``False`` if that Trainer takes ``use_compile`` natively."""
    package = importlib.import_module(flavour)
    trainer_cls = _trainer_cls(flavour)
    if _originals(trainer_cls):
        return False
    if trainer_api.has_use_compile(trainer_cls.__init__):
        # a Lightning with the upstream patch applied: it does natively what this package would do
        return False
    _check_version(flavour, Version(package.__version__))
    _check_hooks(flavour, trainer_cls)
    env_defaults = importlib.import_module(f"{flavour}.utilities.argparse")._defaults_from_env_vars
    fixes = _install_fixes(flavour)
    connector_cls = connector_module(flavour)._CompileConnector
    connector_cls.defaults = FEATURE_DEFAULTS  # the package's features, on for every `use_compile`
    connector_cls.input_defaults = INPUT_DEFAULTS  # and those a compiled model passed in gets

    originals = {name: getattr(trainer_cls, name) for name in ("__init__", *_RUN_HOOKS, *_ENTRY_POINTS)}
    patched_init = _patched_init(originals["__init__"].__wrapped__, connector_cls)
    setattr(patched_init, _MARK, {**originals, _FIXES_KEY: fixes})  # `functools.wraps` carries it to the wrapper
    trainer_cls.__init__ = env_defaults(patched_init)
    trainer_cls._run = _patched_run(originals["_run"])
    trainer_cls._teardown = _patched_teardown(originals["_teardown"])
    for name in _ENTRY_POINTS:
        setattr(trainer_cls, name, _patched_entry_point(originals[name]))
    return True


def _install_fixes(flavour: str) -> list[tuple[Any, str, Any]]:
    """Puts the fixed Lightning helpers (``lightning_fixes``) in place of Lightning's; returns what they replaced."""
    fixes = flavour_module(flavour, "lightning_fixes")
    replaced = []
    for name, (module_name, class_name) in fixes.FIXES.items():
        module = importlib.import_module(module_name)
        owner = getattr(module, class_name) if class_name else module
        fixed = getattr(getattr(fixes, class_name), name) if class_name else getattr(fixes, name)
        targets = [owner]
        if not class_name and name in vars(module):  # modules that imported the helper by name see the fix too
            trainer_module = importlib.import_module(f"{flavour}.trainer.trainer")
            targets += [trainer_module] if getattr(trainer_module, name, None) is vars(module)[name] else []
        for target in targets:
            replaced.append((target, name, target.__dict__.get(name)))
            setattr(target, name, fixed)
    # Fabric wrapped `torch.compile` in its capture when it was imported: the fixed capture wraps what that one wrapped
    torch = importlib.import_module("torch")
    wrappers = importlib.import_module(fixes.FIXES["_capture_compile_kwargs"][0])
    if getattr(torch.compile, "__globals__", None) is vars(wrappers):
        replaced.append((torch, "compile", torch.compile))
        torch.compile = fixes._capture_compile_kwargs(torch.compile.__wrapped__)
    return replaced


def _check_version(flavour: str, version: Version) -> None:
    """Refuses a Lightning release outside :data:`SUPPORTED_LIGHTNING`, unless the user allows untested ones."""
    low, high = SUPPORTED_LIGHTNING
    if low <= version < high:
        return
    message = (
        f"`lightning_compile_patch` supports {flavour} >={low},<{high}, but {flavour} {version} is installed."
        f" Install a supported release (`pip install '{flavour.partition('.')[0]}>={low},<{high}'`), or set"
        f" {ALLOW_UNTESTED_ENV}=1 to patch this release anyway, untested."
    )
    if os.environ.get(ALLOW_UNTESTED_ENV) != "1":
        raise ImportError(message)
    import warnings

    warnings.warn(message, stacklevel=3)


def _check_hooks(flavour: str, trainer_cls: type) -> None:
    """Raises if a method the patch relies on is missing from this Lightning's ``Trainer``."""
    needed = {
        "Trainer.__init__.__wrapped__": hasattr(trainer_cls.__init__, "__wrapped__"),
        **{f"Trainer.{name}": hasattr(trainer_cls, name) for name in (*_RUN_HOOKS, *_ENTRY_POINTS)},
    }
    missing = [name for name, found in needed.items() if not found]
    if missing:
        raise ImportError(
            f"`lightning_compile_patch` cannot patch this {flavour}: it lacks {', '.join(missing)}."
            f" Install a supported release: `pip install '{flavour.partition('.')[0]}>=2.6,<2.7'`."
        )


def _patched_init(init: Callable[..., None], connector_cls: type) -> Callable[..., None]:
    """``Trainer.__init__`` with the ``use_compile`` keyword, checked before the Trainer is built."""

    def __init__(
        self: Any, *args: Any, use_compile: trainer_api.ANNOTATION = trainer_api.DEFAULT, **kwargs: Any
    ) -> None:
        connector = connector_cls(self, use_compile)
        init(self, *args, **kwargs)
        self._compile_connector = connector
        connector.verify_strategy()

    __init__.__signature__ = trainer_api.signature_with_use_compile(inspect.signature(init))  # type: ignore[attr-defined]
    __init__.__doc__ = trainer_api.docstring_with_use_compile(init.__doc__ or "")
    __init__.__qualname__ = init.__qualname__
    __init__.__module__ = init.__module__
    return __init__


def _patched_run(run: Callable[..., Any]) -> Callable[..., Any]:
    """``Trainer._run`` that lets the connector decide what the run compiles, first, and compile after the setup."""

    @functools.wraps(run)
    def _run(self: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
        connector = getattr(self, "_compile_connector", None)  # a Trainer created before the patch has none
        if connector is not None:
            connector.on_run_start(model)
            _compile_after_setup(self.strategy, connector)
        return run(self, model, *args, **kwargs)

    return _run


def _compile_after_setup(strategy: Any, connector: Any) -> None:
    """For this run, ``strategy.setup`` compiles right after it: the point where the upstream ``_run`` compiles."""
    run = connector.run  # what the run compiles (`None`: nothing), and the owner of what it changes
    if run is None:
        return
    setup = strategy.setup

    def setup_then_compile(trainer: Any) -> None:
        setup(trainer)
        connector.compile()

    run.replace(strategy, "setup", setup_then_compile, scope="run")


def _patched_teardown(teardown: Callable[..., Any]) -> Callable[..., Any]:
    """``Trainer._teardown`` that uncompiles first. Lightning calls it after ``on_exception``, on every path."""

    @functools.wraps(teardown)
    def _teardown(self: Any) -> None:
        connector = getattr(self, "_compile_connector", None)
        try:
            if connector is not None:
                connector.teardown()
        finally:
            teardown(self)

    return _teardown


def _patched_entry_point(entry_point: Callable[..., Any]) -> Callable[..., Any]:
    """``fit``/``validate``/``test``/``predict`` that let the connector unwrap a compiled model first."""

    @functools.wraps(entry_point)
    def wrapper(self: Any, model: Any = None, *args: Any, **kwargs: Any) -> Any:
        connector = getattr(self, "_compile_connector", None)
        if connector is not None and model is not None:  # as Lightning's: a stage with no model reuses the Trainer's
            model = connector.unwrap(model)
        return entry_point(self, model, *args, **kwargs)

    return wrapper
