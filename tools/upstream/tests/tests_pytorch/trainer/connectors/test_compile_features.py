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
import copy
import os
import pickle
import types

import pytest
import torch

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.trainer.connectors import compile_connector
from lightning.pytorch.trainer.connectors.compile_connector import _CompileConnector
from lightning.pytorch.trainer.connectors.compile_features import _CompileFeature
from lightning.pytorch.trainer.connectors.compile_features._run import _CompileRun
from tests_pytorch.helpers.runif import RunIf

# `Trainer(use_compile=...)` needs torch 2.6
pytestmark = RunIf(min_torch="2.6", dynamo=True)

_TRAINER_KWARGS = {
    "max_steps": 1,
    "limit_val_batches": 0,
    "logger": False,
    "enable_checkpointing": False,
    "enable_model_summary": False,
    "enable_progress_bar": False,
    "accelerator": "cpu",
    "devices": 1,
}
_TARGET = types.SimpleNamespace(value="before")


class _Probe(_CompileFeature):
    """Changes one attribute for the run, one for what is compiled, and an environment variable."""

    keys = {"probe": "a feature for the tests"}
    seen: list = []

    def on_run_start(self, run, model):
        run.replace(_TARGET, "value", "during the run", scope="run")
        run.setenv("LIGHTNING_COMPILE_PROBE", "1")
        type(self).seen.append(("on_run_start", dict(run.run_kwargs)))

    def compile_kwargs(self, run, kwargs):
        return {**kwargs, "dynamic": False}

    def teardown(self, run):
        type(self).seen.append(("teardown", _TARGET.value))


class _RecordDuringFit(Callback):
    def on_train_batch_start(self, *_):
        self.value, self.env = _TARGET.value, os.environ.get("LIGHTNING_COMPILE_PROBE")


@pytest.fixture
def probe(monkeypatch):
    monkeypatch.setattr(compile_connector, "_feature_classes", lambda: (_Probe,))
    _Probe.seen = []
    return _Probe


def test_a_feature_is_built_only_when_its_key_is_set(probe):
    assert Trainer(use_compile=True)._compile_connector.features == []
    assert Trainer(use_compile={"probe": None})._compile_connector.features == []
    [feature] = Trainer(use_compile={"probe": True})._compile_connector.features
    assert isinstance(feature, _Probe)
    with pytest.raises(ValueError, match=r"unknown key 'prob'\. Did you mean 'probe'"):
        Trainer(use_compile={"prob": True})


def test_a_feature_refuses_the_values_of_another_key_it_cannot_run_with(monkeypatch):
    class _Picky(_CompileFeature):
        keys = {"picky": "a feature for the tests"}
        runs_with = {"other": ((None, "fine"), "the picky feature cannot run with it")}

    class _Other(_CompileFeature):
        keys = {"other": "another feature for the tests"}

    monkeypatch.setattr(compile_connector, "_feature_classes", lambda: (_Picky, _Other))
    Trainer(use_compile={"picky": True, "other": "fine"})
    Trainer(use_compile={"other": "wrong"})  # the picky feature is off
    with pytest.raises(ValueError, match=r"'other': 'wrong'}\)` cannot be combined: the picky feature cannot run with"):
        Trainer(use_compile={"picky": True, "other": "wrong"})


def test_the_features_hooks_run_in_the_order_of_the_features_list():
    import importlib.util

    from lightning.pytorch.trainer.connectors import compile_features

    listed = [f"{compile_features.__name__}.{name}" for name in compile_features.FEATURES]
    present = [name for name in listed if importlib.util.find_spec(name) is not None]  # the patches this fork took
    assert [cls.__module__ for cls in compile_connector._feature_classes()] == present


def test_a_listed_feature_whose_patch_this_lightning_lacks_is_left_out(monkeypatch):
    from lightning.pytorch.trainer.connectors import compile_features

    monkeypatch.setattr(compile_features, "FEATURES", (*compile_features.FEATURES, "not_taken"))
    compile_connector._feature_classes.cache_clear()
    try:
        modules = [cls.__module__.rpartition(".")[2] for cls in compile_connector._feature_classes()]
    finally:
        compile_connector._feature_classes.cache_clear()
    assert "not_taken" not in modules


def test_defaults_turn_a_feature_on_for_every_use_compile_but_not_for_a_compiled_model(probe, monkeypatch, tmp_path):
    monkeypatch.setattr(_CompileConnector, "defaults", {"probe": True})
    assert len(Trainer(use_compile=True)._compile_connector.features) == 1
    assert Trainer(use_compile={"probe": False})._compile_connector.features == []  # the user's key wins
    trainer = Trainer(default_root_dir=tmp_path, **_TRAINER_KWARGS)
    trainer.fit(torch.compile(BoringModel(), backend="eager"))
    assert trainer._compile_connector.features == []
    assert probe.seen == []


def test_a_compiled_model_passed_in_gets_no_reset_of_shared_code_without_use_compile(monkeypatch, tmp_path):
    resets = []
    monkeypatch.setattr(_CompileRun, "reset_crowded_code_at_end", lambda run, model: resets.append(model))
    Trainer(default_root_dir=tmp_path, **_TRAINER_KWARGS).fit(torch.compile(BoringModel(), backend="eager"))
    assert resets == []  # Lightning's own compile of the model, and nothing more
    model = BoringModel()
    Trainer(default_root_dir=tmp_path, use_compile={"backend": "eager"}, **_TRAINER_KWARGS).fit(model)
    assert resets == [model]


def test_what_a_feature_changes_is_undone_after_the_run(probe, tmp_path):
    record = _RecordDuringFit()
    use_compile = {"backend": "eager", "probe": True}
    trainer = Trainer(default_root_dir=tmp_path, use_compile=use_compile, callbacks=[record], **_TRAINER_KWARGS)
    trainer.fit(BoringModel())
    assert (record.value, record.env) == ("during the run", "1")
    assert _TARGET.value == "before"
    assert "LIGHTNING_COMPILE_PROBE" not in os.environ
    assert probe.seen[-1] == ("teardown", "during the run")  # features end first, the run's settings after them


def test_replace_puts_back_an_instances_class_and_deletes_what_it_added_to_a_class(tmp_path):
    class Base:
        def step(self):
            return "base"

    class Own(Base):
        pass

    class Swapped(Own):
        pass

    obj = Own()
    connector = Trainer(default_root_dir=tmp_path, use_compile=True, **_TRAINER_KWARGS)._compile_connector
    run = _CompileRun(connector.trainer, True, connector.options, {}, [])
    run.replace(Own, "step", lambda self: "for the run")  # inherited: added to `Own` for the run
    run.replace(obj, "__class__", Swapped)  # held by `object`'s descriptor: its value comes back
    run.replace(obj, "extra", 1, scope="run")  # absent before
    assert (obj.step(), type(obj), obj.extra) == ("for the run", Swapped, 1)
    run.end()
    assert (obj.step(), type(obj)) == ("base", Own)
    assert "step" not in vars(Own)
    assert not hasattr(obj, "extra")


def test_a_model_pickled_or_copied_during_the_run_is_the_model_as_it_was_before(tmp_path):
    # a checkpoint callback or an EMA callback copies the model mid-run: the compiled steps, and what a feature replaced
    # on it, can neither be pickled nor act on the copy
    copies = []

    class CopyTheModel(Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            trainer._compile_connector.run.replace(pl_module, "feature_attribute", lambda: None)
            copies.extend([pickle.loads(pickle.dumps(pl_module)), copy.deepcopy(pl_module)])

    model = BoringModel()
    trainer = Trainer(
        default_root_dir=tmp_path, use_compile={"backend": "eager"}, callbacks=[CopyTheModel()], **_TRAINER_KWARGS
    )
    trainer.fit(model)
    assert len(copies) == 2
    for copied in copies:
        assert copied._compiler_ctx is None
        assert not {"training_step", "forward", "feature_attribute", "__getstate__"} & set(vars(copied))
    assert "__getstate__" not in vars(model)


def test_a_step_called_from_a_traced_step_is_traced_as_written(monkeypatch, tmp_path):
    # `test_step` calling `self.predict_step` traced the features' wrappers of `predict_step` into the graph
    calls = []

    class _CountsCalls(_CompileFeature):
        keys = {"counts_calls": "a feature for the tests"}

        def wrap(self, run, compiled, original):
            def counted(*args, **kwargs):
                calls.append(original.__name__)
                return compiled(*args, **kwargs)

            return counted

    class CallsPredict(BoringModel):
        def predict_step(self, batch, batch_idx=0):
            return self.layer(batch)

        def test_step(self, batch, batch_idx):
            return self.predict_step(batch).sum()

    monkeypatch.setattr(compile_connector, "_feature_classes", lambda: (_CountsCalls,))
    use_compile = {"backend": "eager", "counts_calls": True}
    trainer = Trainer(default_root_dir=tmp_path, use_compile=use_compile, limit_test_batches=2, **_TRAINER_KWARGS)
    trainer.test(CallsPredict())
    assert calls == ["test_step", "test_step"]


def test_a_feature_derives_the_run_arguments_as_a_new_value(probe, tmp_path):
    trainer = Trainer(default_root_dir=tmp_path, use_compile={"backend": "eager", "probe": True}, **_TRAINER_KWARGS)
    connector = trainer._compile_connector
    connector.on_run_start(BoringModel())
    assert dict(connector.run.run_kwargs) == {"backend": "eager", "dynamic": False}
    assert dict(connector.options.torch_kwargs) == {"backend": "eager"}  # what was given stays as it was
    with pytest.raises(TypeError, match="are a value"):
        connector.run.run_kwargs["dynamic"] = True
    connector.teardown()


def test_one_compiled_run_at_a_time_per_process(probe, tmp_path):
    first = Trainer(default_root_dir=tmp_path, use_compile={"backend": "eager", "probe": True}, **_TRAINER_KWARGS)

    class StartAnother(Callback):
        def on_train_start(self, trainer, pl_module):
            use_compile = {"backend": "eager", "probe": True}
            second = Trainer(default_root_dir=tmp_path, use_compile=use_compile, **_TRAINER_KWARGS)
            with pytest.raises(RuntimeError, match="another Trainer's compiled run is in progress"):
                second.fit(BoringModel())
            # without a feature, nothing process-wide is changed, and a compiled run may start meanwhile
            third = Trainer(default_root_dir=tmp_path, **_TRAINER_KWARGS)
            third.fit(torch.compile(BoringModel(), backend="eager"))

    first.callbacks.append(StartAnother())
    first.fit(BoringModel())
    Trainer(default_root_dir=tmp_path, use_compile={"backend": "eager"}, **_TRAINER_KWARGS).fit(BoringModel())


# The wrapper's compile: under DDP's python reducer the fork also compiles DDP's whole call, to train, around the steps
# it compiles on the module, as everywhere else; the re-apply and `use_compile` compile the steps inside the wrapper.

_DDP_KWARGS = {**_TRAINER_KWARGS, "max_steps": -1, "max_epochs": 1, "limit_train_batches": 2, "strategy": "ddp"}


@pytest.fixture
def fresh_dynamo():
    """Compiles from scratch: the earlier tests' fits of ``BoringModel`` count toward the same recompile limit."""
    torch._dynamo.reset()


class CountingBackend:
    """Runs the graphs eagerly, and counts how often they ran."""

    def __init__(self):
        self.calls = 0

    def __call__(self, gm, example_inputs):
        def run(*args):
            self.calls += 1
            return gm.forward(*args)

        return run


class IsCompilingInWrapperForward(Callback):
    """Records, at each call of the strategy's model (the DDP wrapper while fitting), whether it runs compiled."""

    def __init__(self):
        self.seen = []

    def on_fit_start(self, trainer, pl_module):
        trainer.strategy.model.register_forward_pre_hook(lambda *_: self.seen.append(torch.compiler.is_compiling()))


@RunIf(skip_windows=True)
@pytest.mark.parametrize("python_reducer", [False, True])
def test_ddp_s_call_is_compiled_under_its_python_reducer_only(fresh_dynamo, tmp_path, python_reducer):
    """A forward pre-hook on the DDP wrapper sees ``is_compiling()`` where DDP runs its python reducer, which traces
    DDP's forward with the step; under its C++ reducer the steps are compiled inside the wrapper, as without the seam.

    A compiled model passed in without ``use_compile`` gets the re-apply alone: its steps compiled inside it.

    """
    setting = "python_reducer" if python_reducer else torch._dynamo.config.optimize_ddp
    with (
        torch._dynamo.config.patch(optimize_ddp=setting),
        torch._inductor.config.patch(
            _fuse_ddp_communication=torch._inductor.config._fuse_ddp_communication,
            _fuse_ddp_bucket_size=torch._inductor.config._fuse_ddp_bucket_size,
        ),
    ):
        probe = IsCompilingInWrapperForward()
        trainer = Trainer(default_root_dir=tmp_path, use_compile={"backend": "eager"}, callbacks=[probe], **_DDP_KWARGS)
        trainer.fit(BoringModel())
        assert probe.seen == [python_reducer] * 2
        assert "_compiled_call_impl" not in vars(trainer.strategy.model)  # undone after the run

        probe = IsCompilingInWrapperForward()
        trainer = Trainer(default_root_dir=tmp_path, callbacks=[probe], **_DDP_KWARGS)
        trainer.fit(torch.compile(BoringModel(), backend="eager"))
        assert probe.seen == [False, False]
    if python_reducer:  # what building DDP under its python reducer adds for the process
        torch._dynamo.trace_rules.LEGACY_MOD_INLINELIST.discard("torch.nn.parallel.distributed")
        torch._dynamo.trace_rules.get_legacy_mod_inlinelist.cache_clear()


def test_the_wrapper_is_uncompiled_where_module_compile_keeps_its_compiled_call():
    """The Trainer undoes ``nn.Module.compile`` on the wrapper by removing its ``_compiled_call_impl``: torch has no
    public way to uncompile, so this fails first if torch renames the attribute."""
    module = torch.nn.Linear(1, 1)
    module.compile(backend="eager")
    assert callable(vars(module)["_compiled_call_impl"])
    module.__dict__.pop("_compiled_call_impl")
    assert module._compiled_call_impl is None  # the class's default: the module's calls run its forward uncompiled


def _compiled_calls_per_fit_of_ten_widths(tmp_path, backend, callbacks=()):
    """A sweep in one process: 10 fits of 10 widths under DDP, the 9th past the default recompile limit of 8."""
    calls = []
    for width in range(8, 18):
        model = BoringModel()
        model.layer = torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.Linear(width, 2))
        before = backend.calls
        use_compile = {"backend": backend}
        Trainer(default_root_dir=tmp_path, use_compile=use_compile, callbacks=list(callbacks), **_DDP_KWARGS).fit(model)
        calls.append(backend.calls - before)
    return calls


@RunIf(skip_windows=True)
def test_a_process_that_fits_many_models_compiles_every_fit(fresh_dynamo, tmp_path):
    """Each fit of a sweep adds entries to the code every fit shares (the model class's steps, Lightning's and torch's
    code); a run that grew them past half of the recompile limit resets them, so the 9th fit is compiled too."""
    calls = _compiled_calls_per_fit_of_ten_widths(tmp_path, CountingBackend())
    assert all(n >= 2 for n in calls), calls  # each training step ran a compiled graph, in every fit


@RunIf(skip_windows=True)
def test_fullgraph_under_ddp_s_python_reducer_compiles_the_steps_inside_it(fresh_dynamo, tmp_path):
    """Under DDP's python reducer the seam compiles DDP's call, but not with `fullgraph=True`: the steps compile."""
    backend = CountingBackend()
    probe = IsCompilingInWrapperForward()
    use_compile = {"backend": backend, "fullgraph": True}
    trainer = Trainer(default_root_dir=tmp_path, use_compile=use_compile, callbacks=[probe], **_DDP_KWARGS)
    with (
        torch._dynamo.config.patch(optimize_ddp="python_reducer"),
        torch._inductor.config.patch(
            _fuse_ddp_communication=torch._inductor.config._fuse_ddp_communication,
            _fuse_ddp_bucket_size=torch._inductor.config._fuse_ddp_bucket_size,
        ),
    ):
        trainer.fit(BoringModel())
    torch._dynamo.trace_rules.LEGACY_MOD_INLINELIST.discard("torch.nn.parallel.distributed")
    torch._dynamo.trace_rules.get_legacy_mod_inlinelist.cache_clear()
    assert probe.seen == [False, False]  # DDP's call runs eagerly
    assert backend.calls == 2  # and each step ran its compiled graph inside it


# A distribution that turns features on for a compiled model passed in without `use_compile` (`input_defaults`, as the
# package does) has it unwrapped under every launcher and compiled after the setup, for the features to act on; the
# fork undoes what a run compiled, that model included: the model is plain again after the run, and a later stage runs
# compiled when it gets the compiled model, or no model. (With `input_defaults` empty, as here by default, a compiled
# model runs as with the patches before the seam: left compiled, as master does.)


@pytest.fixture
def input_defaults(probe, monkeypatch):
    monkeypatch.setattr(_CompileConnector, "input_defaults", {"probe": True})


_STAGE_KWARGS = {**_TRAINER_KWARGS, "max_steps": -1, "max_epochs": 1, "limit_train_batches": 2, "limit_test_batches": 2}


class GraphCallsPerStep(Callback):
    """How many compiled graphs each batch of each stage ran (a step that ran no compiled code shows 0)."""

    def __init__(self, backend):
        self.backend = backend
        self.calls = {}

    def _start(self, trainer):
        self._before = self.backend.calls

    def _end(self, trainer):
        self.calls.setdefault(trainer.state.stage.value, []).append(self.backend.calls - self._before)

    def on_train_batch_start(self, trainer, *_):
        self._start(trainer)

    def on_train_batch_end(self, trainer, *_):
        self._end(trainer)

    on_test_batch_start = on_train_batch_start
    on_test_batch_end = on_train_batch_end


class RaisesOnTheSecondStep(BoringModel):
    fail = True

    def training_step(self, batch, batch_idx):
        if self.fail and batch_idx == 1:
            raise RuntimeError("the step failed")
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("strategy", ["auto", pytest.param("ddp", marks=RunIf(skip_windows=True))])
def test_a_compiled_model_passed_in_is_plain_again_after_the_run(fresh_dynamo, input_defaults, tmp_path, strategy):
    model, backend = BoringModel(), CountingBackend()
    calls = GraphCallsPerStep(backend)
    trainer = Trainer(default_root_dir=tmp_path, strategy=strategy, callbacks=[calls], **_STAGE_KWARGS)
    trainer.fit(torch.compile(model, backend=backend))
    assert all(calls.calls["train"])
    # its own methods, nothing compiled left on it, and it pickles
    assert model._compiler_ctx is None
    assert "training_step" not in vars(model)
    pickle.dumps(model)


@pytest.mark.parametrize("strategy", ["auto", pytest.param("ddp", marks=RunIf(skip_windows=True))])
def test_the_model_passed_compiled_to_fit_and_plain_to_a_later_stage_runs_uncompiled_with_a_warning(
    fresh_dynamo, input_defaults, tmp_path, strategy
):
    model, backend = BoringModel(), CountingBackend()
    calls = GraphCallsPerStep(backend)
    trainer = Trainer(default_root_dir=tmp_path, strategy=strategy, callbacks=[calls], **_STAGE_KWARGS)
    compiled = torch.compile(model, backend=backend)
    trainer.fit(compiled)
    with pytest.warns(UserWarning, match="runs it uncompiled. Pass the compiled model, or no model"):
        trainer.test(model)
    assert calls.calls["test"] == [0, 0]
    trainer.test(compiled)
    assert all(calls.calls["test"][2:])


@pytest.mark.parametrize("strategy", ["auto", pytest.param("ddp", marks=RunIf(skip_windows=True))])
def test_a_run_that_raises_is_undone_and_the_model_compiles_again(fresh_dynamo, input_defaults, tmp_path, strategy):
    model, backend = RaisesOnTheSecondStep(), CountingBackend()
    trainer = Trainer(default_root_dir=tmp_path, strategy=strategy, **_STAGE_KWARGS)
    with pytest.raises(RuntimeError, match="the step failed"):
        trainer.fit(torch.compile(model, backend=backend))
    # undone on the error path too: nothing compiled left on the model
    assert model._compiler_ctx is None
    assert "training_step" not in vars(model)
    # and a later run of the same model compiles again
    model.fail = False
    calls = GraphCallsPerStep(backend)
    trainer = Trainer(default_root_dir=tmp_path, strategy=strategy, callbacks=[calls], **_STAGE_KWARGS)
    trainer.fit(torch.compile(model, backend=backend))
    assert all(calls.calls["train"])
