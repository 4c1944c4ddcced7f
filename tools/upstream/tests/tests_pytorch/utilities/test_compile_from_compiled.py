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
import torch

from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities.compile import from_compiled, to_uncompiled
from tests_pytorch.helpers.runif import RunIf


@RunIf(dynamo=True)
def test_from_compiled_keeps_a_step_set_to_none():
    model = BoringModel()
    model.validation_step = None  # how a loop is turned off
    compiled = from_compiled(torch.compile(model, backend="eager"))
    assert compiled.validation_step is None
    assert compiled.training_step(torch.randn(2, 32), 0)["loss"].ndim == 0
    to_uncompiled(compiled)
    assert model.validation_step is None


@RunIf(dynamo=True)
def test_trainer_fits_a_compiled_model_with_a_step_set_to_none(tmp_path):
    model = BoringModel()
    model.validation_step = None
    trainer = Trainer(default_root_dir=tmp_path, fast_dev_run=1, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(torch.compile(model, backend="eager"))
    assert trainer.state.finished
