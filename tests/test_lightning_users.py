"""Models as Lightning users write them (and Lightning's own tests exercise) train compiled, every step.

Each case here failed, or ran eager without a word, before `use_compile` handled it; `tools/lightning_suite` runs
Lightning's own suite compiled to find more.
"""

import functools
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch._dynamo.utils import counters

from helpers import QUIET, TORCH_2_7, TORCH_2_13, CountingBackend, ManualModel, last_summary, lightning_side
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.demos.boring_classes import BoringModel

AOT_EAGER = {"backend": "aot_eager"}
LIMITS = {"max_steps": 3, "limit_train_batches": 3, "limit_val_batches": 2, "num_sanity_val_steps": 0}


def compiled_and_eager(trainer):
    summary = last_summary(trainer)
    return summary.compiled_steps, summary.eager_steps


class StepsWithoutBatchIdx(BoringModel):
    """Lightning passes `batch_idx` only to a step whose signature takes it."""

    def training_step(self, batch):
        return super().training_step(batch, 0)

    def validation_step(self, batch):
        return super().validation_step(batch, 0)


def test_a_step_receives_only_the_arguments_its_signature_takes():
    trainer = Trainer(use_compile=AOT_EAGER, max_epochs=1, **LIMITS, **QUIET)
    trainer.fit(StepsWithoutBatchIdx())  # a hidden signature passes `batch_idx` too: TypeError
    assert compiled_and_eager(trainer) == ({"training": 3, "evaluation": 2}, {})


def test_the_compiled_step_shows_the_users_signature():
    class Probe(StepsWithoutBatchIdx):
        def on_train_start(self):
            import inspect

            self.seen = (list(inspect.signature(self.training_step).parameters), self.training_step.__name__)

    model = Probe()
    Trainer(use_compile=AOT_EAGER, **LIMITS, **QUIET).fit(model)
    assert model.seen == (["batch"], "training_step")


@pytest.mark.parametrize("compiled_input", [False, True], ids=["use_compile", "compiled_model"])
def test_a_step_set_to_none_turns_its_loop_off(compiled_input):
    model = BoringModel()
    model.validation_step = None  # how Lightning users and tests turn validation off
    backend = CountingBackend("none_step")
    use_compile = None if compiled_input else {"backend": backend}
    trainer = Trainer(use_compile=use_compile, max_epochs=1, **LIMITS, **QUIET)
    trainer.fit(torch.compile(model, backend=backend) if compiled_input else model)
    assert backend.calls == 3  # the three training steps ran compiled (a compiled model passed in gets no summary)
    assert model.validation_step is None  # still off after the run


class BackwardTwice(ManualModel):
    """Manual optimization that needs the graph twice: `retain_graph=True`, as GANs and closures do."""

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss = self.step(batch)
        opt.zero_grad()
        self.manual_backward(loss, retain_graph=True)
        self.manual_backward(loss)
        opt.step()
        return loss


def train_weights(use_compile):
    seed_everything(3)
    model = BackwardTwice()
    trainer = Trainer(use_compile=use_compile, max_epochs=1, **LIMITS, **QUIET)
    trainer.fit(model)
    return trainer, [p.detach().clone() for p in model.parameters()]


def test_manual_optimization_may_run_the_backward_twice():
    _, eager = train_weights(None)
    # a backward compiled with the forward (fallback's, torch 2.13+) donates its buffers and refuses the second one
    trainer, compiled = train_weights(AOT_EAGER)
    assert compiled_and_eager(trainer) == ({"training": 3, "evaluation": 2}, {})
    for expected, got in zip(eager, compiled, strict=True):
        torch.testing.assert_close(got, expected)


class WithMetric(BoringModel):
    """torchmetrics in the steps, logged as a metric object: how most Lightning users compute metrics."""

    def __init__(self):
        super().__init__()
        import torchmetrics

        self.train_mean = torchmetrics.MeanMetric()
        self.val_mean = torchmetrics.MeanMetric()

    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        self.train_mean(out["loss"])
        self.log("train_mean", self.train_mean)
        return out

    def validation_step(self, batch, batch_idx):
        out = super().validation_step(batch, batch_idx)
        self.val_mean.update(out["x"])
        self.log("val_mean", self.val_mean)
        return out


def fit_with_metric(use_compile):
    seed_everything(5)
    model = WithMetric()
    steps = {"max_steps": 8, "limit_train_batches": 8, "limit_val_batches": 8, "num_sanity_val_steps": 0}
    trainer = Trainer(use_compile=use_compile, max_epochs=1, **steps, **QUIET)
    trainer.fit(model)
    return trainer, model


def test_torchmetrics_in_the_step_compile_once_and_stay_compiled():
    pytest.importorskip("torchmetrics")
    eager, _ = fit_with_metric(None)
    trainer, model = fit_with_metric(AOT_EAGER)  # a metric counts its calls in a Python int: a recompile every step
    assert compiled_and_eager(trainer) == ({"training": 8, "evaluation": 8}, {})
    assert last_summary(trainer).recompiles == 0
    for name in ("train_mean", "val_mean"):
        torch.testing.assert_close(trainer.callback_metrics[name], eager.callback_metrics[name])
    assert "forward" not in model.train_mean.__dict__  # the metric is plain again after the run


class HookedModel(BoringModel):
    """Steps replaced on the instance by a `functools.partial` that records the call (Lightning's `test_hooks.py`)."""

    def __init__(self, called):
        super().__init__()
        for name in ("training_step", "validation_step"):
            method = getattr(self, name)
            hooked = functools.partial(self._record, called, name, method)
            functools.update_wrapper(hooked, method)
            setattr(self, name, hooked)

    @staticmethod
    def _record(called, name, method, *args, **kwargs):
        called.append(name)
        return method(*args, **kwargs)


def test_steps_hooked_on_the_instance_are_counted_compiled():
    called = []
    trainer = Trainer(use_compile=AOT_EAGER, max_epochs=1, **LIMITS, **QUIET)
    trainer.fit(HookedModel(called))
    assert called.count("training_step") == 3  # the hook ran in every step, compiled
    assert compiled_and_eager(trainer) == ({"training": 3, "evaluation": 2}, {})


@pytest.mark.parametrize("compiled_input", [False, True], ids=["use_compile", "compiled_model"])
def test_each_step_function_compiles_once_across_stages(compiled_input):
    model = BoringModel()
    compiled = torch.compile(model, backend="aot_eager")
    trainer = Trainer(use_compile=None if compiled_input else AOT_EAGER, max_epochs=1, **LIMITS, **QUIET)
    given = compiled if compiled_input else model
    trainer.fit(given)
    graphs = counters["stats"]["unique_graphs"]
    for run in (trainer.validate, trainer.test, trainer.predict):
        run(given)
        if not compiled_input:  # a compiled model passed in gets no summary: the graph count below says it
            summary = last_summary(trainer)
            assert summary.recompiles == 0, summary
            assert sum(summary.eager_steps.values()) == 0, summary
    # fit compiled the training and validation steps; test and predict add one graph each, validate none
    assert counters["stats"]["unique_graphs"] == graphs + 2
    assert compiled._compile_kwargs == {"backend": "aot_eager"}  # the input's arguments are the user's, unchanged


def run_python(code):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PL_")}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


@pytest.mark.package_only
@pytest.mark.parametrize("first", ["lightning.pytorch", "pytorch_lightning"])
def test_importing_the_package_imports_no_lightning_flavour(first):
    # the flavour imported last owns the logger of the `rank_zero_*` helpers both flavours share: importing the other
    # one sent Lightning's debug records to a logger that nothing listens to
    stock = run_python(f"import {first}, lightning_utilities.core.rank_zero as r; print(r.log.name)")
    patched = run_python(
        f"""
        import sys, lightning_compile_patch, {first}, lightning_utilities.core.rank_zero as r
        print(r.log.name, [m for m in ("lightning.pytorch", "pytorch_lightning") if m in sys.modules])
        print("use_compile" in __import__("inspect").signature({first}.Trainer).parameters)
        """
    )
    assert patched == [*stock, f"['{first}']", "True"]


@pytest.mark.skipif(not TORCH_2_7, reason="kept short: the same code on every torch")
def test_use_compile_none_or_false_runs_no_compile_feature():
    connector = Trainer(**QUIET)._compile_connector
    assert connector.features == []
    assert Trainer(use_compile=False, **QUIET)._compile_connector.features == []


def test_step_accounting_takes_code_objects_that_cannot_be_hashed():
    # Dynamo's own code objects can hold a dict among their constants (Lightning's closure tests under manual
    # optimization): a set lookup of one raised "unhashable type: 'dict'" inside the backend, and the run failed
    summary = lightning_side("summary")
    code = (lambda: None).__code__
    unhashable = code.replace(co_consts=(*code.co_consts, {}))
    with pytest.raises(TypeError, match="unhashable"):
        hash(unhashable)
    assert not summary._contains({code}, unhashable)
    assert summary._contains([code, unhashable], unhashable)


class NamedByStage(BoringModel):
    """The metric name picked from a dict keyed by the Trainer's stage and function, as libraries built on Lightning do.

    ReduceLROnPlateau watches the name that fit's validation logs, `val_loss`.
    """

    def __init__(self):
        super().__init__()
        self.seen = []

    def validation_step(self, batch, batch_idx):
        loss = self.step(batch)
        from lightning.pytorch.trainer.states import RunningStage, TrainerFn

        stage = {RunningStage.SANITY_CHECKING: "sanity_check", RunningStage.VALIDATING: "val"}[self.trainer.state.stage]
        fn = {TrainerFn.FITTING: "", TrainerFn.VALIDATING: "validate_"}[self.trainer.state.fn]
        self.log(f"{fn}{stage}_loss", loss)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        # patience 0 and a threshold no loss beats: the LR halves after every validation, if it sees `val_loss`
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0, threshold=10.0)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": plateau, "monitor": "val_loss"}}

    def on_validation_epoch_end(self):
        metrics = self.trainer.callback_metrics
        lr = self.trainer.optimizers[0].param_groups[0]["lr"] if self.trainer.optimizers else None
        self.seen.append((sorted((k, v.item()) for k, v in metrics.items() if k.endswith("loss")), lr))


def run_named_by_stage(use_compile):
    seed_everything(7)
    model = NamedByStage()
    steps = {"limit_train_batches": 2, "limit_val_batches": 2, "num_sanity_val_steps": 2}
    trainer = Trainer(use_compile=use_compile, max_epochs=4, **steps, **QUIET)
    trainer.fit(model)
    trainer.validate(model)
    return trainer, model.seen


@pytest.mark.skipif(not TORCH_2_13, reason="stage guards are on from torch 2.13, where they were checked")
def test_a_metric_named_by_the_stage_gets_the_name_and_value_eager_gives_it_in_every_stage():
    _, eager = run_named_by_stage(None)
    # the sanity check's trace ran in every later validation: `sanity_check_loss` each epoch, no `val_loss`, and the
    # scheduler that watches it failed
    trainer, compiled = run_named_by_stage(AOT_EAGER)
    assert [[name for name, _ in names] for names, _ in compiled] == [[name for name, _ in names] for names, _ in eager]
    for (names, lr), (expected_names, expected_lr) in zip(compiled, eager, strict=True):
        assert lr == expected_lr  # ReduceLROnPlateau stepped on `val_loss` as in eager
        torch.testing.assert_close([v for _, v in names], [v for _, v in expected_names])
    assert compiled_and_eager(trainer)[1] == {}
    assert type(trainer.state).__name__ == "TrainerState"  # the state's own class again after the run


class IndexedWithNumpy(BoringModel):
    """Steps that pick output columns with a numpy array, as tabular and time-series libraries do."""

    COLUMNS = __import__("numpy").array([1, 0, 1])

    def test_step(self, batch, batch_idx):
        self.log("picked", self(batch)[:, self.COLUMNS].sum())

    def predict_step(self, batch, batch_idx):
        return self(batch)[:, self.COLUMNS]


def predict_and_test(use_compile):
    seed_everything(11)
    trainer = Trainer(use_compile=use_compile, limit_test_batches=3, limit_predict_batches=3, **QUIET)
    model = IndexedWithNumpy()
    predictions = trainer.predict(model)
    counts = [compiled_and_eager(trainer)] if use_compile else []
    tested = trainer.test(model, verbose=False)
    counts += [compiled_and_eager(trainer)] if use_compile else []
    assert trainer.predict_loop.inference_mode  # the user's setting again
    assert trainer.test_loop.inference_mode
    return predictions, tested, counts


def test_predict_and_test_run_compiled_and_give_eagers_values_where_inference_mode_fails_in_dynamo():
    eager_predictions, eager_tested, _ = predict_and_test(None)
    # under `torch.inference_mode`, Dynamo raised "Guard failed on the same frame it was created ... dispatch key set
    # mismatch" in both steps
    predictions, tested, counts = predict_and_test(AOT_EAGER)
    torch.testing.assert_close(predictions, eager_predictions)
    assert tested == eager_tested
    assert counts == [({"evaluation": 3}, {})] * 2
