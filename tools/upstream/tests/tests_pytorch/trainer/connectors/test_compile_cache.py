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
import os
import sys

import pytest
import torch

from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.trainer.connectors.compile_features.cache import _load, _parse_cache_dir
from tests_pytorch.helpers.runif import RunIf

# `Trainer(use_compile=...)` needs torch 2.6
pytestmark = RunIf(min_torch="2.6")


def test_compile_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _parse_cache_dir(True) == str(tmp_path / "lightning" / "compile")
    assert _parse_cache_dir(None) is None
    assert _parse_cache_dir("relative") == os.path.abspath("relative")
    with pytest.raises(TypeError, match="must be `True`"):
        _parse_cache_dir(1)


def test_compile_cache_unreadable_file_warns(tmp_path):
    path = tmp_path / "rank0.bin"
    path.write_bytes(b"not a cache")
    with pytest.warns(UserWarning, match="cannot be read.*compiling cold"):
        _load(path, {})


@pytest.mark.skipif(sys.platform == "darwin", reason="fatal error: 'omp.h' file not found")
@RunIf(min_torch="2.7", dynamo=True)
def test_compile_cache_round_trip(tmp_path, monkeypatch):
    from torch._dynamo.utils import counters
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    trainer_kwargs = {
        "default_root_dir": tmp_path,
        "use_compile": {"cache": str(tmp_path / "cache")},
        "fast_dev_run": True,
        "enable_checkpointing": False,
        "enable_model_summary": False,
        "enable_progress_bar": False,
        "accelerator": "cpu",
    }
    trainer = Trainer(**trainer_kwargs)
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")  # torch sets its default when torch.compile is first called
    trainer.fit(BoringModel())
    [folder] = (tmp_path / "cache").iterdir()
    assert (folder / "rank0.bin").exists()
    assert (folder / "inductor").is_dir()
    # as it was, or at the default that torch itself sets when it first compiles or builds an inductor backend
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (before, default_cache_dir())

    # a new process, as far as the compiler is concerned
    torch._dynamo.reset()
    counters.clear()
    Trainer(**trainer_kwargs).fit(BoringModel())
    assert counters["aot_autograd"]["autograd_cache_hit"] > 0
