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
from torch import nn

from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.demos.boring_classes import BoringModel
from tests_pytorch.helpers.runif import RunIf

# `Trainer(use_compile=...)` needs torch 2.6
pytestmark = RunIf(min_torch="2.6", dynamo=True)


class CountingBackend:
    def __init__(self):
        self.calls = 0

    def __call__(self, gm, example_inputs):
        def run(*args):
            self.calls += 1
            return gm.forward(*args)

        return run

    def __deepcopy__(self, memo):
        return self


class ChunkLoop(BoringModel):
    """A step with a graph break in a loop: PyTorch runs the whole step uncompiled, the modules it calls too."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
        self.layer = nn.Linear(16, 2)

    def training_step(self, batch, batch_idx):
        loss = 0
        for chunk in batch.split(16, dim=1):
            torch._dynamo.graph_break()
            loss = loss + self.layer(self.encoder(chunk)).sum()
        return loss


def _fit(use_compile):
    seed_everything(0)
    model = ChunkLoop()
    trainer = Trainer(
        use_compile=use_compile,
        max_steps=3,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(model)
    return model


@pytest.mark.parametrize("in_parts", [False, True])
def test_in_parts_compiles_the_modules_a_step_calls_where_the_step_cannot_be_compiled(in_parts):
    eager = _fit(None)
    backend = CountingBackend()
    model = _fit({"backend": backend, "in_parts": in_parts})
    # only with `in_parts` do graphs run, one for each module call
    assert backend.calls == (3 * 2 * 2 if in_parts else 0)  # steps, chunks, modules
    for ours, theirs in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs)
    # the modules are plain again after the run
    assert not any("forward" in vars(module) for module in model.modules())


def test_in_parts_compiles_the_same_graph_where_the_step_compiles_whole():
    torch._dynamo.reset()
    counts = []
    for in_parts in (False, True):
        torch._dynamo.reset()
        backend = CountingBackend()
        seed_everything(0)
        trainer = Trainer(
            use_compile={"backend": backend, "in_parts": in_parts},
            max_steps=2,
            limit_val_batches=0,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
            devices=1,
        )
        trainer.fit(BoringModel())
        counts.append(backend.calls)
    assert counts[0] == counts[1] > 0
