"""One compiled fit from the installed wheel: `nox -s wheel` runs it in a fresh environment, outside the source tree."""

import lightning_compile_patch
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

assert "site-packages" in lightning_compile_patch.__file__, f"imported from {lightning_compile_patch.__file__}"
trainer = Trainer(
    use_compile={"backend": "aot_eager"},
    max_steps=3,
    limit_val_batches=0,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    accelerator="cpu",
)
trainer.fit(BoringModel())
summary = lightning_compile_patch.last_summary(trainer)
assert summary is not None
assert summary.compiled_steps == {"training": 3}, summary
print(f"wheel {lightning_compile_patch.__version__} from {lightning_compile_patch.__file__}: {summary.compiled_steps}")
