"""Lists the step appends to (``self.outputs.append(loss.detach())``) never compile the step again.

The docs' pattern for epoch-end work collects each step's output in a list of the module and reads and clears it in
``on_train_epoch_end``. Dynamo guards on the length of every list a traced step touches, so the step compiled again at
each new length: once per batch of the first epoch, and eagerly from the recompile limit on (the last batches of every
epoch).

While a compiled step runs, each list of the module that a step has changed stands behind a view whose methods are
compiler-disabled: the step's graph breaks at each call on it (``append``, ``len``, indexing), and the call runs on the
list itself, eagerly, so the step sees what it would see without ``use_compile``. The list is back in place as soon as
the compiled call returns. A list joins the first time a compiled call leaves its length changed, and only if the
module's code outside its hooks (``on_*``, ``configure_*``, ...) only calls its methods and subscripts it: a list the
step passes on (``torch.cat(self.queue)``, ``len(self.queue)``: torch takes only a real list) stays as it is and keeps
its guards, as does a list no step changes (class names, layer sizes).

"""

import dis
import functools
import types
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Optional

import torch

from lightning_compile_patch.compile_features import _CompileFeature, _CompileOptions, _flag
from lightning_compile_patch.compile_features._run import _CompileRun

#: What a step may call on its list, as the view forwards it.
_FORWARDED = (
    *(name for name in vars(list) if not name.startswith("_")),
    "__len__",
    "__getitem__",
    "__setitem__",
    "__delitem__",
    "__iter__",
    "__reversed__",
    "__contains__",
    "__iadd__",
    "__bool__",
    "__eq__",
    "__repr__",
)


#: What the step may call on a list it collects into: the list's methods, which the view forwards.
_METHODS = tuple(name for name in vars(list) if not name.startswith("_"))
#: An index or a slice, and the subscript that takes it (``self.outputs[-1]``).
_INDEX = ("LOAD_CONST", "LOAD_SMALL_INT", "LOAD_FAST", "LOAD_FAST_BORROW", "UNARY_NEGATIVE", "BUILD_SLICE")
_SUBSCRIPT = ("BINARY_SUBSCR", "BINARY_SLICE", "STORE_SUBSCR", "DELETE_SUBSCR", "BINARY_OP")
#: Where the module's code runs eagerly, never inside a step: Lightning's hooks, by name.
_HOOKS = ("__init__", "setup", "teardown", "prepare_data", "state_dict", "load_state_dict")
_FRAMEWORK = ("lightning", "pytorch_lightning", "lightning_fabric", "torch", "builtins")


def _codes(code: types.CodeType) -> Any:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _kept_in_view(instructions: list, index: int) -> bool:
    """Whether the list loaded at ``index`` only has a method called or is subscripted: it never leaves the step."""
    if instructions[index].opname != "LOAD_ATTR":
        return False  # stored or deleted: another list
    after = instructions[index + 1 : index + 6]
    if after and ("ATTR" in after[0].opname or "METHOD" in after[0].opname):
        return after[0].argval in _METHODS
    loads = 0
    while loads < len(after) and after[loads].opname in _INDEX:
        loads += 1
    return 0 < loads < len(after) and after[loads].opname in _SUBSCRIPT


def _own_codes(cls: type) -> Iterator[tuple[str, types.CodeType]]:
    """The code of each function, method and property of the module's own classes (not Lightning's), by name."""
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] in _FRAMEWORK:
            continue
        for attribute, value in vars(klass).items():
            code = getattr(getattr(value, "__func__", getattr(value, "fget", value)), "__code__", None)
            if code is not None:
                yield attribute, code


def _collected_by_steps(cls: type) -> frozenset[str]:
    """The attributes that the module's own code outside its hooks uses, and uses only through methods and subscripts.

    Read once per run, in one pass over the code: the lists among them are those a step may collect into.

    """
    used: set[str] = set()
    passed_on: set[str] = set()
    for attribute, code in _own_codes(cls):
        if attribute in _HOOKS or attribute.startswith(("on_", "configure_")) or attribute.endswith("_dataloader"):
            continue
        for inner in _codes(code):
            instructions = [i for i in dis.get_instructions(inner) if i.opname not in ("CACHE", "EXTENDED_ARG", "NOP")]
            for index, instruction in enumerate(instructions):
                if "ATTR" in instruction.opname or "METHOD" in instruction.opname:
                    kept = _kept_in_view(instructions, index)
                    (used if kept else passed_on).add(instruction.argval)
    return frozenset(used - passed_on)


class _ListView:
    """Stands for a list of the module while a compiled step runs; each call runs on the list, outside the graph."""

    __slots__ = ("_list",)
    __hash__ = None  # type: ignore[assignment]  # as a list's

    def __init__(self) -> None:
        self._list: list = []


def _forward(name: str) -> Callable[..., Any]:
    method = getattr(list, name)

    @torch.compiler.disable
    def forwarded(self: _ListView, *args: Any, **kwargs: Any) -> Any:
        out = method(self._list, *args, **kwargs)
        return self if out is self._list else out  # `+=` returns the list: the attribute keeps the view

    return functools.update_wrapper(forwarded, method)


for _name in _FORWARDED:
    if _name == "__bool__":
        setattr(_ListView, _name, torch.compiler.disable(lambda self: bool(self._list)))
    else:
        setattr(_ListView, _name, _forward(_name))


class _ListOutputs(_CompileFeature):
    """Puts a view in place of each list of the module that a compiled step changes, for each compiled call."""

    keys = {"list_outputs": "True: a list of the module that a step appends to does not recompile it as it grows"}
    order = 5  # innermost: the lists are back before anything else sees the module

    def __init__(self, options: _CompileOptions) -> None:
        _flag(options, "list_outputs")
        self._module: Optional[Any] = None
        self._views: dict[str, _ListView] = {}  # one view per name for the run: Dynamo guards on its identity
        #: The attributes whose lengths each compiled call watches: those the module's code may collect into.
        self._collected: frozenset[str] = frozenset()

    def setup(self, run: _CompileRun) -> Mapping[str, Any]:
        self._module, self._views = run.trainer.lightning_module, {}
        self._collected = _collected_by_steps(type(self._module))
        return {}

    def wrap(self, run: _CompileRun, compiled: Callable, original: Callable) -> Callable:
        if not self._collected:
            return compiled  # no list to watch: the call costs nothing more

        @functools.wraps(original, updated=())
        def call(*args: Any, **kwargs: Any) -> Any:
            attributes = vars(self._module)
            swapped = {}
            for name, view in self._views.items():
                value = attributes.get(name)
                if type(value) is list:
                    view._list = value
                    attributes[name] = view
                    swapped[name] = value
            lengths = {}  # of the lists the step may collect into
            for name in self._collected:
                value = attributes.get(name)
                if type(value) is list:
                    lengths[name] = len(value)
            try:
                return compiled(*args, **kwargs)
            finally:
                for name, value in swapped.items():
                    if attributes.get(name) is self._views[name]:  # the step may have set another value
                        attributes[name] = value
                    self._views[name]._list = []
                for name, length in lengths.items():
                    value = attributes.get(name)
                    if type(value) is list and len(value) != length:
                        self._views[name] = _ListView()  # collected by the step: behind a view from the next call on

        return call

    def teardown(self, run: _CompileRun) -> None:
        self._module, self._views, self._collected = None, {}, frozenset()


FEATURE = _ListOutputs
