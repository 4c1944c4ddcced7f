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
import torch

from lightning.fabric.fabric import Fabric
from tests_fabric.helpers.runif import RunIf


class CountingBackend:
    """Runs the graphs eagerly, and counts the graphs it compiled."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


@RunIf(dynamo=True)
def test_setup_compiles_again_with_the_users_backend_object():
    backend = CountingBackend()
    module = Fabric(accelerator="cpu", devices=1).setup(torch.compile(torch.nn.Linear(2, 2), backend=backend))
    module(torch.randn(1, 2))
    assert backend.graphs == 1


@RunIf(dynamo=True)
def test_a_backend_that_cannot_be_copied_compiles():
    backend = CountingBackend()
    backend.state = (n for n in range(3))  # a generator, which `copy.deepcopy` refuses, as it does a lock
    torch.compile(torch.nn.Linear(2, 2), backend=backend)(torch.randn(1, 2))
    assert backend.graphs == 1


@RunIf(dynamo=True)
def test_a_backend_that_cannot_be_copied_leaves_the_module_picklable():
    import pickle

    backend = CountingBackend()
    backend.state = (n for n in range(3))  # what neither `copy.deepcopy` nor `pickle` takes
    module = torch.nn.Linear(2, 2)
    torch.compile(module, backend=backend)
    pickle.loads(pickle.dumps(module))  # the module inside holds no arguments that cannot be copied


@RunIf(dynamo=True)
def test_the_other_arguments_are_kept_as_they_were_passed():
    options = {"max_autotune": False}
    compiled = torch.compile(torch.nn.Linear(2, 2), backend="inductor", options=options, dynamic=False)
    options["max_autotune"] = True  # the caller's dict, changed after the call, is not what was passed
    assert compiled._compile_kwargs == {"backend": "inductor", "options": {"max_autotune": False}, "dynamic": False}


@RunIf(dynamo=True)
def test_the_options_dict_is_copied_but_not_its_values():
    custom_pass = object()  # a backend's options may be objects, as inductor's custom graph passes are
    options = {"custom_pass": custom_pass}
    compiled = torch.compile(torch.nn.Linear(2, 2), backend=CountingBackend(), options=options)
    assert compiled._compile_kwargs["options"] is not options
    assert compiled._compile_kwargs["options"]["custom_pass"] is custom_pass


@RunIf(dynamo=True)
def test_each_compile_of_one_module_keeps_its_own_arguments():
    module = torch.nn.Linear(2, 2)
    first = torch.compile(module, backend="eager")
    second = torch.compile(module, backend="aot_eager")
    assert first._compile_kwargs == {"backend": "eager"}
    assert second._compile_kwargs == {"backend": "aot_eager"}


@RunIf(dynamo=True)
def test_a_copy_of_the_compiled_module_keeps_its_arguments():
    from copy import deepcopy

    compiled = torch.compile(torch.nn.Linear(2, 2), backend="eager")
    assert deepcopy(compiled)._compile_kwargs == {"backend": "eager"}  # rebuilt from the module inside
