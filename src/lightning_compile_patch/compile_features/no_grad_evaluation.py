"""``validate``, ``test`` and ``predict`` run under ``torch.no_grad`` while compiling, not ``torch.inference_mode``.

* ``validate`` after ``fit`` reuses the validation step fit compiled (fit validates under ``no_grad``): under
  ``inference_mode``, whose tensors have other dispatch keys, PyTorch compiles it a second time.
* Dynamo fails on some steps under ``inference_mode`` that run under ``no_grad``: a step that indexes a tensor with a
  numpy array raises ``Guard failed on the same frame it was created`` (torch 2.13,
  ``docs/repros/inference_mode_numpy_index.py``).

Gradients are off either way, so the values are the same; what ``inference_mode`` adds is that the outputs cannot
enter autograd later. It overrides ``Trainer(inference_mode=True)`` for the run, which is why it takes a key.

"""

from typing import Any

from lightning_compile_patch.compile_features import _CompileFeature, _CompileOptions, _flag
from lightning_compile_patch.compile_features._run import _CompileRun


class _NoGradEvaluation(_CompileFeature):
    """For the run, the evaluation loops run under ``torch.no_grad``."""

    keys = {"no_grad_evaluation": "True: validate, test and predict run under `torch.no_grad` while compiling"}

    def __init__(self, options: _CompileOptions) -> None:
        _flag(options, "no_grad_evaluation")

    def on_run_start(self, run: _CompileRun, model: Any) -> None:
        for loop in (run.trainer.validate_loop, run.trainer.test_loop, run.trainer.predict_loop):
            if loop.inference_mode:
                run.replace(loop, "inference_mode", False, scope="run")


FEATURE = _NoGradEvaluation
