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
"""Under ``strategy="ddp_spawn"``, which pickles the model for its processes, a `torch.compile`-d model passed to the
Trainer is unwrapped before the launch, and each process compiles its steps after the strategy's setup.

Under any other launcher Lightning compiles the steps when the model is passed in, as before; a model passed compiled a
second time has its own steps compiled, not its compiled ones.

"""

import inspect
import json
import pickle
import warnings

import pytest
import torch

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import LearningRateFinder
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities.compile import to_uncompiled
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
    "num_sanity_val_steps": 0,
    "logger": False,
    "enable_checkpointing": False,
    "enable_model_summary": False,
    "enable_progress_bar": False,
    "accelerator": "cpu",
    "devices": 1,
}
#: DDP over 2 processes (gloo on CPU)
_TWO_PROCESSES = {**_TRAINER_KWARGS, "limit_val_batches": 0, "devices": 2}


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


class GraphCallsOfEachRank(BoringModel):
    """Counts the compiled graphs each training and test batch ran, and writes them to ``out`` at the end of each
    stage, in each process: the processes run the stages.

    In the model, since the tuner swaps the callbacks.

    """

    def __init__(self, backend, out):
        super().__init__()
        self.backend = backend
        self.out = out
        self.calls = {}
        self.lr = 0.1  # the tuner sets it

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def on_train_batch_start(self, *_):
        self._before = self.backend.calls

    def on_train_batch_end(self, *_):
        self.calls.setdefault(self.trainer.state.stage.value, []).append(self.backend.calls - self._before)

    on_test_batch_start = on_train_batch_start
    on_test_batch_end = on_train_batch_end

    def teardown(self, stage):
        (self.out / f"rank{self.global_rank}.json").write_text(json.dumps(self.calls))

    def seen(self):
        return [json.loads((self.out / f"rank{rank}.json").read_text()) for rank in range(2)]


@RunIf(dynamo=True, skip_windows=True)
def test_ddp_spawn_runs_a_compiled_model_compiled_in_each_process(tmp_path):
    """``ddp_spawn`` pickles the model, and master compiled its steps before the launch: "Can't pickle
    BoringModel.forward".

    Each process compiles them before any hook runs a step: the tuner's trials run compiled.

    """
    model = GraphCallsOfEachRank(CountingBackend(), out=tmp_path)
    finder = LearningRateFinder(num_training_steps=2, early_stop_threshold=None)
    kwargs = {**_TWO_PROCESSES, "limit_train_batches": 4, "max_steps": 2}
    trainer = Trainer(default_root_dir=tmp_path, strategy="ddp_spawn", callbacks=[finder], **kwargs)
    trainer.fit(torch.compile(model, backend=model.backend))
    assert model.seen() == [{"train": [1] * (2 + 2)}] * 2  # the finder's trials, then the training


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
        trainer = Trainer(default_root_dir=tmp_path, strategy=strategy, callbacks=[probe], **_TRAINER_KWARGS)
        trainer.fit(torch.compile(model, backend=backend))
    assert probe.seen == [True, True]
    assert to_uncompiled(model).training_step.__func__ is BoringModel.training_step


@RunIf(dynamo=True, skip_windows=True)
def test_unknown_compile_arguments_warn_only_where_the_launcher_pickles_the_model(tmp_path):
    """Compiled before ``lightning`` was imported, a model cannot be compiled again in each process: its steps are
    compiled as it is passed in, as on master, and ``ddp_spawn`` cannot pickle them.

    Elsewhere nothing changes.

    """
    uncaptured = inspect.unwrap(torch.compile)  # `torch.compile` without Lightning's capture of its arguments
    backend = CountingBackend()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(default_root_dir=tmp_path, **_TRAINER_KWARGS).fit(uncaptured(BoringModel(), backend=backend))
    assert backend.calls > 0
    assert not [w for w in caught if "arguments are unknown" in str(w.message)]

    trainer = Trainer(default_root_dir=tmp_path, strategy="ddp_spawn", **_TWO_PROCESSES)
    with (
        pytest.warns(UserWarning, match="arguments are unknown.*cannot pickle them"),
        pytest.raises((pickle.PicklingError, AttributeError), match="Can't pickle"),
    ):
        trainer.fit(uncaptured(BoringModel(), backend="eager"))


@RunIf(dynamo=True, skip_windows=True)
def test_ddp_fork_tests_the_model_compiled_after_fit_as_before(tmp_path):
    """``ddp_fork`` does not pickle the model: its steps are compiled before the launch, and stay compiled, so a later
    stage passed the same LightningModule runs it compiled on each rank."""
    model = GraphCallsOfEachRank(CountingBackend(), out=tmp_path)
    trainer = Trainer(default_root_dir=tmp_path, strategy="ddp_fork", **_TWO_PROCESSES)
    trainer.fit(torch.compile(model, backend=model.backend))
    trainer.test(model)
    assert model.seen() == [{"test": [1, 1]}] * 2


@RunIf(dynamo=True, skip_windows=True)
def test_ddp_spawn_tests_the_model_passed_compiled_to_fit_compiled_as_ddp_fork_does(tmp_path):
    """The main process's model stays plain under ``ddp_spawn``: passed again to a later stage, it is the model that
    was passed compiled, and each process compiles its steps, as ``ddp_fork`` and one device run it compiled."""
    model = GraphCallsOfEachRank(CountingBackend(), out=tmp_path)
    trainer = Trainer(default_root_dir=tmp_path, strategy="ddp_spawn", **_TWO_PROCESSES)
    trainer.fit(torch.compile(model, backend=model.backend))
    trainer.test(model)
    assert model.seen() == [{"test": [1, 1]}] * 2
    (tmp_path / "other").mkdir()
    other = GraphCallsOfEachRank(model.backend, out=tmp_path / "other")
    trainer.test(other)  # another model, passed plain, runs plain
    assert other.seen() == [{"test": [0, 0]}] * 2


@RunIf(dynamo=True, skip_windows=True)
def test_ddp_fork_leaves_the_model_compiled_after_fit_as_before(tmp_path):
    model = BoringModel()
    trainer = Trainer(default_root_dir=tmp_path, strategy="ddp_fork", **_TWO_PROCESSES)
    trainer.fit(torch.compile(model, backend="eager"))
    assert to_uncompiled(model) is model  # its steps, compiled before the fork, made plain
    assert model._compiler_ctx is None
