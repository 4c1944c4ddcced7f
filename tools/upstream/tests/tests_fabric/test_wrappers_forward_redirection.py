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
from unittest.mock import Mock

import pytest
import torch

from lightning.fabric.plugins import Precision
from lightning.fabric.wrappers import _FabricModule


def test_step_method_redirection_restores_forward_when_the_wrapper_raises():
    class DDP(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module
            self.fail = True

        def forward(self, *args, **kwargs):
            if self.fail:  # a forward pre-hook or a compile error, once
                self.fail = False
                raise RuntimeError("the wrapper failed")
            return self.module(*args, **kwargs)

    class LightningModule(torch.nn.Module):
        def forward(self):
            return "forward_return"

        def training_step(self):
            return "training_step_return"

    strategy = Mock()
    strategy.precision = Mock(wraps=Precision())
    original_module = LightningModule()
    forward_module = DDP(original_module)
    fabric_module = _FabricModule(forward_module=forward_module, strategy=strategy, original_module=original_module)

    with pytest.raises(RuntimeError, match="the wrapper failed"):
        fabric_module.training_step()
    # the real forward, not the redirected `training_step`
    assert original_module() == "forward_return"
    assert fabric_module() == "forward_return"
    assert fabric_module.training_step() == "training_step_return"


def test_step_method_redirection_keeps_a_forward_that_the_step_sets():
    class DDP(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, *args, **kwargs):
            return self.module(*args, **kwargs)

    class LightningModule(torch.nn.Module):
        def forward(self):
            return "forward_return"

        def training_step(self):
            self.forward = self.other_forward
            return "training_step_return"

        def other_forward(self):
            return "other_forward_return"

    strategy = Mock()
    strategy.precision = Mock(wraps=Precision())
    original_module = LightningModule()
    forward_module = DDP(original_module)
    fabric_module = _FabricModule(forward_module=forward_module, strategy=strategy, original_module=original_module)
    assert fabric_module.training_step() == "training_step_return"
    assert original_module() == "other_forward_return"
