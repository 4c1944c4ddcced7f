"""The private torch surface: every private name of torch the features reach is in one module, and each entry works.

``compile_features/_torch_surface.py`` holds each private torch name (and DDP's private attributes) that a feature
needs, behind a function or constant named for what the feature does with it. These tests call each entry the way the
features do, on the torch they run on: CI runs this file on 2.13.0 (``tests``) and 2.6.0 (``tests_torch``), 2.14.1 and
2.9.1 run by hand, and ``tools/tests/test_patchset.py`` checks that the module goes upstream with the seam. A new entry
without a test here, or a private name reached outside the module, fails ``test_every_entry_is_exercised`` or
``test_no_feature_reaches_a_private_torch_name_but_through_the_surface``.
"""

import ast
import inspect
import logging
import os
import re
import sys
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from helpers import TORCH_2_7, TORCH_2_13, lightning_side

surface = lightning_side("_torch_surface")
#: The modules of the change: the package's, or on a patched Lightning the connector and the feature modules.
FEATURES_DIR = Path(surface.__file__).parent
SOURCES = (
    list(FEATURES_DIR.parent.rglob("*.py"))
    if FEATURES_DIR.parent.name == "lightning_compile_patch"
    else [*FEATURES_DIR.glob("*.py"), FEATURES_DIR.parent / "compile_connector.py"]
)
TORCH_2_6 = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 6)

#: Private names of torch outside the surface module, by file: Lightning's own `utilities/compile.py` imports
#: `OptimizedModule` from `torch._dynamo` (there is no public name for the class `torch.compile` returns).
ALLOWED_OUTSIDE = {
    "lightning_fixes.py": {"torch._dynamo.OptimizedModule"},
    "compile_connector.py": {"torch._dynamo.OptimizedModule"},
}
#: DDP's private attributes, which only the surface reads.
DDP_PRIVATE = ("_use_python_reducer", "_accum_grad_hooks", "_check_sync_bufs_pre_fwd", "_check_sync_bufs_post_fwd")
DDP_PRIVATE += ("_sync_buffers",)

EXERCISED: set[str] = set()


def exercises(*entries: str):
    """Marks a test as the one that calls ``entries`` of the surface."""
    EXERCISED.update(entries)
    return lambda test: test


def code_lines(path: Path) -> list[str]:
    """The lines of ``path`` without docstrings, strings and comments."""
    source = path.read_text()
    tree = ast.parse(source)
    strings = {
        line
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        for line in range(node.lineno, (node.end_lineno or node.lineno) + 1)
        if node.lineno != node.end_lineno  # a docstring or other multi-line string: all of its lines
    }
    lines = source.splitlines()
    return [
        re.sub(r"#.*|\"[^\"]*\"|'[^']*'", "", line) for number, line in enumerate(lines, 1) if number not in strings
    ]


def test_no_feature_reaches_a_private_torch_name_but_through_the_surface():
    reached = {}
    assert len(SOURCES) > 10
    for path in SOURCES:
        if path.name == "_torch_surface.py":
            continue
        for line in code_lines(path):
            imported = re.match(r"\s*from (torch\S*) import (.*)", line)
            names = re.findall(r"torch(?:\._C)?\._[A-Za-z]\w*(?:\.\w+)*", line)
            if imported and names:  # `from torch._dynamo import OptimizedModule`: the names it binds
                names = [f"{imported[1]}.{name.split(' as ')[0].strip()}" for name in imported[2].split(",")]
            for name in names:
                if name not in ALLOWED_OUTSIDE.get(path.name, ()):
                    reached.setdefault(name, path.name)
            for name in re.findall(rf"\.({'|'.join(DDP_PRIVATE)})\b", line):
                reached.setdefault(f"DistributedDataParallel.{name}", path.name)
    assert not reached, f"reach these through compile_features/_torch_surface.py: {reached}"


def test_every_entry_is_exercised():
    entries = {
        name
        for name, value in vars(surface).items()
        if (inspect.isfunction(value) and value.__module__ == surface.__name__ and not name.startswith("_"))
        or (name.isupper() and not name.startswith("_"))
        or name.endswith("_config")
    }
    assert len(entries) > 20
    assert entries - EXERCISED == set(), "each entry of the surface needs a test here that calls it"


def compiled_once(fn, *args):
    compiled = torch.compile(fn, backend="eager")
    compiled(*(args or (torch.ones(2),)))
    return compiled


@exercises("dynamo_config", "functorch_config", "inductor_config")
def test_the_settings_the_features_change_are_there():
    assert surface.dynamo_config.optimize_ddp in (True, False, "ddp_optimizer", "python_reducer", "no_optimization")
    assert isinstance(surface.dynamo_config.suppress_errors, bool)
    if TORCH_2_13:
        assert isinstance(surface.functorch_config.force_non_lazy_backward_lowering, bool)
    if TORCH_2_6:  # what building a DDP under the python reducer sets
        assert hasattr(surface.inductor_config, "_fuse_ddp_communication")
        assert hasattr(surface.inductor_config, "_fuse_ddp_bucket_size")


@exercises("RECOMPILE_LIMIT", "recompile_limit", "errors_suppressed", "NON_LAZY_BACKWARD")
def test_the_settings_read_are_read_from_dynamo():
    name = surface.RECOMPILE_LIMIT
    assert name == ("recompile_limit" if TORCH_2_7 else "cache_size_limit")
    with torch._dynamo.config.patch(**{surface.RECOMPILE_LIMIT: 3}, suppress_errors=True):
        assert surface.recompile_limit() == 3
        assert surface.errors_suppressed() is True
    assert surface.NON_LAZY_BACKWARD is TORCH_2_13


@exercises("RECOMPILE_LIMIT_LOGGER", "is_recompile_limit_hit")
def test_a_recompile_limit_hit_is_told_on_the_logger_in_words_the_surface_knows():
    records = []

    class Keep(logging.Filter):
        def filter(self, record):
            records.append(record.getMessage())
            return True

    def f(x, n):
        return x + n

    logger, keep = logging.getLogger(surface.RECOMPILE_LIMIT_LOGGER), Keep()
    logger.addFilter(keep)
    try:
        with torch._dynamo.config.patch(**{surface.RECOMPILE_LIMIT: 2}):
            compiled = torch.compile(f, backend="eager", dynamic=False)
            for n in range(4):
                compiled(torch.ones(2), n)
    finally:
        logger.removeFilter(keep)
    assert [message for message in records if surface.is_recompile_limit_hit(message)], records
    assert not surface.is_recompile_limit_hit("hit a graph break")


@exercises("graphs_compiled", "graph_breaks")
def test_the_counters_count_graphs_and_graph_breaks_by_reason():
    def f(x):
        x = x + 1
        torch._dynamo.graph_break()
        return x + 1

    graphs, breaks = surface.graphs_compiled(), surface.graph_breaks()
    compiled_once(f)
    assert surface.graphs_compiled() - graphs == 2
    after = surface.graph_breaks()
    assert sum(after.values()) - sum(breaks.values()) == 1
    assert all(isinstance(reason, str) for reason in after)


@exercises("compilation_metrics", "started_us")
def test_compilation_metrics_name_each_frame_and_when_it_was_compiled():
    def f(x):
        return x * 3

    since_us = surface.started_us(surface.compilation_metrics()[-1]) if surface.compilation_metrics() else 0
    compiled_once(f)
    (metrics,) = [m for m in surface.compilation_metrics() if m.co_name == "f" and surface.started_us(m) >= since_us]
    assert (metrics.co_filename, metrics.co_firstlineno) == (__file__, f.__code__.co_firstlineno)
    assert surface.started_us(metrics) > 1e15  # microseconds since the epoch
    assert not metrics.fail_type


@pytest.mark.skipif(not TORCH_2_13, reason="2.6 records a frame skipped for a graph break in a loop as no failure")
@exercises("compilation_metrics")
def test_compilation_metrics_give_dynamos_reason_for_a_skipped_frame():
    def f(x):
        for _ in range(2):
            print(end="")  # a graph break in a loop: Dynamo skips the frame
            x = x + 1
        return x

    compiled_once(f)
    (metrics,) = [m for m in surface.compilation_metrics() if m.co_name == "f" and m.fail_type]
    assert "loop" in metrics.fail_reason.lower()  # the cause the summary reads


@exercises("converted_codes", "cache_entries", "reset_code", "per_code_reset")
def test_each_converted_code_is_listed_and_can_be_reset():
    assert surface.per_code_reset()

    def f(x):
        return x - 1

    before = len(surface.converted_codes())
    compiled_once(f)
    assert f.__code__ in [ref() for ref in surface.converted_codes()[before:]]
    assert surface.cache_entries(f.__code__) == 1
    surface.reset_code(f.__code__)
    assert surface.cache_entries(f.__code__) == 0


@pytest.mark.parametrize("name", ["_debug_get_cache_entry_list", "reset_code"])
def test_without_either_private_name_there_is_no_per_code_reset(monkeypatch, name):
    monkeypatch.delattr(torch._C._dynamo.eval_frame, name)
    assert not surface.per_code_reset()


@exercises("skip_code")
def test_a_skipped_code_runs_uncompiled_as_a_frame_of_its_own_and_reset_lets_it_in_again():
    def inner(x):
        return x * 2

    surface.skip_code(inner.__code__)
    compiled_once(inner)
    assert surface.cache_entries(inner.__code__) == 0
    surface.reset_code(inner.__code__)
    compiled_once(inner)
    assert surface.cache_entries(inner.__code__) == 1
    surface.reset_code(inner.__code__)


@exercises("backend", "OUTPUT_CODES")
def test_a_wrapped_backend_compiles_and_its_graphs_run_from_dynamos_output_code():
    ran_from_output_code = []

    def counting(gm, example_inputs):
        inner = surface.backend("eager", None, None, None)(gm, example_inputs)

        def run(*args):
            frames = [sys._getframe(depth).f_code for depth in range(1, 6)]
            ran_from_output_code.append(any(code in surface.OUTPUT_CODES for code in frames))
            return inner(*args)

        return run

    def f(x):
        return torch.sin(x) + 1

    assert torch.equal(torch.compile(f, backend=counting)(torch.ones(2)), f(torch.ones(2)))
    assert ran_from_output_code == [True]
    assert callable(surface.backend(None, None, None, None))  # inductor's, built lazily


@exercises("COMPILE_ERRORS", "DYNAMO_DIR")
def test_a_failed_compile_raises_one_of_dynamos_errors_from_dynamos_own_code():
    def f(x):
        torch._dynamo.graph_break()
        return x

    with pytest.raises(surface.COMPILE_ERRORS) as raised:
        torch.compile(f, backend="eager", fullgraph=True)(torch.ones(2))
    assert os.path.isfile(os.path.join(surface.DYNAMO_DIR, "convert_frame.py"))
    frames = traceback.extract_tb(raised.value.__traceback__)
    assert any(frame.filename.startswith(surface.DYNAMO_DIR) for frame in frames)


@exercises("compiler_disabled")
def test_a_function_marked_compiler_disable_is_told_with_its_reason():
    def f(x):
        return x

    assert surface.compiler_disabled(f) is None
    assert surface.compiler_disabled(torch.compiler.disable(f)) == ""
    if TORCH_2_7:  # `reason` is torch 2.7's
        assert surface.compiler_disabled(torch.compiler.disable(f, reason="a reason")) == "a reason"


@exercises("BACKEND_FAILED")
def test_a_backend_that_raises_fails_the_compile_with_dynamos_backend_error():
    def exploding(gm, example_inputs):
        raise RuntimeError("backend exploded")

    with pytest.raises(surface.BACKEND_FAILED, match="backend exploded"):
        torch.compile(lambda x: torch.sin(x) + 1, backend=exploding)(torch.ones(2))


@exercises("WRAPPING_ERRORS")
def test_a_type_error_of_a_builtin_dynamo_evaluates_reaches_the_caller_wrapped_by_dynamo():
    def f(x):
        return isinstance(x, list[int])  # raises TypeError, while Dynamo evaluates it

    with pytest.raises(surface.WRAPPING_ERRORS) as raised:
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
    switch = surface.compiled_autograd_switch()
    assert switch is not None
    layer = nn.Linear(3, 1)
    before = surface.backward_graphs_compiled()
    with switch(torch.compile(backend="eager")):
        layer(torch.ones(2, 3)).sum().backward()
    assert surface.backward_graphs_compiled() - before == 1
    assert layer.weight.grad is not None


@pytest.mark.skipif(not TORCH_2_6, reason="DDP's python reducer is read on torch 2.6-2.14")
@exercises("ddp_uses_python_reducer", "ddp_file_traced", "stop_tracing_ddp_file", "remove_reducer_hooks")
@exercises("sync_ddp_buffers")
def test_ddp_built_under_the_python_reducer_is_told_synced_and_undone(tmp_path):
    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        traced_before = surface.ddp_file_traced()
        plain = nn.parallel.DistributedDataParallel(nn.BatchNorm1d(2))
        assert not surface.ddp_uses_python_reducer(plain)
        assert not surface.ddp_uses_python_reducer(nn.BatchNorm1d(2))  # no DDP at all
        # building DDP under the python reducer sets inductor's DDP fusion for the process: the patch puts it back
        fusion = {
            name: getattr(surface.inductor_config, name)
            for name in ("_fuse_ddp_communication", "_fuse_ddp_bucket_size")
        }
        with torch._dynamo.config.patch(optimize_ddp="python_reducer"), surface.inductor_config.patch(fusion):
            wrapper = nn.parallel.DistributedDataParallel(nn.BatchNorm1d(2))
        assert surface.ddp_uses_python_reducer(wrapper)
        assert surface.ddp_file_traced()
        for before in (True, False):
            surface.sync_ddp_buffers(wrapper, before=before)  # one rank: a broadcast to itself
        assert wrapper._accum_grad_hooks
        surface.remove_reducer_hooks(wrapper)
        assert not wrapper._accum_grad_hooks
        if not traced_before:
            surface.stop_tracing_ddp_file()
            assert not surface.ddp_file_traced()
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not TORCH_2_7, reason="inductor's default cache directory is read on torch 2.7-2.14")
@exercises("inductor_default_cache_dir")
def test_inductors_default_cache_directory_is_a_path():
    assert os.path.isabs(surface.inductor_default_cache_dir())
