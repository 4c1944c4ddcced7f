"""The compiled region covers the step the strategy runs, in every stage."""

import pytest
import torch
from torch._dynamo.utils import get_compilation_metrics
from torch.nn.parallel import DistributedDataParallel

from helpers import (
    DDP_BOUNDARY,
    DDP_BREAKS,
    QUIET,
    CountingBackend,
    LoggingModel,
    StateProbe,
    dynamo_stats,
)
from lightning.pytorch import Callback, Trainer, seed_everything

STAGE_LIMITS = {"limit_train_batches": 4, "limit_val_batches": 2, "limit_test_batches": 2, "limit_predict_batches": 2}


def run_all_stages(strategy, use_compile, callbacks=()):
    seed_everything(7)
    model = LoggingModel()
    probe = StateProbe()
    trainer = Trainer(
        strategy=strategy,
        use_compile=use_compile,
        max_epochs=1,
        callbacks=[probe, *callbacks],
        **QUIET,
        **STAGE_LIMITS,
    )
    metrics = {}
    trainer.fit(model)
    metrics["fit"] = dict(trainer.callback_metrics)
    trainer.validate(model, verbose=False)
    metrics["validate"] = dict(trainer.callback_metrics)
    trainer.test(model, verbose=False)
    metrics["test"] = dict(trainer.callback_metrics)
    predictions = trainer.predict(model)
    return probe.seen, metrics, predictions


STEPS = ["predict_step", "test_step", "training_step", "validation_step"]


class CompiledCallsPerStep(Callback):
    """Records, for every batch of every stage, how many compiled graphs of ``backend`` ran during its step."""

    def __init__(self, backend):
        self.backend = backend
        self.calls = {}

    def _start(self, *args):
        self._before = self.backend.calls

    def _end(self, trainer, stage):
        if trainer.sanity_checking:
            stage = "sanity"
        elif stage == "validate" and trainer.state.fn == "fit":
            stage = "fit_validate"
        self.calls.setdefault(stage, []).append(self.backend.calls - self._before)

    on_train_batch_start = on_validation_batch_start = on_test_batch_start = on_predict_batch_start = _start

    def on_train_batch_end(self, trainer, *args):
        self._end(trainer, "train")

    def on_validation_batch_end(self, trainer, *args):
        self._end(trainer, "validate")

    def on_test_batch_end(self, trainer, *args):
        self._end(trainer, "test")

    def on_predict_batch_end(self, trainer, *args):
        self._end(trainer, "predict")


#: The batches each stage of `run_all_stages` runs: the sanity check's 2, then `STAGE_LIMITS`.
STAGE_BATCHES = {"sanity": 2, "train": 4, "fit_validate": 2, "validate": 2, "test": 2, "predict": 2}


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_every_stage_runs_compiled(strategy):
    backend = CountingBackend(f"stages-{strategy}")
    calls = CompiledCallsPerStep(backend)
    seen, _, _ = run_all_stages(strategy, {"backend": backend}, callbacks=[calls])
    # every step of every stage ran compiled graphs: installing the compiled call is not enough
    assert {stage: len(n) for stage, n in calls.calls.items()} == STAGE_BATCHES
    assert all(n > 0 for per_batch in calls.calls.values() for n in per_batch), calls.calls
    if strategy == "ddp":
        # while fitting, DDP wraps the module, and runs the steps compiled on it inside its own call (C++ reducer)
        for stage in ("sanity", "train"):
            assert seen[stage]["model_type"] is DistributedDataParallel
            assert not seen[stage]["wrapper_compiled"]
    # the steps are compiled in place, with Lightning's `from_compiled`, in every stage, inside a wrapper or not
    for stage in ("train", "validate", "test", "predict"):
        assert seen[stage]["compiled_steps"] == STEPS
        assert seen[stage]["stock_compiled"]
    assert not seen["setup"]["stock_compiled"]  # nothing is compiled before the strategy's setup


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_validate_after_fit_compiles_nothing_new(strategy):
    """fit's evaluation and `validate` run one compiled validation step, under DDP too (its wrapper is fit's alone)."""
    backend = CountingBackend(f"fit-then-validate-{strategy}")
    trainer = Trainer(strategy=strategy, use_compile={"backend": backend}, max_epochs=1, **QUIET, **STAGE_LIMITS)
    model = LoggingModel()
    trainer.fit(model)
    fitted, calls = backend.graphs, backend.calls
    trainer.validate(model, verbose=False)
    assert backend.graphs == fitted
    assert backend.calls - calls >= STAGE_LIMITS["limit_val_batches"]  # and its steps ran fit's compiled graph


class ReducerProbe(Callback):
    def on_train_batch_start(self, trainer, *args):
        self.python_reducer = trainer.strategy.model._use_python_reducer


def test_ddp_forward_is_inside_the_compiled_region():
    """Under the python reducer the compiled call traces DDP's own forward with the step.

    With ``optimize_ddp="python_reducer"`` torch does not break the graph at the inner module call, so the step's
    operations land in one graph whose frame is ``DistributedDataParallel.forward``, with its pre- and post-forward.
    """
    reducer = ReducerProbe()
    trainer = Trainer(
        strategy="ddp",
        use_compile={"backend": "eager", "optimize_ddp": "python_reducer"},
        max_steps=2,
        limit_val_batches=0,
        callbacks=[reducer],
        **QUIET,
    )
    before = torch._dynamo.config.optimize_ddp
    trainer.fit(LoggingModel())
    # bug: the option was set after DDP was built, which reads it in its constructor: the C++ reducer ran
    assert reducer.python_reducer is True
    assert torch._dynamo.config.optimize_ddp == before  # restored after the run
    frames = {
        (m.co_name, m.co_filename.endswith("parallel/distributed.py")): m.graph_op_count
        for m in get_compilation_metrics()
    }
    assert frames.get(("forward", True), 0) > 0, frames
    assert not any(DDP_BOUNDARY in reason for reason in dynamo_stats().graph_breaks)


def test_the_steps_compile_whole_inside_ddp_under_its_cpp_reducer():
    """Under DDP's C++ reducer the steps are compiled, not DDP's call: no graph break at DDP's own code.

    Compiling DDP's call there adds frames and breaks at its inner module call and its reducer, while DDP's
    ``_pre_forward`` runs as Python all the same (``benchmarks/after_the_wrap.py``).
    """
    use_compile = {"backend": "eager", "optimize_ddp": True}  # torch's default, which "auto" turns off for one process
    probe = ReducerProbe()
    trainer = Trainer(
        strategy="ddp", use_compile=use_compile, max_steps=2, limit_val_batches=0, callbacks=[probe], **QUIET
    )
    trainer.fit(LoggingModel())
    assert probe.python_reducer is False
    breaks = dynamo_stats().graph_breaks
    assert not any(marker in reason for reason in breaks for marker in DDP_BREAKS), "\n".join(breaks)
    assert dynamo_stats().graphs > 0
