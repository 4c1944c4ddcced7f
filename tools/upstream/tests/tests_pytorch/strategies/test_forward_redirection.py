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
from unittest import mock

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.strategies.ddp import _DDPForwardRedirection
from lightning.pytorch.strategies.strategy import _ForwardRedirection


class _FailingWrapper(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args):
        raise RuntimeError("the wrapper failed")


class _PassThroughWrapper(_FailingWrapper):
    def forward(self, *args):
        return self.module(*args)


class _RecordingRedirection(_ForwardRedirection):
    def __init__(self):
        self.outer_calls = 0

    def on_after_outer_forward(self, wrapper_module, original_module):
        self.outer_calls += 1  # DDP's turns gradient sync back on here, after manual optimization turned it off


def test_forward_redirection_restores_forward_when_the_call_raises():
    model = BoringModel()
    batch = torch.randn(2, 32)
    redirection = _RecordingRedirection()
    with pytest.raises(RuntimeError, match="the wrapper failed"):
        redirection(_FailingWrapper(model), model, "training_step", batch, 0)
    # the module's own forward again, not the redirecting one left behind (which ran `training_step`: a dict)
    output = model(batch)
    assert isinstance(output, torch.Tensor), output
    torch.testing.assert_close(output, model.layer(batch))
    assert getattr(model.forward, "__func__", None) is BoringModel.forward
    assert redirection.outer_calls == 1


def test_forward_redirection_keeps_a_forward_that_the_step_sets():
    class SetsForward(BoringModel):
        def training_step(self, batch, batch_idx):
            self.forward = self.identity
            return super().training_step(batch, batch_idx)

        def identity(self, x):
            return x

    model = SetsForward()
    _ForwardRedirection()(_PassThroughWrapper(model), model, "training_step", torch.randn(2, 32), 0)
    assert model.forward == model.identity


def test_ddp_gradient_sync_is_turned_back_on_when_the_call_raises_under_manual_optimization():
    model = BoringModel()
    model.automatic_optimization = False

    def forward_then_raise(*args):
        model(*args)  # the redirected forward: the step, then `on_after_inner_forward` turns gradient sync off
        raise RuntimeError("the wrapper failed")

    wrapper = mock.Mock(spec=DistributedDataParallel, side_effect=forward_then_raise)
    wrapper.require_backward_grad_sync = True
    with pytest.raises(RuntimeError, match="the wrapper failed"):
        _DDPForwardRedirection()(wrapper, model, "training_step", torch.randn(2, 32), 0)
    assert wrapper.require_backward_grad_sync is True  # on again after the step
