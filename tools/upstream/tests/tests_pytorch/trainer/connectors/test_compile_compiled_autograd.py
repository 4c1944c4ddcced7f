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
import importlib.util

import pytest
import torch
import torch._dynamo.config as dynamo_config
from torch import nn
from torch._dynamo.utils import counters
from torch.utils.data import DataLoader

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from lightning.pytorch.strategies import DDPStrategy
from tests_pytorch.helpers.runif import RunIf

# `Trainer(use_compile=...)` needs torch 2.6
pytestmark = RunIf(min_torch="2.6")

#: The `optimize_ddp` key is another patch's ("Choose DDP's graph split by world size"), which this one may go without.
_OPTIMIZE_DDP_KEY = importlib.util.find_spec("lightning.pytorch.trainer.connectors.compile_features.optimize_ddp")

_QUIET = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False}


class BatchNormModel(BoringModel):
    def __init__(self):
        super().__init__()
        self.layer = nn.Sequential(nn.Linear(32, 16), nn.BatchNorm1d(16), nn.Linear(16, 2))

    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 64), batch_size=4)


class SaveRankState(Callback):
    """Saves each rank's state at teardown, after the Trainer has undone what it set for the run."""

    def __init__(self, path):
        self.path = path

    def teardown(self, trainer, pl_module, stage):
        hooks = sum(len(p._post_accumulate_grad_hooks or {}) for p in pl_module.parameters())
        state = {
            "state_dict": pl_module.state_dict(),
            "hooks": hooks,
            "captures": counters["compiled_autograd"]["captures"],
        }
        torch.save(state, self.path / f"rank{trainer.global_rank}.pt")


@RunIf(min_torch="2.6", dynamo=True, skip_windows=True)
def test_compiled_autograd_matches_eager_and_restores_the_process():
    states = {}
    for name, use_compile in (("eager", None), ("compiled", {"backend": "eager", "compiled_autograd": True})):
        torch.manual_seed(1)
        model = BatchNormModel()
        trainer = Trainer(strategy="ddp", devices=1, accelerator="cpu", use_compile=use_compile, max_steps=3, **_QUIET)
        captures = counters["compiled_autograd"]["captures"]
        trainer.fit(model)
        states[name] = model.state_dict()
    assert counters["compiled_autograd"]["captures"] > captures
    torch.testing.assert_close(states["compiled"], states["eager"])
    from torch._dynamo import compiled_autograd, trace_rules  # torch 2.2+: imported where the test runs

    assert not compiled_autograd.compiled_autograd_enabled
    assert dynamo_config.optimize_ddp is True
    assert "torch.nn.parallel.distributed" not in trace_rules.LEGACY_MOD_INLINELIST
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())


@RunIf(min_torch="2.6", dynamo=True, skip_windows=True)
def test_compiled_autograd_broadcasts_buffers_like_ddp(tmp_path):
    """The python reducer skips DDP's buffer broadcast; the Trainer does it, so each rank's statistics match DDP's."""
    states = {}
    for name, use_compile in (("eager", None), ("compiled", {"backend": "eager", "compiled_autograd": True})):
        path = tmp_path / name
        path.mkdir()
        torch.manual_seed(1)
        trainer = Trainer(
            strategy="ddp_spawn",
            devices=2,
            accelerator="cpu",
            use_compile=use_compile,
            max_steps=3,
            callbacks=[SaveRankState(path)],
            **_QUIET,
        )
        trainer.fit(BatchNormModel())
        states[name] = [torch.load(path / f"rank{rank}.pt") for rank in (0, 1)]
    for compiled, eager in zip(states["compiled"], states["eager"], strict=True):
        assert compiled["captures"] > 0
        assert compiled["hooks"] == 0
        torch.testing.assert_close(compiled["state_dict"], eager["state_dict"])


@RunIf(min_torch="2.6")
@pytest.mark.parametrize("value", [1, "yes"])
def test_compiled_autograd_rejects_values_other_than_true_or_a_dict(value):
    with pytest.raises(TypeError, match=r"or a dict of `torch\.compile` arguments"):
        Trainer(use_compile={"compiled_autograd": value})


@RunIf(min_torch="2.6")
@pytest.mark.skipif(_OPTIMIZE_DDP_KEY is None, reason="needs the `optimize_ddp` key of Lightning's compile features")
def test_compiled_autograd_rejects_a_conflicting_optimize_ddp():
    with pytest.raises(ValueError, match="needs DDP's python reducer"):
        Trainer(use_compile={"compiled_autograd": True, "optimize_ddp": "ddp_optimizer"})


@RunIf(min_torch="2.6")
def test_compiled_autograd_rejects_bucket_cap_mb_list():
    with pytest.raises(ValueError, match="does not support `bucket_cap_mb_list`"):
        Trainer(
            strategy=DDPStrategy(bucket_cap_mb_list=[1, 25]), accelerator="cpu", use_compile={"compiled_autograd": True}
        )


@RunIf(min_torch="2.6")
def test_compiled_autograd_rejects_find_unused_parameters():
    strategy = DDPStrategy(find_unused_parameters=True)
    with pytest.raises(ValueError, match="does not support `find_unused_parameters`"):
        Trainer(strategy=strategy, accelerator="cpu", use_compile={"compiled_autograd": True})
