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
from torch.utils.data import DataLoader

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from lightning.pytorch.trainer.connectors.compile_features.regions import _find_regions
from tests_pytorch.helpers.runif import RunIf

# `Trainer(use_compile=...)` needs torch 2.6
pytestmark = RunIf(min_torch="2.6")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(32, 32)

    def forward(self, x):
        return x + torch.relu(self.linear(x))


class BlocksModel(BoringModel):
    def __init__(self, n_blocks=3):
        super().__init__()
        self.embed = nn.Linear(32, 32)  # every block sees an input that requires grad, as in a real model
        self.blocks = nn.ModuleList(Block() for _ in range(n_blocks))

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.layer(x)

    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 20), batch_size=8)  # the last batch has 4


class RegionState(Callback):
    def on_train_batch_start(self, trainer, pl_module, *_):
        self.compiled = ["forward" in block.__dict__ for block in pl_module.blocks]


@RunIf(dynamo=True)
@pytest.mark.parametrize("regions", ["auto", Block, ["Block"]])
@pytest.mark.parametrize("strategy", ["auto", pytest.param("ddp", marks=RunIf(skip_windows=True))])
def test_use_compile_regions(tmp_path, regions, strategy):
    from torch._dynamo.utils import get_compilation_metrics

    torch._dynamo.reset()
    torch._dynamo.utils.clear_compilation_metrics()
    state = RegionState()
    model = BlocksModel()
    trainer = Trainer(
        default_root_dir=tmp_path,
        strategy=strategy,
        use_compile={"backend": "eager", "regions": regions},
        callbacks=[state],
        max_epochs=1,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(model)
    assert state.compiled == [True, True, True]
    assert not any("forward" in block.__dict__ for block in model.blocks)
    # the three blocks share one compiled graph: one compile for full batches, one for the partial batch
    block_compiles = [m for m in get_compilation_metrics() if m.co_firstlineno == Block.forward.__code__.co_firstlineno]
    assert len(block_compiles) == 2


@RunIf(dynamo=True)
def test_use_compile_regions_that_match_nothing(tmp_path):
    trainer = Trainer(default_root_dir=tmp_path, use_compile={"regions": ["Transformer"]}, fast_dev_run=True)
    with pytest.raises(ValueError, match="It has these repeated blocks: Block"):
        trainer.fit(BlocksModel())


def test_find_regions_outermost_wins():
    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.ModuleList([Block(), Block()])

    model = nn.Module()
    model.stack = nn.ModuleList([Outer(), Outer()])
    assert sorted(_find_regions(model, "auto")) == ["stack.0", "stack.1"]
    assert sorted(_find_regions(model, (Outer, Block))) == ["stack.0", "stack.1"]
    assert len(_find_regions(model, (Block,))) == 4


class IndexedBlock(Block):
    def __init__(self, index):
        super().__init__()
        self.layer_idx = index  # read in forward, as Hugging Face decoder layers read theirs

    def forward(self, x, scales):
        return super().forward(x) * scales[self.layer_idx]


class IndexedBlocksModel(BlocksModel):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(IndexedBlock(i) for i in range(10))  # more than Dynamo's recompile limit
        self.scales = [torch.tensor(1.0 + i / 10) for i in range(10)]

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x, self.scales)
        return self.layer(x)


@RunIf(dynamo=True)
def test_use_compile_regions_that_differ_in_a_per_layer_constant(tmp_path):
    from torch._dynamo.utils import get_compilation_metrics

    torch._dynamo.reset()
    torch._dynamo.utils.clear_compilation_metrics()
    trainer = Trainer(
        default_root_dir=tmp_path,
        use_compile={"backend": "eager", "regions": "auto"},
        max_steps=2,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(IndexedBlocksModel())
    # each block compiled once, on its own: sharing one graph, each block would recompile it up to the recompile limit
    assert [m.cache_size for m in get_compilation_metrics() if m.cache_size] == []
