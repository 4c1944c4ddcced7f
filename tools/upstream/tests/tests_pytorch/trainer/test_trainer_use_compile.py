# Copyright The Lightning AI team.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
import inspect
import json
import logging
import pickle

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.cli import _JSONARGPARSE_SIGNATURES_AVAILABLE, LightningCLI
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities.compile import from_compiled
from tests_pytorch.helpers.runif import RunIf


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from scratch: Dynamo counts its recompile limit per code object, for the whole process, and
    the step methods of ``BoringModel`` are shared by every model that earlier tests compiled."""
    torch._dynamo.reset()


_TRAINER_KWARGS = {
    "max_epochs": 1,
    "limit_train_batches": 2,
    "limit_val_batches": 2,
    "limit_test_batches": 2,
    "limit_predict_batches": 2,
    "num_sanity_val_steps": 0,
    "logger": False,
    "enable_checkpointing": False,
    "enable_model_summary": False,
    "enable_progress_bar": False,
    "accelerator": "cpu",
    "devices": 1,
}


class LoggingModel(BoringModel):
    def training_step(self, batch, batch_idx):
        loss = self.step(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        loss = self.step(batch)
        self.log("val_loss", loss)
        return loss


class CountingBackend:
    """Runs the graphs eagerly, and counts the graphs it compiled and how often they ran."""

    def __init__(self):
        self.graphs = 0
        self.calls = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1

        def run(*args):
            self.calls += 1
            return gm.forward(*args)

        return run


class GraphCallsPerStep(Callback):
    """How many compiled graphs each batch of each stage ran (a step that ran no compiled code shows 0)."""

    def __init__(self, backend):
        self.backend = backend
        self.calls = {}
        self.wrapper_types = {}

    def _start(self, trainer):
        self._before = self.backend.calls
        self.wrapper_types.setdefault(trainer.state.stage.value, type(trainer.strategy.model))

    def _end(self, trainer):
        self.calls.setdefault(trainer.state.stage.value, []).append(self.backend.calls - self._before)

    def on_train_batch_start(self, trainer, *_):
        self._start(trainer)

    def on_train_batch_end(self, trainer, *_):
        self._end(trainer)

    on_validation_batch_start = on_test_batch_start = on_predict_batch_start = on_train_batch_start
    on_validation_batch_end = on_test_batch_end = on_predict_batch_end = on_train_batch_end


def _weights(model):
    return [p.detach().clone() for p in model.parameters()]


@RunIf(dynamo=True)
def test_use_compile_in_signature():
    parameter = inspect.signature(Trainer).parameters["use_compile"]
    assert parameter.default is None
    assert "use_compile:" in Trainer.__init__.__doc__


@RunIf(min_torch="2.6", dynamo=True)
@pytest.mark.parametrize(
    ("use_compile", "error", "match"),
    [
        ("yes", TypeError, "pass `True`, `False`, `None` or a dict"),
        ({"backnd": "eager"}, ValueError, "unknown key 'backnd'. Did you mean 'backend'?"),
    ],
)
def test_use_compile_rejects_bad_input_at_construction(use_compile, error, match):
    with pytest.raises(error, match=match):
        Trainer(use_compile=use_compile)


@RunIf(max_torch="2.6")
def test_use_compile_needs_torch_2_6():
    with pytest.raises(RuntimeError, match=r"needs torch 2\.6 or newer"):
        Trainer(use_compile=True)


@RunIf(min_torch="2.6", deepspeed=True)
def test_use_compile_refuses_a_strategy_that_cannot_run_compiled():
    with pytest.raises(RuntimeError, match="incompatible with the current strategy: `DeepSpeedStrategy`"):
        Trainer(strategy="deepspeed", use_compile=True, accelerator="cpu")


@RunIf(min_torch="2.6", dynamo=True)
@pytest.mark.parametrize("strategy", ["auto", pytest.param("ddp", marks=RunIf(skip_windows=True))])
def test_use_compile_runs_every_step_compiled_after_the_strategy_wraps(tmp_path, strategy):
    seed_everything(1)
    eager_model = LoggingModel()
    Trainer(default_root_dir=tmp_path, strategy=strategy, **_TRAINER_KWARGS).fit(eager_model)

    seed_everything(1)
    model, backend = LoggingModel(), CountingBackend()
    calls = GraphCallsPerStep(backend)
    trainer = Trainer(
        default_root_dir=tmp_path,
        strategy=strategy,
        use_compile={"backend": backend},
        callbacks=[calls],
        **_TRAINER_KWARGS,
    )
    trainer.fit(model)
    # every step ran compiled code; under DDP, through the wrapper, which keeps its type
    assert all(calls.calls["train"])
    assert all(calls.calls["validate"])
    if strategy == "ddp":
        assert calls.wrapper_types["train"] is DistributedDataParallel
    for expected, actual in zip(_weights(eager_model), _weights(model), strict=True):
        torch.testing.assert_close(actual, expected)

    # outside of fit, the strategy calls the step methods directly: those run compiled
    trainer.validate(model)
    trainer.test(model)
    trainer.predict(model)
    assert all(calls.calls["test"])
    assert all(calls.calls["predict"])

    # after the run the model is plain again: its own methods, and it pickles
    assert model.training_step.__func__ is LoggingModel.training_step
    assert model.forward.__func__ is BoringModel.forward
    pickle.dumps(model)


@RunIf(min_torch="2.6", dynamo=True)
def test_use_compile_compiles_each_stage_once(tmp_path):
    model, backend = BoringModel(), CountingBackend()
    trainer = Trainer(default_root_dir=tmp_path, use_compile={"backend": backend}, **_TRAINER_KWARGS)
    trainer.fit(model)
    assert backend.graphs == 2  # the training and the validation step
    for stage in (trainer.validate, trainer.test, trainer.predict):
        before = backend.graphs
        stage(model)
        stage(model)
        assert backend.graphs == before + 1, stage.__name__


@RunIf(min_torch="2.6", dynamo=True)
def test_use_compile_passes_what_the_step_signature_takes(tmp_path):
    class NoBatchIdx(BoringModel):
        def training_step(self, batch):
            return super().training_step(batch, 0)

    model, backend = NoBatchIdx(), CountingBackend()
    model.validation_step = None  # turns validation off
    trainer = Trainer(default_root_dir=tmp_path, use_compile={"backend": backend}, **_TRAINER_KWARGS)
    trainer.fit(model)
    assert backend.calls == 2
    assert model.validation_step is None


@RunIf(min_torch="2.6", dynamo=True)
def test_use_compile_sets_no_process_wide_state(tmp_path):
    import os

    import torch._dynamo.config as dynamo_config

    # torch's first `torch.compile` in a process sets TORCHINDUCTOR_CACHE_DIR to its default: do it before the snapshot
    torch.compile(torch.nn.Linear(1, 1), backend="eager")(torch.ones(1, 1))
    config_before, environ_before = dynamo_config.get_config_copy(), dict(os.environ)
    trainer = Trainer(default_root_dir=tmp_path, use_compile={"backend": "eager"}, **_TRAINER_KWARGS)
    trainer.fit(BoringModel())
    assert dynamo_config.get_config_copy() == config_before
    assert dict(os.environ) == environ_before


class GraphCallsPerTrainingStepOfEachRank(GraphCallsPerStep):
    """Writes each process's graph calls per training batch to ``out``: ``ddp_spawn`` fits in other processes."""

    def __init__(self, backend, out):
        super().__init__(backend)
        self.out = out

    def on_fit_end(self, trainer, pl_module):
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(self.calls["train"]))


@RunIf(min_torch="2.6", dynamo=True, skip_windows=True)
def test_use_compile_runs_the_steps_compiled_on_two_processes(tmp_path):
    """DDP over 2 processes (gloo on CPU): ``ddp_spawn`` pickles the model, and each process compiles its steps."""
    backend = CountingBackend()
    calls = GraphCallsPerTrainingStepOfEachRank(backend, out=tmp_path)
    kwargs = {**_TRAINER_KWARGS, "limit_val_batches": 0, "devices": 2}
    trainer = Trainer(
        default_root_dir=tmp_path, strategy="ddp_spawn", use_compile={"backend": backend}, callbacks=[calls], **kwargs
    )
    trainer.fit(LoggingModel())
    seen = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert [len(steps) for steps in seen] == [2, 2]
    assert all(n > 0 for steps in seen for n in steps), seen  # every training step of each process ran compiled


class LRFinderTrialCalls(LoggingModel):
    """Counts the compiled graphs each training batch ran: in the model, since the finder swaps the callbacks."""

    def __init__(self, backend):
        super().__init__()
        self.backend = backend
        self.calls = []
        self.lr = 0.1  # the finder sets it

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def on_train_batch_start(self, *_):
        self._before = self.backend.calls

    def on_train_batch_end(self, *_):
        self.calls.append(self.backend.calls - self._before)


@RunIf(min_torch="2.6", dynamo=True)
def test_use_compile_compiles_before_the_hooks_that_run_steps(tmp_path):
    """The tuner's trials run in `on_fit_start`: they run compiled, as the training after them does."""
    from lightning.pytorch.callbacks import LearningRateFinder

    kwargs = {**_TRAINER_KWARGS, "limit_val_batches": 0, "limit_train_batches": 8, "max_steps": 2}
    backend = CountingBackend()
    model = LRFinderTrialCalls(backend)
    finder = LearningRateFinder(num_training_steps=4, early_stop_threshold=None)
    trainer = Trainer(default_root_dir=tmp_path, use_compile={"backend": backend}, callbacks=[finder], **kwargs)
    trainer.fit(model)
    assert finder.optimal_lr is not None
    assert len(model.calls) == 4 + 2  # the finder's trials, then the training
    assert all(model.calls), model.calls  # every batch ran compiled graphs, the finder's too


class RecordsCompiling(BoringModel):
    """Records whether each training step ran compiled."""

    def __init__(self):
        super().__init__()
        self.compiling = []

    def training_step(self, batch, batch_idx):
        self.compiling.append(torch.compiler.is_compiling())
        return super().training_step(batch, batch_idx)


@RunIf(min_torch="2.6", dynamo=True)
def test_use_compile_false_compiles_nothing(tmp_path):
    model = RecordsCompiling()
    trainer = Trainer(default_root_dir=tmp_path, use_compile=False, **_TRAINER_KWARGS)
    trainer.fit(model)
    assert model.compiling == [False, False]  # each training step ran uncompiled


@RunIf(min_torch="2.6", dynamo=True)
def test_use_compile_false_runs_a_model_compiled_by_hand_as_without_the_flag(tmp_path):
    """``False`` means the Trainer compiles nothing of its own: a YAML ``use_compile: false`` added to a script that
    passes ``torch.compile(model)`` changes nothing."""
    runs = []
    for use_compile in (None, False):
        model, backend = RecordsCompiling(), CountingBackend()
        trainer = Trainer(default_root_dir=tmp_path, use_compile=use_compile, **_TRAINER_KWARGS)
        trainer.fit(torch.compile(model, backend=backend))
        runs.append((model.compiling, backend.graphs, model._compiler_ctx is None))
    assert runs[0] == runs[1]  # what ran compiled, the graphs compiled, and the model as it is left
    assert runs[1][0] == [True, True]  # each training step ran compiled


@RunIf(min_torch="2.6", dynamo=True)
@pytest.mark.parametrize("off", ["disable", "TORCHDYNAMO_DISABLE"])
def test_use_compile_trains_uncompiled_where_torch_compiles_nothing(tmp_path, off, monkeypatch, caplog):
    """``torch.compile`` returns the module itself with ``disable=True`` and under ``TORCHDYNAMO_DISABLE=1``."""
    backend = CountingBackend()
    use_compile = {"backend": backend, "disable": True} if off == "disable" else {"backend": backend}
    if off == "TORCHDYNAMO_DISABLE":
        monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    model = RecordsCompiling()
    trainer = Trainer(default_root_dir=tmp_path, use_compile=use_compile, **_TRAINER_KWARGS)
    with caplog.at_level(logging.INFO):
        trainer.fit(model)
    assert model.compiling == [False, False]  # each training step ran uncompiled
    assert backend.graphs == 0
    assert model._compiler_ctx is None
    assert "compiling is off" in caplog.text


@RunIf(min_torch="2.6", dynamo=True)
@pytest.mark.skipif(not _JSONARGPARSE_SIGNATURES_AVAILABLE, reason="jsonargparse[signatures] is not installed")
def test_use_compile_from_a_lightning_cli_config(tmp_path):
    """What the flag serves: a config builds the model, so it cannot wrap it in ``torch.compile`` itself."""
    config = tmp_path / "compile.yaml"
    config.write_text("trainer:\n  use_compile:\n    backend: eager\n    dynamic: false\n")
    limits = [f"--trainer.{key}={value}" for key, value in {**_TRAINER_KWARGS, "default_root_dir": tmp_path}.items()]
    cli = LightningCLI(RecordsCompiling, run=False, args=["--config", str(config), *limits])
    assert cli.config.trainer.use_compile == {"backend": "eager", "dynamic": False}
    cli.trainer.fit(cli.model)
    assert cli.model.compiling == [True, True]  # each training step ran compiled
    assert LightningCLI(BoringModel, run=False, args=["--trainer.use_compile=true"]).config.trainer.use_compile is True


@RunIf(min_torch="2.6", dynamo=True)
@pytest.mark.parametrize("default", [{"fullgraph": False}, {"mode": "default"}])
def test_use_compile_takes_a_model_compiled_with_the_same_arguments(tmp_path, default):
    backend = CountingBackend()
    compiled = torch.compile(BoringModel(), backend=backend, **default)  # torch.compile's default: the same arguments
    trainer = Trainer(default_root_dir=tmp_path, use_compile={"backend": backend}, **_TRAINER_KWARGS)
    trainer.fit(compiled)
    assert backend.graphs == 2  # once, after the wrap: the training and the validation step


@RunIf(min_torch="2.6", dynamo=True)
@pytest.mark.parametrize(("by_hand", "use_compile"), [({}, {"backend": "inductor"}), ({"backend": "inductor"}, True)])
def test_use_compile_takes_torch_compiles_default_backend_named_or_not(tmp_path, by_hand, use_compile):
    """Inductor is ``torch.compile``'s default backend, named or not (torch 2.13's signature says ``None``)."""
    trainer = Trainer(default_root_dir=tmp_path, use_compile=use_compile, **{**_TRAINER_KWARGS, "max_steps": 0})
    trainer.fit(torch.compile(BoringModel(), **by_hand))  # no step runs, so nothing is compiled
    assert trainer.state.finished


def _compiled_before_lightning_was_imported(model):
    uncaptured = torch.compile
    while getattr(uncaptured.__code__, "co_name", None) == "_capture":  # Fabric's wrapper, as if not yet imported
        uncaptured = uncaptured.__wrapped__
    return uncaptured(model, backend="eager")


@RunIf(min_torch="2.6", dynamo=True)
@pytest.mark.parametrize(
    ("compile_by_hand", "match"),
    [
        (lambda model: torch.compile(model, backend="aot_eager"), r"\(model, \*\*\{'backend': 'aot_eager'\}\)"),
        (_compiled_before_lightning_was_imported, "compiled before `lightning` was imported"),
        (lambda model: from_compiled(torch.compile(model, backend="eager")), "compiled with `from_compiled`"),
    ],
)
def test_use_compile_refuses_a_model_compiled_otherwise(tmp_path, compile_by_hand, match):
    """Before the run: which of the two compiles to run is not guessed."""
    model = BoringModel()
    weights = _weights(model)
    trainer = Trainer(default_root_dir=tmp_path, use_compile={"backend": "eager"}, **_TRAINER_KWARGS)
    with pytest.raises(ValueError, match=f"{match}.*asks for a compile of its own. Pass the uncompiled model"):
        trainer.fit(compile_by_hand(model))
    assert trainer.global_step == 0
    for expected, actual in zip(weights, _weights(model), strict=True):
        torch.testing.assert_close(actual, expected)


@RunIf(min_torch="2.6", dynamo=True)
@pytest.mark.parametrize(
    ("use_compile", "error", "match"),
    [
        ({"backend": "indcutor"}, ValueError, r"refuses.*'indcutor'.*Did you mean 'inductor'\?"),
        ({"backend": 3}, TypeError, "must be a backend name or a callable"),
        ({"fullgraph": "yes"}, TypeError, "must be a bool"),
        ({"mode": "fast"}, ValueError, "refuses.*mode=fast"),
        ({"mode": "max-autotune", "options": {}}, ValueError, "refuses.*mode or options"),
        ({"options": {"max_autotun": True}}, ValueError, "refuses.*option max_autotun"),
    ],
)
def test_use_compile_checks_the_torch_compile_arguments_at_construction(use_compile, error, match):
    with pytest.raises(error, match=match):
        Trainer(use_compile=use_compile)


@RunIf(min_torch="2.6", dynamo=True)
def test_use_compile_accepts_what_torch_compile_accepts():
    Trainer(use_compile={"options": {"max_autotune": True, "epilogue_fusion": False}})
    Trainer(use_compile={"mode": "max-autotune-no-cudagraphs", "dynamic": False})


@RunIf(min_cuda_gpus=2, standalone=True, min_torch="2.6", dynamo=True)
def test_use_compile_ddp_multi_gpu(tmp_path):
    backend = CountingBackend()
    calls = GraphCallsPerStep(backend)
    trainer = Trainer(
        default_root_dir=tmp_path,
        strategy="ddp",
        accelerator="cuda",
        devices=2,
        use_compile={"backend": backend},
        callbacks=[calls],
        max_steps=2,
        enable_progress_bar=False,
    )
    trainer.fit(LoggingModel())
    assert calls.wrapper_types["train"] is DistributedDataParallel
    assert all(calls.calls["train"])


class LockedBackend(CountingBackend):
    """A backend that holds a lock, so it cannot be deep-copied (as a profiler or a compile cache may)."""

    def __init__(self):
        super().__init__()
        import threading

        self.lock = threading.Lock()

    def __deepcopy__(self, memo):
        raise TypeError("cannot pickle '_thread.lock' object")


@RunIf(min_torch="2.6", dynamo=True)
def test_use_compile_leaves_nothing_on_the_model_and_copies_no_argument(tmp_path):
    backend = LockedBackend()
    model = BoringModel()
    trainer = Trainer(default_root_dir=tmp_path, use_compile={"backend": backend}, **_TRAINER_KWARGS)
    trainer.fit(model)  # Fabric's capture of `torch.compile`'s arguments deep-copied them: TypeError
    assert backend.calls > 0
    assert "_compile_kwargs" not in model.__dict__  # it kept a record of the Trainer's own compile
