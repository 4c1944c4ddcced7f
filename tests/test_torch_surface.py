"""The private torch surface the package reads and changes: one entry each, with the torch versions it is read on.

Each feature reaches its entries where it uses them: each fork rung of ``patches/`` applies alone on the seam, so the
rungs share no module of torch internals. This file is the one list: every entry, what the package does with it, and
the torch versions the package reads it on (where the code checks for it with ``hasattr``/``getattr``, the range says
which torch has it). Each test exercises an entry the way the package uses it, on the torch it runs on: CI runs this
file on 2.13.0 (``tests``), 2.6.0 and 2.14.1 (``tests_torch``); other versions in a range were not run this way.
``test_every_private_name_the_package_reads_is_listed`` fails when the code reaches a private name not listed here.
"""

import importlib
import logging
import re
from pathlib import Path

import pytest
import torch
from torch._dynamo.convert_frame import input_codes
from torch._dynamo.utils import counters

from helpers import TORCH_2_13

SRC = Path(__file__).parents[1] / "src" / "lightning_compile_patch"
TORCH_2_7 = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 7)

#: name: (what the package does with it, where, the torch versions the package reads it on).
SURFACE = {
    "torch._dynamo.OptimizedModule": ("unwraps a compiled input; its `_orig_mod`", "connector, fixes", "2.1-2.14"),
    "torch._dynamo.config.optimize_ddp": (
        "chosen per run by world size",
        "optimize_ddp, compiled_autograd",
        "2.1-2.14",
    ),
    "torch._dynamo.config.suppress_errors": ("read: a hidden error is named so", "run_summary", "2.1-2.14"),
    "torch._dynamo.config.recompile_limit": (
        "read: the limit a warning names (2.7+)",
        "run_summary, budget",
        "2.7-2.14",
    ),
    "torch._dynamo.config.cache_size_limit": ("the same before 2.7", "run_summary, compile_budget", "2.1-2.6"),
    "torch._dynamo.convert_frame.input_codes": ("the code each run converted", "compile_budget, errors", "2.1-2.14"),
    "torch._dynamo.utils.counters": ("graphs, graph breaks, compiled autograd", "run_summary, autograd", "2.1-2.14"),
    "torch._dynamo.utils.get_compilation_metrics": ("why a frame failed; compile time", "summary, budget", "2.2-2.14"),
    "torch._dynamo.exc": ("what a compile error is", "compile_errors", "2.1-2.14"),
    "torch._dynamo.trace_rules.LEGACY_MOD_INLINELIST": ("DDP's file traced, undone", "compiled_autograd", "2.6-2.14"),
    "torch._dynamo.trace_rules.get_legacy_mod_inlinelist": ("its cache cleared", "compiled_autograd", "2.6-2.14"),
    "torch._dynamo.__file__": ("its folder: an error raised inside Dynamo is torch's", "compile_errors", "2.1-2.14"),
    "torch._dynamo.eval_frame.skip_code": ("`self.log` never traced", "log_deferral", "2.13-2.14"),
    "torch._dynamo.compiled_autograd": ("`_enable` per step", "compiled_autograd", "2.6-2.14"),
    "torch._C._dynamo.eval_frame.reset_code": ("a code's entries and skip mark", "budget, errors, log", "2.1-2.14"),
    "torch._C._dynamo.eval_frame.skip_code": ("the same, where the one above is missing", "log_deferral", "2.1-2.12"),
    "torch._C._dynamo.eval_frame._debug_get_cache_entry_list": ("a code's entries", "compile_budget", "2.1-2.14"),
    "torch._TorchCompileWrapper": ("the counting backend's inner backend", "run_summary", "2.1-2.14"),
    "torch._TorchCompileInductorWrapper": ("the same for inductor", "run_summary", "2.1-2.14"),
    "torch._functorch.config": ("`force_non_lazy_backward_lowering` per run (2.13+)", "compile_errors", "2.13-2.14"),
    "torch._inductor.config": ("compiled autograd's settings, per run", "compiled_autograd", "2.6-2.14"),
    "torch._inductor.runtime.cache_dir_utils": ("`default_cache_dir`", "cache (torch 2.7+)", "2.7-2.14"),
}

#: Local names the package binds to a private module, and the module: `dynamo_config.optimize_ddp` reads
#: `torch._dynamo.config.optimize_ddp`.
ALIASES = {
    "dynamo_config": "torch._dynamo.config",
    "functorch_config": "torch._functorch.config",
    "inductor_config": "torch._inductor.config",
    "eval_frame": "torch._C._dynamo.eval_frame",
    "compiled_autograd": "torch._dynamo.compiled_autograd",
}


def resolve(name: str):
    """The object a dotted name names, importing modules as needed."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for part in parts[split:]:
            value = getattr(value, part)
        return value
    raise ImportError(name)


def read_names() -> set[str]:
    """Every private torch name the package's code reaches (comments and strings aside: code lines only)."""
    names = set()
    for path in SRC.rglob("*.py"):
        for line in path.read_text().splitlines():
            code = re.sub(r"#.*|\"[^\"]*\"|'[^']*'|``[^`]*``", "", line)
            names |= set(re.findall(r"torch(?:\._C)?\._[A-Za-z]\w*(?:\.\w+)*", code))
            for alias, module in ALIASES.items():
                names |= {f"{module}.{attr}" for attr in re.findall(rf"\b{alias}\.(\w+)", code)}
    return names


def listed(name: str) -> bool:
    return any(name == entry or name.startswith(entry + ".") or entry.startswith(name + ".") for entry in SURFACE)


def test_every_private_name_the_package_reads_is_listed():
    unlisted = sorted(name for name in read_names() if not listed(name))
    assert not unlisted, f"list these in SURFACE, with the torch versions they were read in: {unlisted}"


@pytest.mark.parametrize("name", sorted(SURFACE))
def test_each_listed_name_exists_on_the_torch_it_is_read_in(name):
    versions = SURFACE[name][2]
    low, high = versions.split("-")
    major_minor = tuple(int(part) for part in torch.__version__.split(".")[:2])
    if not tuple(map(int, low.split("."))) <= major_minor <= tuple(map(int, high.split("."))):
        pytest.skip(f"{name} is read on torch {versions}")
    if name.endswith("skip_code"):  # either one: the package takes the Python one where it exists
        assert getattr(torch._dynamo.eval_frame, "skip_code", None) or torch._C._dynamo.eval_frame.skip_code
        return
    assert resolve(name) is not None


def compiled_once(fn):
    compiled = torch.compile(fn, backend="eager")
    compiled(torch.ones(2))
    return compiled


def test_reset_code_drops_a_codes_entries_and_the_entry_list_shows_it():
    def f(x):
        return x + 1

    compiled_once(f)
    eval_frame = torch._C._dynamo.eval_frame
    assert len(eval_frame._debug_get_cache_entry_list(f.__code__)) == 1
    eval_frame.reset_code(f.__code__)
    assert len(eval_frame._debug_get_cache_entry_list(f.__code__)) == 0


def test_skip_code_keeps_dynamo_out_of_a_function_and_reset_code_lets_it_in_again():
    def inner(x):
        return x * 2

    def outer(x):
        return inner(x) + 1

    skip = getattr(torch._dynamo.eval_frame, "skip_code", None) or torch._C._dynamo.eval_frame.skip_code
    skip(inner.__code__)
    graphs = counters["stats"]["unique_graphs"]
    compiled_once(outer)
    # inner was not inlined: outer's graph broke at the call, and inner ran as plain Python
    assert counters["stats"]["unique_graphs"] - graphs >= 1
    assert len(torch._C._dynamo.eval_frame._debug_get_cache_entry_list(inner.__code__)) == 0
    torch._C._dynamo.eval_frame.reset_code(inner.__code__)


def test_input_codes_lists_each_converted_code_as_a_weak_reference():
    def f(x):
        return x - 1

    before = len(input_codes.seen)
    compiled_once(f)
    assert f.__code__ in [ref() for ref in input_codes.seen[before:]]


def test_counters_count_unique_graphs_and_graph_breaks_by_reason():
    def f(x):
        x = x + 1
        torch._dynamo.graph_break()
        return x + 1

    graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    compiled_once(f)
    assert counters["stats"]["unique_graphs"] - graphs == 2
    assert sum(counters["graph_break"].values()) - breaks == 1
    assert all(isinstance(reason, str) for reason in counters["graph_break"])


@pytest.mark.skipif(not TORCH_2_13, reason="2.6 records a frame skipped for a graph break in a loop as no failure")
def test_compilation_metrics_name_a_failed_frame_and_when_it_was_compiled():
    def f(x):
        for _ in range(2):
            print(end="")  # a graph break in a loop: Dynamo skips the frame
            x = x + 1
        return x

    compiled_once(f)
    (metrics,) = [m for m in torch._dynamo.utils.get_compilation_metrics() if m.co_name == "f" and m.fail_type]
    assert (metrics.co_filename, metrics.co_firstlineno) == (__file__, f.__code__.co_firstlineno)
    assert (getattr(metrics, "start_time_us", None) or metrics.start_time) > 0
    assert "loop" in metrics.fail_reason.lower()  # the cause run_summary reads


def test_the_recompile_limit_is_told_on_the_convert_frame_logger():
    limit = "recompile_limit" if TORCH_2_7 else "cache_size_limit"
    records = []

    class Keep(logging.Filter):
        def filter(self, record):
            records.append(record.getMessage())
            return True

    def f(x, n):
        return x + n

    logger, keep = logging.getLogger("torch._dynamo.convert_frame"), Keep()
    logger.addFilter(keep)
    try:
        with torch._dynamo.config.patch(**{limit: 2}):
            compiled = torch.compile(f, backend="eager", dynamic=False)
            for n in range(4):
                compiled(torch.ones(2), n)
    finally:
        logger.removeFilter(keep)
    assert any("hit config." in message and limit in message for message in records), records


def test_the_compile_wrappers_build_a_backend_from_the_given_arguments():
    eager = torch._TorchCompileWrapper("eager", None, None, None)
    inductor = torch._TorchCompileInductorWrapper(None, None, None)
    assert callable(eager)
    assert callable(inductor)


def test_dynamos_errors_are_the_hierarchy_compile_errors_tells_apart():
    exc = torch._dynamo.exc
    assert issubclass(exc.TorchRuntimeError, exc.TorchDynamoException)
    assert issubclass(exc.InternalTorchDynamoError, exc.TorchDynamoException)
