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
import copy
import pickle

import pytest
import torch

from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.demos.boring_classes import BoringModel
from tests_pytorch.helpers.runif import RunIf

# `Trainer(use_compile=...)` needs torch 2.6
pytestmark = RunIf(min_torch="2.6")


class CountingBackend:
    def __init__(self):
        self.graphs = 0
        self.calls = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1

        def run(*args):
            self.calls += 1
            return gm.forward(*args)

        return run


class MetricModel(BoringModel):
    def __init__(self):
        super().__init__()
        torchmetrics = pytest.importorskip("torchmetrics")
        self.train_mean = torchmetrics.MeanMetric()
        self.val_mean = torchmetrics.MeanMetric()

    def training_step(self, batch, batch_idx):
        loss = self.step(batch)
        self.train_mean(loss)
        self.log("train_mean", self.train_mean)
        return loss

    def validation_step(self, batch, batch_idx):
        loss = self.step(batch)
        self.val_mean.update(loss)
        self.log("val_mean", self.val_mean)


def _fit(tmp_path, backend, steps):
    seed_everything(1)
    trainer = Trainer(
        default_root_dir=tmp_path,
        use_compile={"backend": backend, "eager_metrics": True},
        max_epochs=1,
        limit_train_batches=steps,
        limit_val_batches=steps,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    model = MetricModel()
    trainer.fit(model)
    return trainer, model


@RunIf(min_torch="2.6", dynamo=True)
def test_metrics_run_outside_the_graph_and_the_step_compiles_once(tmp_path):
    # a metric counts its calls in a Python int: inside the graph, every step recompiled until the recompile limit
    few, many = CountingBackend(), CountingBackend()
    _fit(tmp_path, few, steps=3)
    torch._dynamo.reset()
    trainer, model = _fit(tmp_path, many, steps=12)
    assert many.graphs == few.graphs  # no graph per step
    assert many.calls >= 24  # every training and validation step ran compiled code
    assert trainer.callback_metrics["val_mean"] > 0
    assert "forward" not in model.train_mean.__dict__  # the metric is plain again after the run


@RunIf(min_torch="2.6", dynamo=True)
def test_a_metric_pickled_or_copied_during_the_run_is_a_plain_metric_of_its_own(tmp_path):
    # a checkpoint pickles the hyperparameters (a metric among them), an EMA callback deep-copies the model
    copies = []

    class CopyTheMetric(Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            copies.append(pickle.loads(pickle.dumps(pl_module.train_mean)))
            copies.append(copy.deepcopy(pl_module.train_mean))

    class DetachedMetricModel(MetricModel):
        def training_step(self, batch, batch_idx):
            loss = self.step(batch)
            self.train_mean(loss.detach())  # a tensor that needs grad cannot be deep-copied, compiled or not
            return loss

    model = DetachedMetricModel()
    trainer = Trainer(
        default_root_dir=tmp_path,
        use_compile={"backend": "eager", "eager_metrics": True},
        max_steps=2,
        limit_val_batches=0,
        callbacks=[CopyTheMetric()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(model)
    assert len(copies) == 4
    for copied in copies:
        assert "forward" not in copied.__dict__
        copied.reset()
        copied(torch.tensor(2.0))  # updates the copy, not the model's metric
        assert copied.compute() == 2.0
