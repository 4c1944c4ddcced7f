"""Loads the Lightning-side modules of this package for each installed Lightning flavour.

The modules in :data:`UPSTREAM_MODULES` are written against ``lightning.pytorch``, as Lightning code: the patch series
under ``patches/`` adds them to Lightning's tree with nothing changed but their import paths (``lightning_fixes`` holds
fixed versions of functions that the series replaces in Lightning's own files). The ``pytorch_lightning`` package is
the same code as ``lightning.pytorch`` under other import names; Lightning's own build derives it by rewriting imports,
and :func:`flavour_module` derives our ``pytorch_lightning`` flavour the same way.

"""

import importlib
import re
import sys
import types
from pathlib import Path

_PACKAGE = __name__.rpartition(".")[0]
_PACKAGE_DIR = Path(__file__).parent
FEATURES_DIR = _PACKAGE_DIR / "features"

#: The core's module and where it lives in Lightning's tree; each feature module goes to ``FEATURES_PACKAGE``.
CORE = {"connector": "lightning.pytorch.trainer.connectors.compile_connector"}
FEATURES_PACKAGE = "lightning.pytorch.trainer.connectors.compile_features"
#: The feature modules, by name (``features/<name>.py``).
FEATURES = tuple(sorted(path.stem for path in FEATURES_DIR.glob("*.py") if path.stem != "__init__"))
#: Every Lightning-side module, in import order, and the module it becomes in Lightning's tree.
UPSTREAM_MODULES: dict[str, str] = {
    "lightning_fixes": "lightning.pytorch.utilities.compile",
    "features": FEATURES_PACKAGE,
    **CORE,
    **{f"features.{name}": f"{FEATURES_PACKAGE}.{name}" for name in FEATURES},
}

#: The import names of each flavour, as Lightning's build renames them for the standalone ``pytorch_lightning``.
FLAVOUR_RENAMES: dict[str, dict[str, str]] = {
    "lightning.pytorch": {},
    "pytorch_lightning": {"lightning.pytorch": "pytorch_lightning", "lightning.fabric": "lightning_fabric"},
}


def rename_imports(source: str, renames: dict[str, str]) -> str:
    """Replaces each dotted name in ``renames`` where it stands as a whole name or a prefix of one."""
    for old, new in sorted(renames.items(), key=lambda item: -len(item[0])):
        source = re.sub(rf"(?<![\w.]){re.escape(old)}(?![\w])", new, source)
    return source


def module_path(name: str) -> Path:
    """The file of a Lightning-side module (``features.regions`` -> ``features/regions.py``)."""
    path = _PACKAGE_DIR.joinpath(*name.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def flavour_module(flavour: str, name: str) -> types.ModuleType:
    """The Lightning-side module ``name`` for ``flavour``, loading the flavour's modules up to it on first use."""
    if flavour == "lightning.pytorch":
        return importlib.import_module(f"{_PACKAGE}.{name}")
    prefix = f"{_PACKAGE}._flavours.{flavour}"
    if f"{prefix}.{name}" not in sys.modules:
        # the fixes first, on their own: they are installed before the core imports them; then everything else
        _load_flavour(flavour, prefix, until=name if name == "lightning_fixes" else list(UPSTREAM_MODULES)[-1])
    return sys.modules[f"{prefix}.{name}"]


def connector_module(flavour: str) -> types.ModuleType:
    """The ``connector`` module for ``flavour``."""
    return flavour_module(flavour, "connector")


def _load_flavour(flavour: str, prefix: str, until: str) -> None:
    """Executes the Lightning-side modules again, up to ``until``, with the imports of ``flavour``, under ``prefix``."""
    renames = {**FLAVOUR_RENAMES[flavour], **{f"{_PACKAGE}.{name}": f"{prefix}.{name}" for name in UPSTREAM_MODULES}}
    for package in (f"{_PACKAGE}._flavours", prefix):
        if package not in sys.modules:
            module = types.ModuleType(package)
            module.__path__ = []
            sys.modules[package] = module
    for name in list(UPSTREAM_MODULES)[: list(UPSTREAM_MODULES).index(until) + 1]:
        if f"{prefix}.{name}" in sys.modules:
            continue
        path = module_path(name)
        module = types.ModuleType(f"{prefix}.{name}")
        module.__file__ = str(path)
        module.__package__ = f"{prefix}.{name}" if path.name == "__init__.py" else f"{prefix}.{name}".rpartition(".")[0]
        if path.name == "__init__.py":
            module.__path__ = [str(path.parent)]  # the core finds the feature modules there
        sys.modules[module.__name__] = module
        try:
            exec(compile(rename_imports(path.read_text(), renames), str(path), "exec"), module.__dict__)
        except BaseException:
            del sys.modules[module.__name__]
            raise
