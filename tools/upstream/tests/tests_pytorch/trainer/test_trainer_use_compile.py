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
import pickle

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from tests_pytorch.helpers.runif import RunIf

_TRAINER_KWARGS = {
    "max_epochs": 1,
    "limit_train_batches": 2,
    "limit_val_batches": 1,
    "limit_test_batches": 1,
    "limit_predict_batches": 1,
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
    """Runs the graphs eagerly and counts them."""

    graphs = 0

    def __call__(self, gm, example_inputs):
        CountingBackend.graphs += 1
        return gm.forward


class CompiledState(Callback):
    def __init__(self):
        self.seen = {}

    def on_train_batch_start(self, trainer, *_):
        self.seen.setdefault("train", self._state(trainer))

    def on_validation_batch_start(self, trainer, *_):
        self.seen.setdefault(trainer.state.fn.value, self._state(trainer))

    def on_test_batch_start(self, trainer, *_):
        self.seen.setdefault("test", self._state(trainer))

    def on_predict_batch_start(self, trainer, *_):
        self.seen.setdefault("predict", self._state(trainer))

    @staticmethod
    def _state(trainer):
        module, model = trainer.lightning_module, trainer.strategy.model
        steps = {"training_step", "validation_step", "test_step", "predict_step"}
        return {
            "type": type(model),
            "wrapper_compiled": model is not module and model._compiled_call_impl is not None,
            "compiled_steps": sorted(steps & set(module.__dict__)),
        }


@RunIf(dynamo=True)
def test_use_compile_in_signature():
    parameter = inspect.signature(Trainer).parameters["use_compile"]
    assert parameter.default is None
    assert "use_compile:" in Trainer.__init__.__doc__


@RunIf(dynamo=True)
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


@RunIf(dynamo=True)
@pytest.mark.parametrize("strategy", ["auto", pytest.param("ddp", marks=RunIf(skip_windows=True))])
def test_use_compile_compiles_after_the_strategy_wraps(tmp_path, strategy):
    state = CompiledState()
    model = LoggingModel()
    trainer = Trainer(
        default_root_dir=tmp_path,
        strategy=strategy,
        use_compile={"backend": "eager"},
        callbacks=[state],
        **_TRAINER_KWARGS,
    )
    trainer.fit(model)
    all_steps = ["predict_step", "test_step", "training_step", "validation_step"]
    if strategy == "ddp":
        assert state.seen["train"]["type"] is DistributedDataParallel
        assert state.seen["train"]["wrapper_compiled"]
        assert state.seen["train"]["compiled_steps"] == []
    else:
        assert state.seen["train"]["compiled_steps"] == all_steps
    assert set(trainer.callback_metrics) == {"train_loss", "val_loss"}

    # outside of fit, the strategy calls the step methods directly
    trainer.validate(model)
    trainer.test(model)
    trainer.predict(model)
    assert state.seen["validate"]["compiled_steps"] == all_steps
    assert state.seen["test"]["compiled_steps"] == all_steps
    assert state.seen["predict"]["compiled_steps"] == all_steps

    # everything is undone after each run: no instance attribute is left behind, and the model pickles
    assert not set(model.__dict__) & {"forward", *all_steps, "log"}
    assert all(m._compiled_call_impl is None for m in model.modules())
    assert model._compiler_ctx is None
    pickle.dumps(model)


@RunIf(dynamo=True)
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


@RunIf(dynamo=True)
def test_forward_redirection_restores_forward_when_the_call_raises():
    from lightning.pytorch.strategies.strategy import _ForwardRedirection

    class Failing(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, *args):
            raise RuntimeError("the wrapper failed")

    model = BoringModel()
    with pytest.raises(RuntimeError, match="the wrapper failed"):
        _ForwardRedirection()(Failing(model), model, "training_step", torch.randn(2, 32), 0)
    assert model.forward == BoringModel.forward.__get__(model)
    out = model(torch.randn(2, 32))  # the real forward, not the redirected training_step
    assert out.shape == (2, 2)


def test_to_uncompiled_leaves_no_instance_attributes():
    from lightning.pytorch.utilities.compile import from_compiled, to_uncompiled

    model = BoringModel()
    to_uncompiled(from_compiled(torch.compile(model, backend="eager")))
    assert not {"forward", "training_step", "validation_step", "test_step", "predict_step"} & set(model.__dict__)
    assert model._compiler_ctx is None


@RunIf(dynamo=True)
def test_use_compile_none_recompiles_a_compiled_model_after_the_wrap(tmp_path):
    CountingBackend.graphs = 0
    state = CompiledState()
    compiled = torch.compile(LoggingModel(), backend=CountingBackend())
    trainer = Trainer(default_root_dir=tmp_path, strategy="ddp", callbacks=[state], **_TRAINER_KWARGS)
    trainer.fit(compiled)
    assert state.seen["train"]["wrapper_compiled"]
    assert CountingBackend.graphs > 0
    assert compiled._orig_mod._compiler_ctx is None


@RunIf(dynamo=True)
def test_use_compile_false_keeps_the_default_behavior(tmp_path):
    state = CompiledState()
    compiled = torch.compile(BoringModel(), backend="eager")
    trainer = Trainer(default_root_dir=tmp_path, use_compile=False, callbacks=[state], **_TRAINER_KWARGS)
    trainer.fit(compiled)
    assert not state.seen["train"]["wrapper_compiled"]
    assert trainer.lightning_module._compiler_ctx["compiler"] == "dynamo"


@RunIf(dynamo=True)
def test_use_compile_wins_over_a_compiled_model(tmp_path):
    compiled = torch.compile(BoringModel(), backend="eager")
    trainer = Trainer(default_root_dir=tmp_path, use_compile={"backend": "eager"}, **_TRAINER_KWARGS)
    with pytest.warns(UserWarning, match="`use_compile` wins"):
        trainer.fit(compiled)


@RunIf(min_cuda_gpus=2, standalone=True, dynamo=True)
def test_use_compile_ddp_multi_gpu(tmp_path):
    state = CompiledState()
    trainer = Trainer(
        default_root_dir=tmp_path,
        strategy="ddp",
        accelerator="cuda",
        devices=2,
        use_compile=True,
        callbacks=[state],
        max_steps=2,
        enable_progress_bar=False,
    )
    trainer.fit(LoggingModel())
    assert state.seen["train"]["type"] is DistributedDataParallel
    assert state.seen["train"]["wrapper_compiled"]
