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

from lightning.pytorch import Trainer
from tests_pytorch.helpers.runif import RunIf

# `Trainer(use_compile=...)` needs torch 2.6
pytestmark = RunIf(min_torch="2.6")


@RunIf(min_torch="2.6", dynamo=True)
@pytest.mark.parametrize(
    ("use_compile", "error", "match"),
    [
        ({"backend": "indcutor"}, ValueError, r"refuses.*'indcutor'.*Did you mean 'inductor'\?"),
        ({"backend": 3}, TypeError, "must be a backend name or a callable"),
        ({"fullgraph": "yes"}, TypeError, "must be a bool"),
        ({"mode": "fast"}, ValueError, "refuses.*mode=fast"),
        ({"mode": "max-autotune", "options": {}}, ValueError, "refuses.*mode or options"),
        ({"options": {"max_autotun": True}}, ValueError, "refuses.*option max_autotun"),
    ],
)
def test_compile_arguments_are_checked_at_construction(use_compile, error, match):
    with pytest.raises(error, match=match):
        Trainer(use_compile=use_compile)


@RunIf(min_torch="2.6", dynamo=True)
def test_what_torch_compile_accepts_is_accepted():
    Trainer(use_compile={"options": {"max_autotune": True, "epilogue_fusion": False}})
    Trainer(use_compile={"mode": "max-autotune-no-cudagraphs", "dynamic": False})
