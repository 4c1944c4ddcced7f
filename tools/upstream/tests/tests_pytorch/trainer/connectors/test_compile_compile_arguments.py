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


@RunIf(dynamo=True)
@pytest.mark.parametrize(
    ("use_compile", "error", "match"),
    [
        ({"backend": "indcutor"}, ValueError, "names no registered `torch.compile` backend. Did you mean 'inductor'?"),
        ({"backend": 3}, TypeError, "must be a backend name or a callable"),
        ({"fullgraph": "yes"}, TypeError, "must be a bool"),
        ({"mode": "fast"}, ValueError, "'fast' is not a `torch.compile` mode"),
        ({"mode": "max-autotune", "options": {}}, ValueError, "both 'mode' and 'options'"),
        ({"options": {"max_autotun": True}}, ValueError, "is not an inductor setting. Did you mean 'max_autotune'?"),
        ({"options": {"max_autotune": "yes"}}, TypeError, "must be of type `bool`"),
    ],
)
def test_compile_arguments_are_checked_at_construction(use_compile, error, match):
    with pytest.raises(error, match=match):
        Trainer(use_compile=use_compile)
