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
"""A `torch.compile`-d model passed to the Trainer is compiled again, with the same arguments, after the strategy's
setup: its steps, which the strategy runs directly or inside its wrapper."""

import inspect
import json

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import LearningRateFinder
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.strategies import ModelParallelStrategy
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


class IsCompilingInWrapperForward(Callback):
    """Records, at each call of the strategy's model (the DDP wrapper while fitting), whether it runs compiled."""

    def __init__(self):
        self.seen = []

    def on_fit_start(self, trainer, pl_module):
        # `torch.compiler.is_compiling` from torch 2.3
        is_compiling = getattr(torch.compiler, "is_compiling", None) or torch._dynamo.is_compiling
        trainer.strategy.model.register_forward_pre_hook(lambda *_: self.seen.append(is_compiling()))


class GraphCallsPerTrainingStepOfEachRank(GraphCallsPerStep):
    """Writes each process's graph calls per training batch to ``out``: ``ddp_spawn`` fits in other processes."""

    def __init__(self, backend, out):
        super().__init__(backend)
        self.out = out

    def on_fit_end(self, trainer, pl_module):
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(self.calls["train"]))


@RunIf(dynamo=True)
@pytest.mark.parametrize("strategy", ["auto", pytest.param("ddp", marks=RunIf(skip_windows=True))])
def test_compiled_model_runs_every_step_compiled_after_the_strategy_wraps(tmp_path, strategy):
    seed_everything(1)
    eager_model = BoringModel()
    Trainer(default_root_dir=tmp_path, strategy=strategy, **_TRAINER_KWARGS).fit(eager_model)

    seed_everything(1)
    model, backend = BoringModel(), CountingBackend()
    calls = GraphCallsPerStep(backend)
    trainer = Trainer(default_root_dir=tmp_path, strategy=strategy, callbacks=[calls], **_TRAINER_KWARGS)
    trainer.fit(torch.compile(model, backend=backend))
    assert all(calls.calls["train"])
    assert all(calls.calls["validate"])
    if strategy == "ddp":
        assert calls.wrapper_types["train"] is DistributedDataParallel  # the steps run compiled inside the wrapper
    for expected, actual in zip(eager_model.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(actual, expected)


@RunIf(dynamo=True, skip_windows=True)
def test_under_ddp_the_steps_run_compiled_inside_the_wrapper(tmp_path):
    """The strategy runs each step through the DDP wrapper's call, which runs as Python (a forward pre-hook on it never
    sees ``is_compiling()``): the step inside it runs its compiled graph."""
    backend = CountingBackend()
    calls, probe = GraphCallsPerStep(backend), IsCompilingInWrapperForward()
    kwargs = {**_TRAINER_KWARGS, "limit_val_batches": 0}
    trainer = Trainer(default_root_dir=tmp_path, strategy="ddp", callbacks=[calls, probe], **kwargs)
    trainer.fit(torch.compile(BoringModel(), backend=backend))
    assert probe.seen == [False, False]
    assert calls.calls["train"] == [1, 1]


@RunIf(dynamo=True, skip_windows=True)
def test_the_steps_run_compiled_on_two_processes(tmp_path):
    """As #20269's tests did on 2 GPUs: DDP over 2 processes (gloo on CPU), each running its steps compiled.

    ``ddp_spawn`` pickles the model for its processes: a compiled one failed to pickle before the re-apply, since
    ``fit`` compiled the steps on the model before the spawn.

    """
    backend = CountingBackend()
    calls = GraphCallsPerTrainingStepOfEachRank(backend, out=tmp_path)
    kwargs = {**_TRAINER_KWARGS, "limit_val_batches": 0, "devices": 2}
    trainer = Trainer(default_root_dir=tmp_path, strategy="ddp_spawn", callbacks=[calls], **kwargs)
    trainer.fit(torch.compile(BoringModel(), backend=backend))
    seen = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert seen == [[1, 1], [1, 1]]


@RunIf(dynamo=True)
def test_each_stage_compiles_its_step_once(tmp_path):
    model, backend = BoringModel(), CountingBackend()
    compiled = torch.compile(model, backend=backend)
    trainer = Trainer(default_root_dir=tmp_path, **_TRAINER_KWARGS)
    trainer.fit(compiled)
    assert backend.graphs == 2  # the training and the validation step
    for stage in (trainer.validate, trainer.test, trainer.predict):
        stage(compiled)
        first = backend.graphs
        stage(compiled)  # compiled afresh, from the same steps: it reuses what the first compiled
        assert backend.graphs == first, stage.__name__


class LRFinderTrialCalls(BoringModel):
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


@RunIf(dynamo=True)
@pytest.mark.parametrize("strategy", ["auto", pytest.param("ddp", marks=RunIf(skip_windows=True))])
def test_the_tuner_trials_run_compiled(tmp_path, strategy):
    """The tuner's trials run in `on_fit_start`: they run compiled, as the training after them does."""
    kwargs = {**_TRAINER_KWARGS, "limit_val_batches": 0, "limit_train_batches": 8, "max_steps": 2}
    backend = CountingBackend()
    model = LRFinderTrialCalls(backend)
    finder = LearningRateFinder(num_training_steps=4, early_stop_threshold=None)
    trainer = Trainer(default_root_dir=tmp_path, strategy=strategy, callbacks=[finder], **kwargs)
    trainer.fit(torch.compile(model, backend=backend))
    assert finder.optimal_lr is not None
    assert len(model.calls) == 4 + 2  # the finder's trials, then the training
    assert all(model.calls), model.calls  # every batch ran compiled graphs, the finder's too


class CompiledFromItsOwnSteps(Callback):
    """Records, at the start of each fit, whether the training step compiled is the model's own method."""

    def __init__(self):
        self.seen = []

    def on_train_start(self, trainer, pl_module):
        original = pl_module._compiler_ctx["original_training_step"]
        self.seen.append(getattr(original, "__func__", None) is type(pl_module).training_step)


@RunIf(dynamo=True)
@pytest.mark.parametrize("strategy", ["auto", pytest.param("ddp", marks=RunIf(skip_windows=True))])
def test_a_model_passed_compiled_again_is_compiled_from_its_own_steps(tmp_path, strategy):
    """Master compiled the model's compiled steps over again when it was passed compiled a second time."""
    model, backend, probe = BoringModel(), CountingBackend(), CompiledFromItsOwnSteps()
    for _ in range(2):
        calls = GraphCallsPerStep(backend)
        trainer = Trainer(default_root_dir=tmp_path, strategy=strategy, callbacks=[calls, probe], **_TRAINER_KWARGS)
        trainer.fit(torch.compile(model, backend=backend))
        assert all(calls.calls["train"])
    assert probe.seen == [True, True]


@RunIf(dynamo=True)
def test_a_module_compiled_twice_runs_the_compile_passed_in(tmp_path):
    """From torch 2.6 the module inside keeps the arguments of its latest compile: they are not the ones used."""
    model, first, second = BoringModel(), CountingBackend(), CountingBackend()
    compiled = torch.compile(model, backend=first)
    torch.compile(model, backend=second)
    Trainer(default_root_dir=tmp_path, **_TRAINER_KWARGS).fit(compiled)
    assert (first.graphs, second.graphs) == (2, 0)


@RunIf(dynamo=True)
def test_a_plain_model_passed_after_a_compiled_one_runs_plain(tmp_path):
    backend = CountingBackend()
    calls = GraphCallsPerStep(backend)
    trainer = Trainer(default_root_dir=tmp_path, callbacks=[calls], **_TRAINER_KWARGS)
    trainer.fit(torch.compile(BoringModel(), backend=backend))
    trainer.validate(BoringModel())
    assert calls.calls["validate"] == [1, 1, 0, 0]  # fit's validation, then the plain model's


@RunIf(dynamo=True)
def test_a_model_compiled_before_lightning_was_imported_is_compiled_when_passed_in_with_a_warning(tmp_path):
    """Its arguments are unknown, so it cannot be compiled again: its steps are compiled when it is passed in, as on
    master."""
    model, backend = BoringModel(), CountingBackend()
    calls = GraphCallsPerStep(backend)
    compiled = inspect.unwrap(torch.compile)(model, backend=backend)  # `torch.compile` without Lightning's capture
    trainer = Trainer(default_root_dir=tmp_path, callbacks=[calls], **_TRAINER_KWARGS)
    with pytest.warns(UserWarning, match="compiled before `lightning` was imported"):
        trainer.fit(compiled)
    assert all(calls.calls["train"])


@RunIf(dynamo=True, min_torch="2.4")
def test_a_strategy_that_cannot_run_a_compiled_model_refuses_it_as_before(tmp_path):
    """The model is unwrapped, so it is not compiled yet when Lightning checks the strategy: it is checked there."""
    trainer = Trainer(default_root_dir=tmp_path, strategy=ModelParallelStrategy(), **_TRAINER_KWARGS)
    with pytest.raises(RuntimeError, match="incompatible with the current strategy: `ModelParallelStrategy`"):
        trainer.fit(torch.compile(BoringModel(), backend="eager"))


@RunIf(dynamo=True)
def test_a_compiled_module_that_is_not_a_lightning_module_is_refused_as_before(tmp_path):
    trainer = Trainer(default_root_dir=tmp_path, **_TRAINER_KWARGS)
    with pytest.raises(ValueError, match="expected to be a compiled LightningModule"):
        trainer.fit(torch.compile(torch.nn.Linear(32, 2), backend="eager"))


@RunIf(min_cuda_gpus=2, standalone=True, dynamo=True)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_compiled_model_runs_compiled_after_the_wrap_on_two_gpus(tmp_path, strategy):
    backend = CountingBackend()
    calls = GraphCallsPerStep(backend)
    trainer = Trainer(
        default_root_dir=tmp_path,
        strategy=strategy,
        accelerator="cuda",
        devices=2,
        callbacks=[calls],
        max_steps=2,
        enable_progress_bar=False,
    )
    trainer.fit(torch.compile(BoringModel(), backend=backend))
    assert all(calls.calls["train"])
