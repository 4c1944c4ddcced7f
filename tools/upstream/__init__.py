"""What the upstream series adds beyond the package's own modules: edits of Lightning's files, tests, docs."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "src" / "lightning_compile_patch"


def package_module(name: str) -> ModuleType:
    """Loads one of the package's dependency-free modules (``upstream_modules``, ``_monkeypatch.trainer_api``) alone.

    Importing ``lightning_compile_patch`` itself would patch Lightning, which the tools have no reason to do.
    """
    qualified = f"_lcp_standalone_{name.replace('.', '_')}"
    if qualified not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            qualified, PACKAGE_DIR.joinpath(*name.split(".")).with_suffix(".py")
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[qualified] = module
        spec.loader.exec_module(module)
    return sys.modules[qualified]
