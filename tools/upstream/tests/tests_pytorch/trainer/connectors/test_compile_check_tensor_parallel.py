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
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from lightning.pytorch.strategies import ModelParallelStrategy
from tests_pytorch.helpers.runif import RunIf

# `Trainer(use_compile=...)` needs torch 2.6
pytestmark = RunIf(min_torch="2.6")

_QUIET = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False}
_COUNTS = {"calls": 0}


def _counting_aot_eager(gm, example_inputs):
    """``aot_eager``, counting how often the graphs it compiled ran (Lightning deep-copies the compile arguments)."""
    from torch._dynamo.backends.registry import lookup_backend

    compiled = lookup_backend("aot_eager")(gm, example_inputs)

    def run(*args):
        _COUNTS["calls"] += 1
        return compiled(*args)

    run._boxed_call = getattr(compiled, "_boxed_call", False)
    return run


class MLPBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 64)
        self.fc_out = nn.Linear(64, 16)

    def forward(self, x):
        return x + self.fc_out(F.gelu(self.fc(self.norm(x))))


class TensorParallelModel(LightningModule):
    """Vocabulary-parallel embedding, tensor-parallel MLP blocks and head; FSDP2 over the data-parallel dimension."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(32, 16)
        self.blocks = nn.ModuleList(MLPBlock() for _ in range(2))
        self.head = nn.Linear(16, 32, bias=False)

    def configure_model(self):
        from torch.distributed._composable.fsdp import fully_shard
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        tp_mesh, dp_mesh = self.device_mesh["tensor_parallel"], self.device_mesh["data_parallel"]
        plan = {"embedding": RowwiseParallel(input_layouts=Replicate())}
        parallelize_module(self, tp_mesh, {**plan, "head": ColwiseParallel(output_layouts=Replicate())})
        for block in self.blocks:
            parallelize_module(block, tp_mesh, {"fc": ColwiseParallel(), "fc_out": RowwiseParallel()})
            fully_shard(block, mesh=dp_mesh)
        fully_shard(self, mesh=dp_mesh)

    def forward(self, tokens):
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def training_step(self, batch, batch_idx):
        logits = self(batch[:, :-1])
        return F.cross_entropy(logits.reshape(-1, 32), batch[:, 1:].reshape(-1))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def train_dataloader(self):
        tokens = torch.randint(0, 32, (16, 9), generator=torch.Generator().manual_seed(0))
        return DataLoader(tokens, batch_size=2)


class RecordSteps(Callback):
    """The loss and every parameter gathered whole after each step (``full_tensor`` is a collective of all ranks)."""

    def __init__(self):
        self.steps = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        weights = {name: p.full_tensor().detach().clone() for name, p in pl_module.named_parameters()}
        self.steps.append((outputs["loss"].item(), weights, _COUNTS["calls"]))


def _fit(use_compile, **kwargs):
    seed_everything(0)
    model = TensorParallelModel()
    record = RecordSteps()
    trainer = Trainer(
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2),
        accelerator="cpu",
        devices=4,
        use_compile=use_compile,
        max_steps=3,
        callbacks=[record],
        **_QUIET,
        **kwargs,
    )
    trainer.fit(model)
    return trainer, model, record.steps


@RunIf(min_torch="2.13", standalone=True, dynamo=True, skip_windows=True)
def test_use_compile_regions_on_a_2d_mesh(tmp_path):
    """Tensor parallelism and FSDP2 on a 2x2 mesh, 4 CPU processes: regions train as eager does, bit for bit."""
    from torch.distributed.tensor import DTensor

    torch._dynamo.reset()
    _, eager_model, eager_steps = _fit(None)

    torch._dynamo.reset()
    use_compile = {"backend": _counting_aot_eager, "regions": "auto"}
    trainer, model, steps = _fit(use_compile)
    assert len(steps) == len(eager_steps) == 3
    calls_before = 0
    for (loss, weights, calls), (eager_loss, eager_weights, _) in zip(steps, eager_steps, strict=True):
        assert calls > calls_before  # compiled graphs ran in every step
        calls_before = calls
        assert loss == eager_loss
        for name, value in eager_weights.items():
            assert torch.equal(weights[name], value), name

    # the parameters are the strategy's DTensors, laid out as eager's, and nothing compiled is left on the model
    for (name, param), eager_param in zip(model.named_parameters(), eager_model.parameters(), strict=True):
        assert isinstance(param, DTensor), name
        assert param.placements == eager_param.placements, name
    assert all(module._compiled_call_impl is None for module in model.modules())
    assert not any("forward" in module.__dict__ for module in model.modules())

    # a checkpoint of the compiled run loads every shard back
    trainer.save_checkpoint(tmp_path / "checkpoint")
    torch._dynamo.reset()
    seed_everything(1)
    restored = TensorParallelModel()
    trainer = Trainer(
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2),
        accelerator="cpu",
        devices=4,
        use_compile=use_compile,
        max_steps=3,
        **_QUIET,
    )
    trainer.fit(restored, ckpt_path=tmp_path / "checkpoint")  # the strategy loads rank 0's path, where it saved
    # a tensor that several ranks hold (one sharded over the data-parallel ranks only) is saved once, from one of
    # them, and the tensor-parallel ranks' copies differ in the last bits in eager too: it equals one rank's copy
    for (name, param), value in zip(restored.named_parameters(), steps[-1][1].values(), strict=True):
        copies = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(copies, value)
        assert any(torch.equal(param.full_tensor(), copy) for copy in copies), name
        if param.device_mesh.size() == torch.distributed.get_world_size():
            assert torch.equal(param.full_tensor(), value), name


@RunIf(min_torch="2.13", standalone=True, dynamo=True, skip_windows=True)
def test_use_compile_whole_model_with_a_vocabulary_parallel_embedding_under_fsdp2_is_refused():
    with pytest.raises(ValueError, match="`embedding` is a vocabulary-parallel embedding"):
        _fit({"backend": "aot_eager", "check_tensor_parallel": True})
