"""`use_compile` never runs a step uncompiled without saying so, and a failed run does not make the next one eager."""

import warnings

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.symbolic_convert import InstructionTranslator
from torch.utils.data import DataLoader

from helpers import QUIET, TORCH_2_13, CountingBackend, LoopedValidation, dynamo_stats, last_summary
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset

FIT = {**QUIET, "max_steps": 3, "limit_val_batches": 0}


class FailsOnce(BoringModel):
    """Raises in its training step while ``bad`` is set: a bad batch, as a notebook user meets one."""

    bad = True

    def check(self, batch):
        if self.bad:
            raise ValueError("bad batch")

    def training_step(self, batch, batch_idx):
        self.check(batch)
        return super().training_step(batch, batch_idx)


def test_a_fit_after_an_exception_in_the_step_runs_compiled_again():
    # bug: Dynamo marks the step's code "skip" for the process when the step raises while compiled, and every later
    # run of the step was eager while the summary still counted graphs
    model = FailsOnce()
    with pytest.raises(ValueError, match="bad batch"):
        Trainer(use_compile={"backend": "aot_eager"}, **FIT).fit(model)
    model.bad = False
    trainer = Trainer(use_compile={"backend": "aot_eager"}, **FIT)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # and no eager-step warning either
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        trainer.fit(model)
    assert last_summary(trainer).compiled_steps == {"training": 3}
    assert last_summary(trainer).eager_steps == {}


def test_a_failed_run_resets_only_the_code_it_compiled():
    backend = CountingBackend("other-code")

    def double(x):
        return x * 2

    other = torch.compile(double, backend=backend)
    other(torch.ones(2))
    assert (backend.graphs, backend.calls) == (1, 1)
    model = FailsOnce()
    with pytest.raises(ValueError, match="bad batch"):
        Trainer(use_compile={"backend": "aot_eager"}, **FIT).fit(model)
    # code the run did not compile keeps its compiled entry: it runs that graph again, neither recompiled nor eager
    torch.testing.assert_close(other(torch.ones(2)), torch.full((2,), 2.0))
    assert (backend.graphs, backend.calls) == (1, 2)


def exploding_backend(gm, example_inputs):
    raise RuntimeError("backend exploded")


def test_steps_that_run_eager_are_counted_and_said_once():
    # bug: with `suppress_errors`, a failing compile ran every step eagerly and the summary still said nothing
    trainer = Trainer(use_compile={"backend": exploding_backend}, **FIT)
    with (
        torch._dynamo.config.patch(suppress_errors=True),
        pytest.warns(UserWarning, match=r"ran (its own code )?eagerly \(.*suppress_errors") as caught,
    ):
        trainer.fit(BoringModel())
    assert sum(" step (fit) ran " in str(w.message) for w in caught) == 1
    assert last_summary(trainer).eager_steps == {"training": 3}
    assert last_summary(trainer).compiled_steps == {}


def test_an_eager_evaluation_step_is_warned_in_plain_english():
    trainer = Trainer(use_compile={"backend": exploding_backend}, max_steps=0, **{**QUIET, "limit_val_batches": 2})
    with (
        torch._dynamo.config.patch(suppress_errors=True),
        pytest.warns(UserWarning, match=r"ran eagerly \(") as caught,
    ):
        trainer.validate(BoringModel())
    warned = [str(w.message) for w in caught if " step (validate) ran " in str(w.message)]
    assert warned[0].startswith("`use_compile`: an evaluation step (validate) ran eagerly (no graph of its own"), warned
    assert last_summary(trainer).eager_steps == {"evaluation": 2}


def backend_failing_in(frame_name):
    """A backend that raises for the graphs of one frame only: Dynamo then skips that frame and compiles its callees."""

    def backend(gm, example_inputs):
        if InstructionTranslator.current_tx().f_code.co_name == frame_name:
            raise RuntimeError(f"cannot compile {frame_name}")
        return gm.forward

    return backend


def test_a_skipped_step_counts_as_compiled_in_parts_where_only_the_functions_it_calls_run_compiled():
    # the step's code is skipped while the model's forward, called from it, is compiled as a frame of its own: only the
    # forward's graphs run. Counting every graph that ran during the step would call such a step compiled; counting
    # none, eager.
    trainer = Trainer(use_compile={"backend": backend_failing_in("training_step")}, **FIT)
    with (
        torch._dynamo.config.patch(suppress_errors=True),
        # the warning says what ran: not "without compiled code"
        pytest.warns(UserWarning, match=r"step \(fit\) ran compiled in parts \(its own code eagerly, the graphs of"),
    ):
        trainer.fit(BoringModel())
    assert dynamo_stats().graphs == 1  # the forward's
    assert last_summary(trainer).parts_steps == {"training": 3}
    assert last_summary(trainer).compiled_steps == last_summary(trainer).eager_steps == {}


def test_a_fallback_is_counted_but_not_warned_twice():
    trainer = Trainer(use_compile={"backend": exploding_backend, "fallback": "eager"}, **FIT)
    with pytest.warns(UserWarning, match="continues uncompiled") as caught:
        trainer.fit(BoringModel())
    assert not any(" step (fit) ran " in str(w.message) for w in caught)
    # the first step failed to compile and ran eagerly; from then on the model is uncompiled, as the warning says
    assert last_summary(trainer).eager_steps == {"training": 3}
    assert last_summary(trainer).eager_causes == {"fallback": 3}
    assert last_summary(trainer).fell_back


def _exploding_backward():
    return aot_autograd(fw_compiler=lambda gm, _: gm.forward, bw_compiler=exploding_backend)


needs_non_lazy_backward = pytest.mark.skipif(
    not hasattr(torch._functorch.config, "force_non_lazy_backward_lowering"),
    reason="torch compiles the backward with the forward from 2.13 on",
)


def _weights(strategy, use_compile):
    seed_everything(7)
    model = BoringModel()
    Trainer(strategy=strategy, use_compile=use_compile, **FIT).fit(model)
    return {k: v.clone() for k, v in model.state_dict().items()}


@needs_non_lazy_backward
@pytest.mark.parametrize(("strategy", "name"), [("auto", "SingleDeviceStrategy"), ("ddp", "DDPStrategy")])
def test_a_backward_that_fails_to_compile_names_the_run(strategy, name):
    # bug: AOTAutograd compiles the backward inside `loss.backward()`, outside the compiled step: a raw error escaped
    with pytest.raises(RuntimeError, match=rf"could not compile the fit step .* under {name}.*backend exploded"):
        Trainer(strategy=strategy, use_compile={"backend": _exploding_backward(), "dynamic": False}, **FIT).fit(
            BoringModel()
        )


@needs_non_lazy_backward
@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_a_backward_that_fails_to_compile_falls_back_like_the_forward(strategy):
    eager = _weights(strategy, False)
    with pytest.warns(UserWarning, match="continues uncompiled"):
        fallen_back = _weights(strategy, {"backend": _exploding_backward(), "dynamic": False, "fallback": "eager"})
    assert all(torch.equal(fallen_back[k], eager[k]) for k in eager)


class SeesTheModel(Callback):
    def on_exception(self, trainer, pl_module, exception):
        self.compiled = pl_module._compiler_ctx is not None


def test_on_exception_callbacks_see_the_model_as_it_was_when_it_raised():
    # bug: the monkeypatch uncompiled in `_run`'s `finally`, before Lightning's `on_exception` callbacks ran
    probe = SeesTheModel()
    with pytest.raises(ValueError, match="bad batch"):
        Trainer(use_compile={"backend": "aot_eager"}, callbacks=[probe], **FIT).fit(FailsOnce())
    assert probe.compiled


class FitsAnotherTrainer(Callback):
    def on_train_start(self, trainer, pl_module):
        other = Trainer(use_compile={"backend": "aot_eager"}, **FIT)
        with pytest.raises(RuntimeError, match="another Trainer's compiled run is in progress"):
            other.fit(BoringModel())
        self.refused = True


def test_compiled_runs_go_one_at_a_time_in_a_process():
    # Dynamo's counters and settings are process-wide: a second run inside the first would miscount and misrestore
    probe = FitsAnotherTrainer()
    trainer = Trainer(use_compile={"backend": "aot_eager"}, callbacks=[probe], **FIT)
    trainer.fit(BoringModel())
    assert probe.refused
    assert last_summary(trainer).compiled_steps == {"training": 3}
    Trainer(use_compile={"backend": "aot_eager"}, **FIT).fit(BoringModel())  # and the next one may run


#: Dynamo's recompile limit, by the name this torch gives it (`cache_size_limit` before 2.7).
LIMIT = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
#: The cause the summary gives a step whose frame Dynamo skipped for a graph break inside a loop.
LOOP_SKIP = "skipped: graph break in loop"


class StepThenHelper(BoringModel):
    """The step reads `batch_idx` (guarded by value under `dynamic=False`), then calls a helper behind a graph break.

    The helper is compiled as a frame of its own, from the step's compiled code. Once the step's frame hits the
    recompile limit, the step runs eagerly while the helper's graph still runs, called from the eager step.
    """

    def training_step(self, batch, batch_idx):
        return self.loss_of(batch * (batch_idx + 1))

    def loss_of(self, batch):
        torch._dynamo.graph_break()
        return {"loss": self.step(batch)}


def test_a_step_counts_as_compiled_only_when_a_graph_of_its_own_code_ran_during_it():
    # bug: a graph was attributed to the step when it was compiled; the helper's graph, compiled while the step ran
    # compiled, kept counting the step as compiled after the step itself ran eagerly
    trainer = Trainer(use_compile={"backend": "aot_eager", "dynamic": False}, **{**FIT, "max_steps": 5})
    with torch._dynamo.config.patch(**{LIMIT: 2}), pytest.warns(UserWarning, match="recompile limit"):
        trainer.fit(StepThenHelper())
    summary = last_summary(trainer)
    assert summary.compiled_steps == {"training": 2}  # batch_idx 0 and 1: the step's own graphs ran
    assert summary.parts_steps == {"training": 3}  # the helper's graph ran
    assert summary.parts_causes == {"recompile limit": 3}


class LoopedChunks(BoringModel):
    """Truncated BPTT as in Lightning's `common/tbptt.rst`: the step optimizes chunk by chunk, in a `for` loop."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.cell = torch.nn.Linear(16, 2)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        hidden = torch.zeros(batch.shape[0], 2)
        for chunk in batch.split(16, dim=1):
            out = self.cell(torch.cat([chunk[:, :14], hidden], dim=1))
            loss = out.sum()
            opt.zero_grad()
            self.manual_backward(loss)  # a graph break, inside the loop: Dynamo skips the whole frame
            opt.step()
            hidden = out.detach()


#: Dynamo's compilation metrics and messages that name these causes: checked on torch 2.13 (2.6 names them otherwise).
CAUSES_FROM_2_13 = pytest.mark.skipif(not TORCH_2_13, reason="the causes are read as torch 2.13 words them")


@CAUSES_FROM_2_13
def test_a_step_dynamo_skips_for_a_graph_break_in_its_loop_is_warned_with_dynamos_reason_and_the_fix():
    # bug: the warning blamed "an earlier error in this process or `torch.compiler.disable`"
    epoch_of_3 = {**FIT, "max_steps": -1, "max_epochs": 1, "limit_train_batches": 3}  # manual optimization: 2 per step
    trainer = Trainer(use_compile={"backend": "aot_eager"}, **epoch_of_3)
    with pytest.warns(UserWarning, match=r"ran compiled in parts \(") as caught:
        trainer.fit(LoopedChunks())
    (warned,) = [str(w.message) for w in caught if " step (fit) ran " in str(w.message)]
    assert "loop" in warned, warned  # Dynamo's own reason
    assert "earlier" not in warned, warned  # not a guess
    assert f"{__file__}:" in warned  # where the graph break is
    assert "method of its own" in warned  # and what to do about it
    assert last_summary(trainer).parts_causes == {LOOP_SKIP: 3}, warned


class ChunksInAMethod(LoopedChunks):
    """The step only calls a method, which holds the loop: as `neuralforecast`'s `predict_step` calls its own."""

    def training_step(self, batch, batch_idx):
        self.optimize_in_chunks(batch)

    def optimize_in_chunks(self, batch):
        opt = self.optimizers()
        for chunk in batch.split(16, dim=1):
            loss = self.cell(chunk[:, :16]).sum()
            opt.zero_grad()
            self.manual_backward(loss)  # a graph break, inside the loop: Dynamo skips the whole frame
            opt.step()


@CAUSES_FROM_2_13
def test_a_step_that_only_calls_a_method_dynamo_skips_is_warned_with_that_methods_reason():
    # bug: the step's own frame compiled no graph and did not fail, so it was warned with a guess ("an earlier error")
    trainer = Trainer(use_compile={"backend": "aot_eager"}, **{**FIT, "max_steps": -1, "max_epochs": 1})
    with pytest.warns(UserWarning, match=r"ran compiled in parts \(") as caught:
        trainer.fit(ChunksInAMethod(), train_dataloaders=DataLoader(RandomDataset(32, 3 * 2), batch_size=2))
    (warned,) = [str(w.message) for w in caught if " step (fit) ran " in str(w.message)]
    assert "`optimize_in_chunks`" in warned, warned  # the frame Dynamo skipped, and why
    assert "earlier" not in warned, warned
    assert last_summary(trainer).parts_causes == {LOOP_SKIP: 3}


@CAUSES_FROM_2_13
def test_a_later_run_of_the_trainer_names_the_cause_its_earlier_run_found():
    # bug: Dynamo keeps the frame it skipped in `fit` skipped, so `validate` found no failure of its own and guessed
    trainer = Trainer(use_compile={"backend": "aot_eager"}, **{**QUIET, "max_steps": 1, "limit_val_batches": 2})
    with pytest.warns(UserWarning, match=r"ran compiled in parts \("):
        trainer.fit(model := LoopedValidation())
    with pytest.warns(UserWarning, match=r"ran compiled in parts \(") as caught:
        trainer.validate(model)
    assert all("earlier" not in str(w.message) for w in caught)
    assert last_summary(trainer).parts_causes == {LOOP_SKIP: 2}


class LoopedStepCountedValidation(LoopedChunks):
    """A training step skipped for its loop, and a validation step that hits the recompile limit on `batch_idx`."""

    def validation_step(self, batch, batch_idx):
        return super().validation_step(batch * (batch_idx + 1), batch_idx)


@CAUSES_FROM_2_13
def test_only_the_steps_whose_own_frame_hit_the_recompile_limit_are_labelled_with_it():
    # bug: once any frame of the run hit the limit, every later eager step was labelled "recompile limit"
    trainer = Trainer(
        use_compile={"backend": "aot_eager", "dynamic": False},
        **{**QUIET, "max_epochs": 2, "limit_train_batches": 2, "limit_val_batches": 4, "num_sanity_val_steps": 0},
    )
    with torch._dynamo.config.patch(**{LIMIT: 2}), pytest.warns(UserWarning, match="recompile limit"):
        trainer.fit(LoopedStepCountedValidation())
    summary = last_summary(trainer)
    assert summary.compiled_steps == {"evaluation": 4}  # batch_idx 0 and 1 of each validation
    # the model's `forward` and `self.cell` ran compiled in both: each step ran compiled in parts
    assert summary.parts_causes == {LOOP_SKIP: 4, "recompile limit": 4}


class BreaksMidStep(BoringModel):
    def training_step(self, batch, batch_idx):
        batch = batch * 2  # a graph of the step's own frame, which runs before the resumed part fails to compile
        torch._dynamo.graph_break()
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_after_a_fallback_every_step_is_counted_eager_the_failing_one_too(strategy):
    # bug: the steps after the fallback went uncounted (the model was uncompiled, and with it the counting wrapper),
    # and the failing step counted as compiled, since a graph of its own ran before the part that failed to compile;
    # under DDP, the eager rerun of that step called the module's own forward with the step's arguments (the part that
    # ran had taken the forward redirection off the module already)
    def failing_after_the_break(gm, example_inputs):
        if InstructionTranslator.current_tx().f_code.co_name.startswith("torch_dynamo_resume_in_training_step"):
            raise RuntimeError("cannot compile the rest of the step")
        return gm.forward

    trainer = Trainer(
        use_compile={"backend": failing_after_the_break, "fallback": "eager"},
        strategy=strategy,
        **{**QUIET, "max_epochs": 2, "limit_train_batches": 3, "limit_val_batches": 2, "num_sanity_val_steps": 0},
    )
    with pytest.warns(UserWarning, match="continues uncompiled"):
        trainer.fit(BreaksMidStep())
    summary = last_summary(trainer)
    assert summary.compiled_steps == {}
    assert summary.eager_steps == {"training": 6, "evaluation": 4}
    assert summary.eager_causes == {"fallback": 10}


class DisabledStep(BoringModel):
    training_step = torch.compiler.disable(BoringModel.training_step)


@CAUSES_FROM_2_13
def test_a_step_marked_compiler_disable_is_labelled_so():
    # bug: it was labelled "skipped", with a guess between an earlier error and `torch.compiler.disable`
    trainer = Trainer(use_compile={"backend": "aot_eager"}, **FIT)
    with pytest.warns(UserWarning, match="marked `torch.compiler.disable`"):
        trainer.fit(DisabledStep())
    assert last_summary(trainer).parts_causes == {"torch.compiler.disable": 3}


class FlagsOnly(BoringModel):
    def validation_step(self, batch, batch_idx):
        self.validated = True  # no tensor: Dynamo compiles the frame and finds no graph


@CAUSES_FROM_2_13
def test_a_step_with_no_tensor_work_is_labelled_so_in_every_trainer():
    # bug: it was labelled "skipped", with a guess at an earlier error, though Dynamo compiled it and had nothing to run
    causes = []
    for _ in range(2):  # the second Trainer finds the code compiled already, with no graph in it
        trainer = Trainer(use_compile={"backend": "aot_eager"}, **{**QUIET, "max_steps": 1, "limit_val_batches": 2})
        with pytest.warns(UserWarning, match="no tensor operation"):
            trainer.fit(FlagsOnly())
        causes.append(last_summary(trainer).eager_causes)
    assert causes == [{"no tensor work": 2}] * 2


class TestCallsPredict(BoringModel):
    """`test_step` calls `self.predict_step`, a common pattern: the call is traced as the user wrote it."""

    def predict_step(self, batch, batch_idx=0):
        return self.layer(batch)

    def test_step(self, batch, batch_idx):
        loss = self.predict_step(batch, batch_idx).sum()
        self.log("test_loss", loss)
        return loss


def test_a_step_that_calls_another_step_traces_that_step_as_written():
    # bug: Dynamo traced the package's wrappers of `predict_step` inside `test_step`: torch warned that it "does not
    # know how to trace the builtin `time.perf_counter`", the step had 2 graph breaks and a recompile, and the first
    # step's time was reported before the step had run
    backend = CountingBackend("calls_predict")
    trainer = Trainer(use_compile={"backend": backend}, limit_test_batches=4, **QUIET)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.test(TestCallsPredict())
    assert not [w for w in caught if "perf_counter" in str(w.message)]
    summary = last_summary(trainer)
    assert (summary.graphs, summary.recompiles, summary.graph_breaks) == (1, 0, 0)
    assert summary.compiled_steps == {"evaluation": 4}
    assert backend.calls == 4


@pytest.mark.parametrize(
    "backend", [exploding_backend, pytest.param("exploding backward", marks=needs_non_lazy_backward)]
)
def test_a_first_step_that_fails_to_compile_reports_no_time(backend, caplog):
    # bug: "the first compiled training step took 6.1 s" was logged for a step that crashed
    backend = _exploding_backward() if backend == "exploding backward" else backend
    with caplog.at_level("INFO"), pytest.raises(RuntimeError, match="could not compile"):
        Trainer(use_compile={"backend": backend, "dynamic": False}, **FIT).fit(BoringModel())
    assert "compiling the first training step" in caplog.text
    assert "step took" not in caplog.text
