"""The monkeypatch itself: applied once on import, on both flavours, visible in the signature, and undoable."""

import importlib
import inspect
import subprocess
import sys
import textwrap

import pytest

from helpers import QUIET, CountingBackend, StateProbe

pytestmark = pytest.mark.package_only


@pytest.fixture
def patch_module():
    import lightning_compile_patch._monkeypatch.patch as patch

    yield patch
    patch.apply()  # leave the process patched, as the rest of the suite expects


def trainer_cls(flavour):
    return importlib.import_module(flavour).Trainer


def test_import_patches_every_installed_flavour(patch_module):
    assert patch_module.installed_flavours() == ["lightning.pytorch", "pytorch_lightning"]
    assert patch_module.is_applied("lightning.pytorch")
    assert patch_module.is_applied("pytorch_lightning")


def test_importing_again_changes_nothing(patch_module, flavour):
    import lightning_compile_patch

    cls = trainer_cls(flavour)
    before = {name: getattr(cls, name) for name in ("__init__", "_run", "fit", "validate", "test", "predict")}
    importlib.reload(lightning_compile_patch)
    assert patch_module.apply() == []
    importlib.reload(patch_module)  # even a fresh copy of the patch module sees that the Trainer is patched
    assert patch_module.apply() == []
    assert {name: getattr(cls, name) for name in before} == before


def test_remove_restores_stock_lightning(patch_module, flavour):
    cls = trainer_cls(flavour)
    compile_utils = importlib.import_module(f"{flavour}.utilities.compile")
    fixed_check = compile_utils._verify_strategy_supports_compile
    patch_module.remove()
    assert "use_compile" not in inspect.signature(cls).parameters
    with pytest.raises(TypeError, match="use_compile"):
        cls(use_compile=True, **QUIET)
    # Lightning's helpers are its own again; the one the fixes add is gone
    assert compile_utils._verify_strategy_supports_compile is not fixed_check
    assert not hasattr(compile_utils, "_verify_strategy_can_compile")
    imported = [name for name in ("lightning.pytorch", "pytorch_lightning") if name in sys.modules]
    assert patch_module.apply() == imported  # the others are patched when they are imported
    assert "use_compile" in inspect.signature(cls).parameters
    assert compile_utils._verify_strategy_supports_compile is fixed_check
    assert callable(compile_utils._verify_strategy_can_compile)


def test_a_trainer_created_before_the_patch_runs_stock(patch_module):
    from lightning.pytorch import Trainer
    from lightning.pytorch.demos.boring_classes import BoringModel

    patch_module.remove()
    trainer = Trainer(max_steps=1, **QUIET)
    patch_module.apply()
    trainer.fit(BoringModel())
    assert trainer.global_step == 1


def test_signature_and_docstring_show_use_compile(flavour):
    cls = trainer_cls(flavour)
    parameter = inspect.signature(cls).parameters["use_compile"]
    assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
    assert parameter.default is None
    doc = cls.__init__.__doc__
    assert "use_compile: Compile the model with ``torch.compile`` after the strategy has set it up" in doc
    assert doc.index("use_compile:") < doc.index("Raises:")


def test_pytorch_lightning_flavour_compiles_after_the_wrap():
    import pytorch_lightning as ptl
    from pytorch_lightning.demos.boring_classes import BoringModel

    backend = CountingBackend("ptl")
    probe = StateProbe()
    trainer = ptl.Trainer(strategy="ddp", use_compile={"backend": backend}, max_steps=2, callbacks=[probe], **QUIET)
    trainer.fit(BoringModel())
    assert probe.seen["train"]["model_type"].__name__ == "DistributedDataParallel"
    assert probe.seen["train"]["compiled_steps"] == ["predict_step", "test_step", "training_step", "validation_step"]
    assert backend.calls > 0
    assert (
        type(trainer._compile_connector).__module__
        == "lightning_compile_patch._flavours.pytorch_lightning.compile_connector"
    )


def run_python(code, **env):
    import os

    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )


def test_unsupported_lightning_release_is_refused_at_import():
    result = run_python(
        """
        import lightning.pytorch
        lightning.pytorch.__version__ = "2.5.3"
        import lightning_compile_patch
        """
    )
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    assert "supports lightning.pytorch >=2.6.0,<2.7.0, but lightning.pytorch 2.5.3 is installed" in result.stderr
    assert "LIGHTNING_COMPILE_PATCH_ALLOW_UNTESTED=1" in result.stderr


def test_untested_release_can_be_patched_on_request():
    result = run_python(
        """
        import warnings
        warnings.simplefilter("always")
        import lightning.pytorch
        lightning.pytorch.__version__ = "2.7.0"
        import lightning_compile_patch
        print("applied", lightning_compile_patch.is_applied("lightning.pytorch"))
        """,
        LIGHTNING_COMPILE_PATCH_ALLOW_UNTESTED="1",
    )
    assert result.returncode == 0, result.stderr
    assert "applied True" in result.stdout
    assert "untested" in result.stderr


def test_missing_hooks_are_reported_by_name(patch_module):
    class NotATrainer:
        def __init__(self):
            pass

    with pytest.raises(ImportError, match=r"lacks Trainer.__init__.__wrapped__, Trainer._run, Trainer._teardown"):
        patch_module._check_hooks("lightning.pytorch", NotATrainer)


def test_no_lightning_installed_is_a_clear_error(monkeypatch):
    import lightning_compile_patch._monkeypatch.patch as patch

    monkeypatch.setattr(patch, "installed_flavours", list)
    with pytest.raises(ImportError, match="neither `lightning` nor `pytorch_lightning` is installed"):
        patch.apply()
