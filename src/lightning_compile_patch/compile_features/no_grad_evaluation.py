"""``validate``, ``test`` and ``predict`` run under ``torch.no_grad`` while compiling, not ``torch.inference_mode``.

* ``validate`` after ``fit`` reuses the validation step fit compiled (fit validates under ``no_grad``): under
  ``inference_mode``, whose tensors have other dispatch keys, PyTorch compiles it a second time. Where DDP's call is
  compiled (its python reducer, to fit only), fit's evaluation runs the call eagerly and the validation step compiled on
  the module: evaluation has no backward, so DDP's own forward gains nothing from being compiled there.
* Dynamo fails on some steps under ``inference_mode`` that run under ``no_grad``: a step that indexes a tensor with a
  numpy array raises ``Guard failed on the same frame it was created`` (torch 2.13,
  ``docs/repros/inference_mode_numpy_index.py``).

Gradients are off either way, so the values are the same; what ``inference_mode`` adds is that the outputs cannot
enter autograd later. It overrides ``Trainer(inference_mode=True)`` for the run, which is why it takes a key.

"""

from typing import Any, Callable

from lightning_compile_patch.compile_connector import _CompileConnector, _CompileFeature, _CompileOptions, _flag


class _EvaluationNoGrad(_CompileFeature):
    """For the run, the evaluation loops run under ``torch.no_grad``."""

    keys = {"no_grad_evaluation": "True: validate, test and predict run under `torch.no_grad` while compiling"}

    def __init__(self, options: _CompileOptions) -> None:
        _flag(options, "no_grad_evaluation")

    def on_run_start(self, connector: _CompileConnector, model: Any) -> None:
        for loop in (connector.trainer.validate_loop, connector.trainer.test_loop, connector.trainer.predict_loop):
            if loop.inference_mode:
                connector.replace(loop, "inference_mode", False, scope="run")

    def wrap(self, connector: _CompileConnector, compiled: Callable, original: Callable, module_call: bool) -> Callable:
        if not module_call:
            return compiled
        # DDP's call compiled (its python reducer, to fit only): fit's evaluation runs the step compiled on the module
        trainer = connector.trainer
        connector.compile_step("validation_step")

        def call(*args: Any, **kwargs: Any) -> Any:  # the wrapper's call: compiled to train, eager to evaluate
            return (compiled if trainer.training else original)(*args, **kwargs)

        return call


FEATURE = _EvaluationNoGrad
