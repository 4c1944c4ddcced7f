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
import pytest
import torch

from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from tests_pytorch.helpers.runif import RunIf

# `Trainer(use_compile=...)` needs torch 2.6
pytestmark = RunIf(min_torch="2.6")

_TRAINER_KWARGS = {
    "max_steps": 2,
    "limit_val_batches": 0,
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "accelerator": "cpu",
}


def exploding_backend(gm, example_inputs):
    raise RuntimeError("backend exploded")


@RunIf(dynamo=True)
def test_compile_error_names_the_run(tmp_path):
    model = BoringModel()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = Trainer(
        default_root_dir=tmp_path, use_compile={"backend": exploding_backend, "compile_errors": True}, **_TRAINER_KWARGS
    )
    with pytest.raises(RuntimeError, match=r"could not compile the fit step .* under SingleDeviceStrategy") as error:
        trainer.fit(model)
    assert "'fallback': 'eager'" in str(error.value)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert model._compiler_ctx is None


@RunIf(dynamo=True)
def test_fallback_eager_warns_and_trains(tmp_path):
    trainer = Trainer(
        default_root_dir=tmp_path,
        use_compile={"backend": exploding_backend, "fallback": "eager"},
        **_TRAINER_KWARGS,
    )
    with pytest.warns(UserWarning, match="continues uncompiled"):
        trainer.fit(BoringModel())
    assert trainer.global_step == 2


def test_fallback_rejects_unknown_values():
    with pytest.raises(ValueError, match=r"'fallback': 'cpu'.*pass 'eager'"):
        Trainer(use_compile={"fallback": "cpu"})


def test_fallback_takes_its_value_from_a_config_file():
    import json

    # compared by value: a string read from JSON, YAML or the command line is not the interned literal
    Trainer(use_compile=json.loads('{"fallback": "eager"}'))


class _BackwardTwice(BoringModel):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss = self.step(batch)
        opt.zero_grad()
        self.manual_backward(loss, retain_graph=True)
        self.manual_backward(loss)
        opt.step()


@RunIf(min_torch="2.13", dynamo=True)
def test_manual_optimization_keeps_the_lazy_backward(tmp_path):
    # a backward compiled with the forward donates its buffers, and then refuses the second backward of the step
    trainer = Trainer(
        default_root_dir=tmp_path, use_compile={"backend": "aot_eager", "compile_errors": True}, **_TRAINER_KWARGS
    )
    trainer.fit(_BackwardTwice())
    assert trainer.global_step == 2
