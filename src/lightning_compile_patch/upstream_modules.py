"""What ships upstream, and where: the package's Lightning-side modules and the module each becomes in Lightning.

The package ships one change two ways. These modules are Lightning code, written against ``lightning.pytorch`` and
named as in Lightning's tree: the patch series under ``patches/`` adds them to Lightning with nothing changed but their
import paths (``tools/patchset.py``), and the monkeypatch (``_monkeypatch/``) loads them into a stock Lightning.
``lightning_fixes`` holds fixed versions of functions that the series replaces in Lightning's own files.

This module imports nothing of the package, of Lightning or of torch: the tools read it on their own.

"""

import re
from pathlib import Path

PACKAGE = "lightning_compile_patch"
PACKAGE_DIR = Path(__file__).parent
#: The core's module, and the package of the feature modules, as Lightning names them.
CORE = {"compile_connector": "lightning.pytorch.trainer.connectors.compile_connector"}
FEATURES_PACKAGE = "lightning.pytorch.trainer.connectors.compile_features"
#: The feature modules, by name (``compile_features/<name>.py``).
FEATURES = tuple(
    sorted(path.stem for path in (PACKAGE_DIR / "compile_features").glob("*.py") if not path.stem.startswith("_"))
)
#: Every Lightning-side module, in import order, and the module it becomes in Lightning's tree.
UPSTREAM_MODULES: dict[str, str] = {
    "lightning_fixes": "lightning.pytorch.utilities.compile",
    "compile_features": FEATURES_PACKAGE,
    #: the seam's modules, which the core and every feature import: the private names, and the run's context
    "compile_features._private_names": f"{FEATURES_PACKAGE}._private_names",
    "compile_features._run": f"{FEATURES_PACKAGE}._run",
    **CORE,
    **{f"compile_features.{name}": f"{FEATURES_PACKAGE}.{name}" for name in FEATURES},
}


def module_path(name: str) -> Path:
    """The file of a Lightning-side module (``compile_features.regions`` -> ``compile_features/regions.py``)."""
    path = PACKAGE_DIR.joinpath(*name.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def rename_imports(source: str, renames: dict[str, str]) -> str:
    """Replaces each dotted name in ``renames`` where it stands as a whole name or a prefix of one."""
    for old, new in sorted(renames.items(), key=lambda item: -len(item[0])):
        source = re.sub(rf"(?<![\w.]){re.escape(old)}(?![\w])", new, source)
    return source
