"""Loads the Lightning-side modules of this package (``upstream_modules``) for each installed Lightning flavour.

The ``pytorch_lightning`` package is the same code as ``lightning.pytorch`` under other import names; Lightning's own
build derives it by rewriting imports, and :func:`flavour_module` derives our ``pytorch_lightning`` flavour the same
way.

"""

import importlib
import sys
import types

from lightning_compile_patch.upstream_modules import PACKAGE, UPSTREAM_MODULES, module_path, rename_imports

#: The import names of each flavour, as Lightning's build renames them for the standalone ``pytorch_lightning``.
FLAVOUR_RENAMES: dict[str, dict[str, str]] = {
    "lightning.pytorch": {},
    "pytorch_lightning": {"lightning.pytorch": "pytorch_lightning", "lightning.fabric": "lightning_fabric"},
}


def flavour_module(flavour: str, name: str) -> types.ModuleType:
    """The Lightning-side module ``name`` for ``flavour``, loading the flavour's modules up to it on first use."""
    if flavour == "lightning.pytorch":
        return importlib.import_module(f"{PACKAGE}.{name}")
    prefix = f"{PACKAGE}._flavours.{flavour}"
    if f"{prefix}.{name}" not in sys.modules:
        # the fixes first, on their own: they are installed before the core imports them; then everything else
        _load_flavour(flavour, prefix, until=name if name == "lightning_fixes" else list(UPSTREAM_MODULES)[-1])
    return sys.modules[f"{prefix}.{name}"]


def connector_module(flavour: str) -> types.ModuleType:
    """The ``compile_connector`` module for ``flavour``."""
    return flavour_module(flavour, "compile_connector")


def _load_flavour(flavour: str, prefix: str, until: str) -> None:
    """Executes the Lightning-side modules again, up to ``until``, with the imports of ``flavour``, under ``prefix``."""
    renames = {**FLAVOUR_RENAMES[flavour], **{f"{PACKAGE}.{name}": f"{prefix}.{name}" for name in UPSTREAM_MODULES}}
    for package in (f"{PACKAGE}._flavours", prefix):
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
