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
import numpy as np
import pytest
import torch

from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.demos.boring_classes import BoringModel
from tests_pytorch.helpers.runif import RunIf

# `Trainer(use_compile=...)` needs torch 2.6
pytestmark = RunIf(min_torch="2.6", dynamo=True)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test counts the graphs it compiles from scratch: Dynamo's caches and recompile counts outlive a test, and
    Lightning's tests share their processes (in Lightning's CI run of the series, the DDP case compiled a third graph
    only after other tests in its process)."""
    torch._dynamo.reset()


_KWARGS = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False, "limit_predict_batches": 2}


class CountingBackend:
    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward

    def __deepcopy__(self, memo):
        return self


class IndexedWithNumpy(BoringModel):
    columns = np.array([1, 0, 1])

    def predict_step(self, batch, batch_idx):
        return self(batch)[:, self.columns]


@pytest.mark.parametrize("strategy", ["auto", pytest.param("ddp", marks=RunIf(skip_windows=True))])
def test_validate_after_fit_reuses_the_validation_step_fit_compiled(tmp_path, strategy):
    backend = CountingBackend()
    use_compile = {"backend": backend, "no_grad_evaluation": True}
    kwargs = {**_KWARGS, "max_steps": 2, "limit_val_batches": 2}
    trainer = Trainer(default_root_dir=tmp_path, strategy=strategy, use_compile=use_compile, **kwargs)
    model = BoringModel()
    trainer.fit(model)
    fitted = backend.graphs
    trainer.validate(model)
    assert backend.graphs == fitted
    assert trainer.validate_loop.inference_mode  # the Trainer's own setting again after the run


def test_predict_indexing_with_numpy_runs_compiled_and_gives_eagers_predictions(tmp_path):
    model = IndexedWithNumpy()
    seed_everything(0)  # the same random data for both
    eager = Trainer(default_root_dir=tmp_path, **_KWARGS).predict(model)
    use_compile = {"backend": "aot_eager", "no_grad_evaluation": True}
    seed_everything(0)
    compiled = Trainer(default_root_dir=tmp_path, use_compile=use_compile, **_KWARGS).predict(model)
    torch.testing.assert_close(compiled, eager)
