"""Loads the Lightning-side modules of this package for each installed Lightning flavour.

The modules listed in :data:`UPSTREAM_MODULES` are written against ``lightning.pytorch``, as Lightning code: the patch
set under ``patches/`` adds them to Lightning's tree with nothing changed but their import paths. The
``pytorch_lightning`` package is the same code as ``lightning.pytorch`` under other import names; Lightning's own build
derives it by rewriting imports, and :func:`connector_module` derives our ``pytorch_lightning`` flavour the same way.

"""

import importlib
import re
import sys
import types
from pathlib import Path

#: The Lightning-side modules, in import order, and the module each one becomes in Lightning's tree.
UPSTREAM_MODULES: dict[str, str] = {
    "config": "lightning.pytorch.utilities.compile_config",
    "log_boundary": "lightning.pytorch.utilities.compile_log_boundary",
    "regions": "lightning.pytorch.utilities.compile_regions",
    "cache": "lightning.pytorch.utilities.compile_cache",
    "report": "lightning.pytorch.utilities.compile_report",
    "connector": "lightning.pytorch.trainer.connectors.compile_connector",
}

#: The import names of each flavour, as Lightning's build renames them for the standalone ``pytorch_lightning``.
FLAVOUR_RENAMES: dict[str, dict[str, str]] = {
    "lightning.pytorch": {},
    "pytorch_lightning": {"lightning.pytorch": "pytorch_lightning", "lightning.fabric": "lightning_fabric"},
}

_PACKAGE = __name__.rpartition(".")[0]
_PACKAGE_DIR = Path(__file__).parent


def rename_imports(source: str, renames: dict[str, str]) -> str:
    """Replaces each dotted name in ``renames`` where it stands as a whole name or a prefix of one."""
    for old, new in renames.items():
        source = re.sub(rf"(?<![\w.]){re.escape(old)}(?!\w)", new, source)
    return source


def connector_module(flavour: str) -> types.ModuleType:
    """The ``connector`` module for ``flavour``, loading its Lightning-side modules on first use."""
    if flavour == "lightning.pytorch":
        return importlib.import_module(f"{_PACKAGE}.connector")
    prefix = f"{_PACKAGE}._flavours.{flavour}"
    if f"{prefix}.connector" not in sys.modules:
        _load_flavour(flavour, prefix)
    return sys.modules[f"{prefix}.connector"]


def _load_flavour(flavour: str, prefix: str) -> None:
    """Executes the Lightning-side modules again, with the imports of ``flavour``, as modules under ``prefix``."""
    renames = {
        **FLAVOUR_RENAMES[flavour],
        **{f"{_PACKAGE}.{name}": f"{prefix}.{name}" for name in UPSTREAM_MODULES},
    }
    for package in (f"{_PACKAGE}._flavours", prefix):
        if package not in sys.modules:
            module = types.ModuleType(package)
            module.__path__ = []
            sys.modules[package] = module
    for name in UPSTREAM_MODULES:
        path = _PACKAGE_DIR / f"{name}.py"
        module = types.ModuleType(f"{prefix}.{name}")
        module.__file__ = str(path)
        module.__package__ = prefix
        sys.modules[module.__name__] = module
        try:
            code = compile(rename_imports(path.read_text(), renames), str(path), "exec")
            exec(code, module.__dict__)
        except BaseException:
            del sys.modules[module.__name__]
            raise
