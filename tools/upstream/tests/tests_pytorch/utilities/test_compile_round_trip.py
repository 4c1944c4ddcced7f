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
import pickle

import torch

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
def test_to_uncompiled_restores_the_class_methods():
    model = BoringModel()
    to_uncompiled(from_compiled(torch.compile(model, backend="eager")))
    BoringModel.test_step, original = (lambda self, *args: "patched on the class"), BoringModel.test_step
    try:
        assert model.test_step() == "patched on the class"  # no bound method of the old class left on the instance
    finally:
        BoringModel.test_step = original
    pickle.loads(pickle.dumps(model))
