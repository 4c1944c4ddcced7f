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

from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities.compile import from_compiled, to_uncompiled
from tests_pytorch.helpers.runif import RunIf


@RunIf(dynamo=True)
def test_to_uncompiled_leaves_no_step_method_on_the_instance(monkeypatch):
    model = BoringModel()
    to_uncompiled(from_compiled(torch.compile(model, backend="eager")))
    assert "training_step" not in vars(model)
    monkeypatch.setattr(BoringModel, "test_step", lambda self, *args: "patched on the class")
    assert model.test_step() == "patched on the class"  # no bound method of the class's old one left on the instance


@RunIf(dynamo=True)
def test_to_uncompiled_restores_a_step_set_on_the_instance():
    model = BoringModel()

    def own_step(*args):
        return "set on the instance"

    model.validation_step = own_step
    to_uncompiled(from_compiled(torch.compile(model, backend="eager")))
    assert model.validation_step is own_step
    assert "training_step" not in vars(model)
