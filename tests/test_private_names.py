"""The private names: every private name of torch, Lightning and CPython that the change reads is in one module, and
each entry works.

``compile_features/_private_names.py`` holds each such name that a feature needs, behind a function or constant named
for what the feature does with it, with the versions it is read on. These tests call each entry the way the features
do, on the torch they run on: CI runs this file on 2.13.0 (``tests``), 2.6.0 and 2.15.0 (``tests_torch``), and
``tools/tests/test_patchset.py`` checks that the module goes upstream with the seam. A new entry without a test here
fails ``test_every_entry_is_exercised``; a private name read anywhere else, unless ``ALLOWED_OUTSIDE`` lists it with its
reason, fails ``test_no_module_reaches_a_private_name_but_through_private_names``.

"""

import ast
import functools
import gc
import inspect
import logging
import os
import re
import sys
import time
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from helpers import TORCH_2_7, TORCH_2_13, lightning_side

private = lightning_side("_private_names")
#: The modules of the change: the package's, or on a patched Lightning the connector and the feature modules.
FEATURES_DIR = Path(private.__file__).parent
SOURCES = (
    list(FEATURES_DIR.parent.rglob("*.py"))
    if FEATURES_DIR.parent.name == "lightning_compile_patch"
    else [*FEATURES_DIR.glob("*.py"), FEATURES_DIR.parent / "compile_connector.py"]
)
TORCH_2_6 = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 6)

#: The private names used outside `_private_names`, by file, and why. The core rungs (the connector's re-apply and
#: `use_compile`, and the fixes of Lightning's functions) are Lightning's own code: they use Lightning's private names,
#: and `OptimizedModule` (torch has no public name for what `torch.compile` returns), as Lightning's
#: `utilities/compile.py` does.
CORE = {"OptimizedModule", "_orig_mod", "_compiler_ctx", "_compile_kwargs", "_unwrap_compiled"}
CORE |= {"_MultiProcessingLauncher", "_verify_strategy_can_compile", "_TORCH_GREATER_EQUAL_2_6"}
ALLOWED_OUTSIDE = {
    "compile_connector.py": CORE,
    "lightning_fixes.py": CORE | {"_original_module", "_check_mixed_imports"},
    # the monkeypatch replaces `Trainer._run` and `Trainer._teardown`, where the upstream change calls the connector,
    # and wraps `__init__` in the decorator Lightning puts on it; it refuses a Lightning it was not tested with
    "patch.py": {"_run", "_teardown", "_defaults_from_env_vars"},
    "list_outputs.py": {"_dataloader"},  # the end of the names of Lightning's dataloader hooks, not a name
}

EXERCISED: set[str] = set()


def exercises(*entries: str):
    """Marks a test as the one that calls ``entries`` of `_private_names`."""
    EXERCISED.update(entries)
    return lambda test: test


def _defined(trees: list[ast.Module]) -> set[str]:
    """The attribute names the change defines itself: its modules' names, its classes' methods and class attributes,
    and what its objects set on ``self`` or ``cls``. Names local to a function (a nested ``def _run``) do not count."""
    names = set()
    for tree in trees:
        scopes: list[ast.AST] = [tree, *(node for node in ast.walk(tree) if isinstance(node, ast.ClassDef))]
        for scope in scopes:
            for node in scope.body:  # type: ignore[attr-defined]
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    names |= {t.id for target in targets for t in ast.walk(target) if isinstance(t, ast.Name)}
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    names |= {alias.asname for alias in node.names if alias.asname}
        for node in ast.walk(tree):
            own = isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
            if own and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                names.add(node.attr)
    return names


def _private(name: str) -> bool:
    return len(name) > 1 and name.startswith("_") and not name.startswith("__")


def private_names(tree: ast.Module, defined: set[str], own_modules: tuple[str, ...]) -> set[str]:
    """The private names of others (torch's, Lightning's, CPython's) that ``tree`` reads or writes.

    An attribute (``module._call_impl``), a name imported from another package (``from torch._dynamo import x``,
    ``import torch._dynamo``), and a string that names an attribute (``getattr(m, "_compiled_call_impl")``).

    """
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in defined:
            found.add(node.attr)
        elif isinstance(node, ast.ImportFrom) and not (node.module or "").startswith(own_modules):
            parts = (node.module or "").split(".")
            found |= {f"{node.module}.{a.name}" for a in node.names if _private(a.name) or any(map(_private, parts))}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if any(map(_private, alias.name.split(".")))}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            found |= {node.value} if _private(node.value) and node.value not in defined else set()
    return found


def test_no_module_reaches_a_private_name_but_through_private_names():
    """torch's, Lightning's and CPython's private names are read in `_private_names` only, so that a release that
    moves one changes one entry there; the exceptions are listed, each with its reason, in ``ALLOWED_OUTSIDE``."""
    trees = {path: ast.parse(path.read_text()) for path in SOURCES}
    defined = _defined(list(trees.values()))
    own_modules = ("lightning_compile_patch", "lightning.pytorch.trainer.connectors.compile")
    assert len(SOURCES) > 10
    reached = {}
    for path, tree in trees.items():
        if path.name != "_private_names.py":
            for name in private_names(tree, defined, own_modules):
                if name.rsplit(".", 1)[-1] not in ALLOWED_OUTSIDE.get(path.name, ()):
                    reached.setdefault(name, path.name)
    assert not reached, f"reach these through compile_features/_private_names.py: {reached}"


def test_the_check_sees_each_kind_of_private_name():
    source = """
import torch._dynamo
from torch._dynamo import convert_frame
from lightning.fabric.wrappers import _unwrap_compiled
frame = sys._getframe(1)
module._compiled_call_impl = None
hooked = getattr(module, "_distribute_module_applied", False)
self._own = 1
value = self._own + _unwrap_compiled(x)
"""
    found = private_names(ast.parse(source), _defined([ast.parse(source)]), ("lightning_compile_patch",))
    assert found == {
        "torch._dynamo",
        "torch._dynamo.convert_frame",
        "lightning.fabric.wrappers._unwrap_compiled",
        "_getframe",
        "_compiled_call_impl",
        "_distribute_module_applied",
    }


def test_every_entry_is_exercised():
    entries = {
        name
        for name, value in vars(private).items()
        if (inspect.isfunction(value) and value.__module__ == private.__name__ and not name.startswith("_"))
        or (name.isupper() and not name.startswith("_"))
        or name.endswith("_config")
    }
    assert len(entries) > 20
    assert entries - EXERCISED == set(), "each entry of `_private_names` needs a test here that calls it"


def compiled_once(fn, *args):
    compiled = torch.compile(fn, backend="eager")
    compiled(*(args or (torch.ones(2),)))
    return compiled


@exercises("dynamo_config", "functorch_config", "inductor_config")
def test_the_settings_the_features_change_are_there():
    assert private.dynamo_config.optimize_ddp in (True, False, "ddp_optimizer", "python_reducer", "no_optimization")
    assert isinstance(private.dynamo_config.suppress_errors, bool)
    if TORCH_2_13:
        assert isinstance(private.functorch_config.force_non_lazy_backward_lowering, bool)
    if TORCH_2_6:  # what building a DDP under the python reducer sets
        assert hasattr(private.inductor_config, "_fuse_ddp_communication")
        assert hasattr(private.inductor_config, "_fuse_ddp_bucket_size")


@exercises("RECOMPILE_LIMIT", "recompile_limit", "errors_suppressed", "NON_LAZY_BACKWARD")
def test_the_settings_read_are_read_from_dynamo():
    name = private.RECOMPILE_LIMIT
    assert name == ("recompile_limit" if TORCH_2_7 else "cache_size_limit")
    with torch._dynamo.config.patch(**{private.RECOMPILE_LIMIT: 3}, suppress_errors=True):
        assert private.recompile_limit() == 3
        assert private.errors_suppressed() is True
    assert private.NON_LAZY_BACKWARD is TORCH_2_13


@exercises("RECOMPILE_LIMIT_LOGGER", "is_recompile_limit_hit", "FRAME_IN_MESSAGE")
def test_a_recompile_limit_hit_is_told_on_the_logger_in_words_the_surface_knows():
    records = []

    class Keep(logging.Filter):
        def filter(self, record):
            records.append(record.getMessage())
            return True

    def f(x, n):
        return x + n

    logger, keep = logging.getLogger(private.RECOMPILE_LIMIT_LOGGER), Keep()
    logger.addFilter(keep)
    try:
        with torch._dynamo.config.patch(**{private.RECOMPILE_LIMIT: 2}):
            compiled = torch.compile(f, backend="eager", dynamic=False)
            for n in range(4):
                compiled(torch.ones(2), n)
    finally:
        logger.removeFilter(keep)
    hits = [message for message in records if private.is_recompile_limit_hit(message)]
    assert hits, records
    assert not private.is_recompile_limit_hit("hit a graph break")
    named = [found for message in hits if (found := private.FRAME_IN_MESSAGE.search(message))]
    assert (named[0]["name"], named[0]["file"], int(named[0]["line"])) == ("f", __file__, f.__code__.co_firstlineno)


@exercises("graphs_compiled", "graph_breaks")
def test_the_counters_count_graphs_and_graph_breaks_by_reason():
    def f(x):
        x = x + 1
        torch._dynamo.graph_break()
        return x + 1

    graphs, breaks = private.graphs_compiled(), private.graph_breaks()
    compiled_once(f)
    assert private.graphs_compiled() - graphs == 2
    after = private.graph_breaks()
    assert sum(after.values()) - sum(breaks.values()) == 1
    assert all(isinstance(reason, str) for reason in after)


@exercises("compilation_metrics", "started_us")
def test_compilation_metrics_name_each_frame_and_when_it_was_compiled():
    def f(x):
        return x * 3

    since_us = private.started_us(private.compilation_metrics()[-1]) if private.compilation_metrics() else 0
    compiled_once(f)
    (metrics,) = [m for m in private.compilation_metrics() if m.co_name == "f" and private.started_us(m) >= since_us]
    assert (metrics.co_filename, metrics.co_firstlineno) == (__file__, f.__code__.co_firstlineno)
    assert private.started_us(metrics) > 1e15  # microseconds since the epoch
    assert not metrics.fail_type


@pytest.mark.skipif(not private.GRAPHLESS_FRAMES_TOLD, reason="2.6 records a frame skipped in a loop as no failure")
@exercises("compilation_metrics", "GRAPHLESS_FRAMES_TOLD")
def test_compilation_metrics_give_dynamos_reason_for_a_skipped_frame():
    def f(x):
        for _ in range(2):
            print(end="")  # a graph break in a loop: Dynamo skips the frame
            x = x + 1
        return x

    compiled_once(f)
    (metrics,) = [m for m in private.compilation_metrics() if m.co_name == "f" and m.fail_type]
    assert "loop" in metrics.fail_reason.lower()  # the cause the summary reads


@pytest.mark.skipif(not TORCH_2_13, reason="2.6 records a frame skipped for a graph break in a loop as no failure")
@exercises("compiles_since", "frame_key", "failed_codes")
def test_the_frames_compiled_since_a_time_are_found_newest_first_and_the_failed_ones_by_their_code():
    def skipped(x):
        for _ in range(2):
            print(end="")  # Dynamo skips the frame
            x = x + 1
        return x

    def compiled(x):
        return x * 2

    compiled_once(compiled)
    since_us = private.started_us(private.compilation_metrics()[-1]) + 1
    assert private.failed_codes(since_us) == []
    compiled_once(skipped)
    compiled_once(lambda x: x - 1)
    recent = private.compiles_since(since_us)
    assert [m.co_name for m in recent] == ["<lambda>", "skipped"]  # newest first, and nothing before `since_us`
    assert private.frame_key(recent[1]) == private.frame_key(skipped.__code__)
    assert private.failed_codes(since_us) == [skipped.__code__]


@exercises("converted_codes", "cache_entries", "reset_code", "per_code_reset")
def test_each_converted_code_is_listed_and_can_be_reset():
    assert private.per_code_reset()

    def f(x):
        return x - 1

    before = len(private.converted_codes())
    compiled_once(f)
    assert f.__code__ in [ref() for ref in private.converted_codes()[before:]]
    assert private.cache_entries(f.__code__) == 1
    private.reset_code(f.__code__)
    assert private.cache_entries(f.__code__) == 0


@pytest.mark.parametrize("name", ["_debug_get_cache_entry_list", "reset_code"])
def test_without_either_private_name_there_is_no_per_code_reset(monkeypatch, name):
    monkeypatch.delattr(torch._C._dynamo.eval_frame, name)
    assert not private.per_code_reset()


@exercises("skip_code")
def test_a_skipped_code_runs_uncompiled_as_a_frame_of_its_own_and_reset_lets_it_in_again():
    def inner(x):
        return x * 2

    private.skip_code(inner.__code__)
    compiled_once(inner)
    assert private.cache_entries(inner.__code__) == 0
    private.reset_code(inner.__code__)
    compiled_once(inner)
    assert private.cache_entries(inner.__code__) == 1
    private.reset_code(inner.__code__)


@exercises("backend", "OUTPUT_CODES")
def test_a_wrapped_backend_compiles_and_its_graphs_run_from_dynamos_output_code():
    ran_from_output_code = []

    def counting(gm, example_inputs):
        inner = private.backend("eager", None, None, None)(gm, example_inputs)

        def run(*args):
            frames = [sys._getframe(depth).f_code for depth in range(1, 6)]
            ran_from_output_code.append(any(code in private.OUTPUT_CODES for code in frames))
            return inner(*args)

        return run

    def f(x):
        return torch.sin(x) + 1

    assert torch.equal(torch.compile(f, backend=counting)(torch.ones(2)), f(torch.ones(2)))
    assert ran_from_output_code == [True]
    assert callable(private.backend(None, None, None, None))  # inductor's, built lazily


@exercises("COMPILE_ERRORS", "DYNAMO_DIR")
def test_a_failed_compile_raises_one_of_dynamos_errors_from_dynamos_own_code():
    def f(x):
        torch._dynamo.graph_break()
        return x

    with pytest.raises(private.COMPILE_ERRORS) as raised:
        torch.compile(f, backend="eager", fullgraph=True)(torch.ones(2))
    assert os.path.isfile(os.path.join(private.DYNAMO_DIR, "convert_frame.py"))
    frames = traceback.extract_tb(raised.value.__traceback__)
    assert any(frame.filename.startswith(private.DYNAMO_DIR) for frame in frames)


@exercises("compiler_disabled")
def test_a_function_marked_compiler_disable_is_told_with_its_reason():
    def f(x):
        return x

    assert private.compiler_disabled(f) is None
    assert private.compiler_disabled(torch.compiler.disable(f)) == ""
    if TORCH_2_7:  # `reason` is torch 2.7's
        assert private.compiler_disabled(torch.compiler.disable(f, reason="a reason")) == "a reason"


@exercises("BACKEND_FAILED")
def test_a_backend_that_raises_fails_the_compile_with_dynamos_backend_error():
    def exploding(gm, example_inputs):
        raise RuntimeError("backend exploded")

    with pytest.raises(private.BACKEND_FAILED, match="backend exploded"):
        torch.compile(lambda x: torch.sin(x) + 1, backend=exploding)(torch.ones(2))


@exercises("WRAPPING_ERRORS")
def test_a_type_error_of_a_builtin_dynamo_evaluates_reaches_the_caller_wrapped_by_dynamo():
    def f(x):
        return isinstance(x, list[int])  # raises TypeError, while Dynamo evaluates it

    with pytest.raises(private.WRAPPING_ERRORS) as raised:
        torch.compile(f, backend="eager")(torch.ones(2))
    error = raised.value
    chain = []
    while error is not None:
        chain.append(type(error))
        error = error.__cause__ or error.__context__
    # the error of the call itself is in the chain, not torch's (2.13+: the TypeError; 2.6: a NotImplementedError)
    assert any(cls.__module__ == "builtins" for cls in chain[1:]), chain
    assert TypeError in chain or not TORCH_2_13


@pytest.mark.skipif(not TORCH_2_6, reason="compiled autograd's switch is read on torch 2.6-2.14")
@exercises("compiled_autograd_switch", "backward_graphs_compiled")
def test_compiled_autograd_captures_the_backward_while_switched_on():
    switch = private.compiled_autograd_switch()
    assert switch is not None
    layer = nn.Linear(3, 1)
    before = private.backward_graphs_compiled()
    with switch(torch.compile(backend="eager")):
        layer(torch.ones(2, 3)).sum().backward()
    assert private.backward_graphs_compiled() - before == 1
    assert layer.weight.grad is not None


@pytest.mark.skipif(not TORCH_2_6, reason="DDP's python reducer is read on torch 2.6-2.14")
@exercises("ddp_uses_python_reducer", "ddp_file_traced", "stop_tracing_ddp_file", "remove_reducer_hooks")
@exercises("sync_ddp_buffers", "INDUCTOR_DDP_SETTINGS")
def test_ddp_built_under_the_python_reducer_is_told_synced_and_undone(tmp_path):
    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        traced_before = private.ddp_file_traced()
        plain = nn.parallel.DistributedDataParallel(nn.BatchNorm1d(2))
        assert not private.ddp_uses_python_reducer(plain)
        assert not private.ddp_uses_python_reducer(nn.BatchNorm1d(2))  # no DDP at all
        # building DDP under the python reducer sets inductor's DDP fusion for the process: the patch puts it back
        fusion = {name: getattr(private.inductor_config, name) for name in private.INDUCTOR_DDP_SETTINGS}
        with torch._dynamo.config.patch(optimize_ddp="python_reducer"), private.inductor_config.patch(fusion):
            wrapper = nn.parallel.DistributedDataParallel(nn.BatchNorm1d(2))
        assert private.ddp_uses_python_reducer(wrapper)
        assert private.ddp_file_traced()
        for before in (True, False):
            private.sync_ddp_buffers(wrapper, before=before)  # one rank: a broadcast to itself
        assert wrapper._accum_grad_hooks
        private.remove_reducer_hooks(wrapper)
        assert not wrapper._accum_grad_hooks
        if not traced_before:
            private.stop_tracing_ddp_file()
            assert not private.ddp_file_traced()
    finally:
        # Torch destroys a gloo group holding the GIL while it joins the group's threads, and a thread still freeing
        # its last broadcast's tensors waits for the GIL: CI hung so (the main thread in `~ProcessGroupGloo`'s join,
        # a worker in `~AsyncBroadcastWork`). The wrappers, whose reducers hold the group, go first, and the sleep
        # lets the workers take the GIL and finish.
        plain = wrapper = None
        gc.collect()
        time.sleep(0.1)
        dist.destroy_process_group()


@pytest.mark.skipif(not TORCH_2_7, reason="inductor's default cache directory is read on torch 2.7-2.14")
@exercises("inductor_default_cache_dir")
def test_inductors_default_cache_directory_is_a_path():
    assert os.path.isabs(private.inductor_default_cache_dir())


@exercises("COMPILED_CALL", "compiled_call", "module_call")
def test_a_module_compiled_in_place_runs_its_compiled_call_in_place_of_its_own():
    module = nn.Linear(2, 2)
    assert private.compiled_call(module) is None
    own = private.module_call(module)
    assert own.__func__ is nn.Module._call_impl  # hooks, then `forward`
    module.compile(backend="eager")
    assert private.compiled_call(module) is getattr(module, private.COMPILED_CALL)
    calls = []
    setattr(module, private.COMPILED_CALL, lambda *args: calls.append(args) or own(*args))
    module(torch.ones(1, 2))
    assert len(calls) == 1  # `__call__` ran what the attribute holds


@pytest.mark.skipif(not TORCH_2_13, reason="torch 2.6's `distribute_module` marks nothing: the entry reads False")
@exercises("tensor_parallel_hooks")
def test_a_module_parallelize_module_hooked_is_told(tmp_path):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_module

    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    module = nn.Linear(2, 2)
    assert not private.tensor_parallel_hooks(module)
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        distribute_module(module, init_device_mesh("cpu", (1,)))
        assert private.tensor_parallel_hooks(module)
    finally:
        dist.destroy_process_group()


@exercises("run_like")
def test_a_wrapped_graph_is_called_as_the_backend_compiled_it():
    calls = []

    def counting(gm, example_inputs):
        compiled = torch._dynamo.backends.common.aot_autograd(fw_compiler=lambda g, _: g)(gm, example_inputs)
        return private.run_like(lambda *args: calls.append(1) or compiled(*args), compiled)

    fn = torch.compile(lambda x: torch.sin(x) + 1, backend=counting)
    assert torch.equal(
        fn(torch.ones(2)), torch.sin(torch.ones(2)) + 1
    )  # called with the inputs as the graph takes them
    assert calls == [1]


@exercises("undisabled")
def test_a_graph_is_run_without_the_backends_own_disable():
    def graph(x):
        return torch.sin(x) + 1

    assert private.undisabled(graph) is graph
    assert private.undisabled(torch.compiler.disable(graph)) is graph
    only_its_frame = torch._dynamo.disable(lambda x: graph(x), recursive=False)  # 2.6 marks the function itself
    assert private.undisabled(only_its_frame) is only_its_frame  # what it calls is compiled: kept

    calls = []

    def counting(gm, example_inputs):  # as the summary's backend: AOTAutograd's graph, run inside Dynamo's wrapper
        compiled = torch._dynamo.backends.common.aot_autograd(fw_compiler=lambda g, _: g)(gm, example_inputs)
        inner = private.undisabled(compiled)
        assert inner is not compiled  # AOTAutograd disables around its graph, as Dynamo does around `run`

        def run(*args):
            calls.append(torch._dynamo.is_compiling())
            return inner(*args)

        return private.run_like(run, compiled)

    fn = torch.compile(graph, backend=counting)
    assert torch.equal(fn(torch.ones(2)), graph(torch.ones(2)))
    assert calls == [False]


@exercises("wrapped_function")
def test_the_function_a_wrapper_stands_for_is_found():
    def step(x):
        return x

    assert private.wrapped_function(step) is None
    assert private.wrapped_function(torch.compiler.disable(step)) is step
    assert private.wrapped_function(torch.compile(step, backend="eager")) is step
    assert private.wrapped_function(functools.partial(step, 1)) is step


@exercises("frame_above")
def test_the_frame_above_is_the_callers():
    def graph():
        return private.frame_above(1)

    def caller():
        return graph()

    assert caller().f_code is caller.__code__


@exercises("RESUME_FUNCTION", "resumed_function")
def test_the_code_dynamo_resumes_a_function_with_after_a_graph_break_names_it():
    def step(x):
        x = x + 1
        torch._dynamo.graph_break()
        return x * 2

    torch._dynamo.reset()
    torch.compile(step, backend="eager")(torch.ones(2))
    names = [ref().co_name for ref in private.converted_codes() if ref() is not None]
    resumed = [name for name in names if private.resumed_function(name) is not None]
    assert resumed, names
    assert {private.resumed_function(name) for name in resumed} == {"step"}
    assert private.RESUME_FUNCTION.fullmatch(resumed[0])["line"].isdigit()
    assert private.resumed_function("step") is None


@exercises("lightning_optimizers", "ddp_options", "forward_redirection")
def test_lightnings_objects_are_read_where_it_has_no_public_accessor():
    from lightning.pytorch import Trainer
    from lightning.pytorch.core.optimizer import LightningOptimizer
    from lightning.pytorch.demos.boring_classes import BoringModel
    from lightning.pytorch.strategies import DDPStrategy

    trainer = Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    model = BoringModel()
    trainer.fit(model)
    [optimizer] = private.lightning_optimizers(trainer.strategy)
    assert isinstance(optimizer, LightningOptimizer)
    assert optimizer.optimizer is trainer.optimizers[0]
    hook = lambda state, bucket: None  # noqa: E731
    strategy = DDPStrategy(find_unused_parameters=True, ddp_comm_hook=hook)
    assert private.ddp_options(strategy) == ({"find_unused_parameters": True}, hook)
    assert private.forward_redirection(trainer.strategy) is not None


@exercises("TORCH_BREAKS")
def test_torchs_own_graph_breaks_are_named_by_texts_of_dynamos_reasons():
    assert set(private.TORCH_BREAKS.values()) == {"DDP", "FSDP"}
    from torch.nn.parallel import distributed

    assert hasattr(distributed, "_inside_ddp_forward") or hasattr(
        distributed.DistributedDataParallel, "_inside_ddp_forward"
    )


def test_dynamos_per_code_state_is_changed_by_the_run_alone():
    """Dynamo's compiled entries, recompile counts and "skip" marks last the process: only the run changes them
    (``_run.py``: a frame run uncompiled for a scope, a reset now, the crowded shared code at the end), so that every
    change goes through one module; a feature says which code (the compile budget: what earlier Trainers crowded;
    compile errors: what a failed run converted). ``in_parts`` marks its own trampoline "skip", for good."""
    changed = {}
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            call = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            if (
                call
                and node.func.attr in ("reset_code", "skip_code")
                and ast.unparse(node.func.value) == "private_names"
            ):
                changed.setdefault(path.name, []).append(ast.unparse(node))
    assert set(changed) == {"_run.py", "in_parts.py"}, changed
    assert changed["in_parts.py"] == ["private_names.skip_code(_part_forward(nn.Module).__code__)"]


@exercises("CHAINED_BREAK")
def test_the_text_between_chained_graph_breaks_is_dynamos():
    import inspect as inspect_module

    from torch._dynamo import exc

    assert (private.CHAINED_BREAK in inspect_module.getsource(exc)) is TORCH_2_13  # checked on 2.6, 2.13 and 2.15


@exercises("TRAINER_LOOP_SOURCES", "DYNAMIC_SOURCES_MATCH_PATTERNS")
def test_the_trainers_loop_counters_are_named_as_dynamo_names_their_sources():
    from lightning.pytorch import LightningModule

    assert re.fullmatch(private.TRAINER_LOOP_SOURCES, "L['self']._trainer.fit_loop.epoch_progress.current.completed")
    assert not re.fullmatch(private.TRAINER_LOOP_SOURCES, "L['self'].layer.weight")
    assert "_trainer" in vars(LightningModule())  # Lightning's own attribute, which the sources go through
    assert private.DYNAMIC_SOURCES_MATCH_PATTERNS is (torch.__version__ >= "2.8")
    if private.DYNAMIC_SOURCES_MATCH_PATTERNS:
        assert isinstance(torch.compiler.config.dynamic_sources, str)
