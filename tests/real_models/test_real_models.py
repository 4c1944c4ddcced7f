"""Model families users train with Lightning, trained through the Trainer with ``use_compile`` (issue 9, item 3).

For each family, whole-model and ``regions="auto"``, on one CPU device and under DDP with one process (gloo), a few
training steps with an ``aot_eager`` backend that counts what it runs. Each case checks:

* every training step ran compiled: every trainable parameter of the model went into a compiled graph in every step
  (a block that Dynamo left to run eagerly keeps its parameters out);
* no graph break that plain ``torch.compile(forward_and_loss, backend="aot_eager")`` of the same model does not also
  have, besides DDP's own (``helpers.DDP_BREAKS``) and the region boundaries;
* no recompile-limit hit;
* each step's loss equals the eager Trainer run's with the same seed (``aot_eager``: to 1e-6).
"""

import importlib.util
import re

import pytest
import torch
from real_model_kit import (
    CountingAotEager,
    PlainCompile,
    StepProbe,
    dynamo_recompile_limit_hits,
    eager_losses,
    fit,
    fresh_dynamo,
    plain_compile,
    unexpected_breaks,
)
from real_model_zoo import FAMILIES, HFModule, causal_lm_sample, llama
from torch._dynamo.utils import counters, get_compilation_metrics

from helpers import lightning_side

pytestmark = [pytest.mark.real_models, pytest.mark.timeout(600)]

STEPS = 3
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None

_PLAIN: dict[str, PlainCompile] = {}
_EAGER: dict[tuple[str, str], list[float]] = {}


def plain(family: str) -> PlainCompile:
    if family not in _PLAIN:
        spec = FAMILIES[family]
        _PLAIN[family] = plain_compile(spec.make_module, spec.forward_and_loss, spec.batch())
    return _PLAIN[family]


def reference_losses(family: str, strategy: str) -> list[float]:
    if (family, strategy) not in _EAGER:
        _EAGER[family, strategy] = eager_losses(FAMILIES[family].make_module, strategy, STEPS)
    return _EAGER[family, strategy]


def describe(names: list[str]) -> str:
    """``names``, counted, by the modules that own them: ``72 in model.model.layers.8, ..., model.model.layers.15``."""
    owners = list(dict.fromkeys(_owner(name) for name in names))
    shown = owners if len(owners) <= 4 else [*owners[:2], "...", *owners[-2:]]
    return f"{len(names)} in {', '.join(shown)}" if names else "no compiled graph ran"


def _owner(name: str) -> str:
    """The block a parameter belongs to (the path up to its first index), else its module."""
    block = re.match(r"^(.*?\.\d+)\.", name)
    return block.group(1) if block else name.rpartition(".")[0]


@pytest.mark.parametrize("strategy", ["auto", "ddp"], ids=["single", "ddp1"])
@pytest.mark.parametrize("regions", [None, "auto"], ids=["whole", "regions"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_trains_compiled_like_eager(family, regions, strategy, limit_hits):
    if FAMILIES[family].needs_transformers and not HAS_TRANSFORMERS:
        pytest.skip("needs `transformers` (the real-model test extra)")
    reference = plain(family)
    eager = reference_losses(family, strategy)

    fresh_dynamo()
    backend = CountingAotEager(f"{family}-{regions}-{strategy}")
    use_compile = {"backend": backend} if regions is None else {"backend": backend, "regions": regions}
    probe = StepProbe(backend)
    trainer = fit(FAMILIES[family].make_module, strategy, STEPS, use_compile, probe)

    problems = {}
    if len(probe.losses) != STEPS:
        problems["steps"] = len(probe.losses)
    for step, (calls, uncompiled) in enumerate(zip(probe.graph_calls, probe.uncompiled_params, strict=True)):
        missed = [name for name in uncompiled if name in reference.compiled_params]  # in the model's order
        if not calls or missed:
            problems[f"step {step}: parameters that reached no compiled graph"] = describe(missed)
    extra = unexpected_breaks(set(counters["graph_break"]), reference.breaks)
    if extra:
        problems["graph breaks plain torch.compile does not have"] = sorted(extra)
    hits = limit_hits(trainer)
    if hits or dynamo_recompile_limit_hits():
        problems["recompile-limit hits"] = f"{hits}; Dynamo's counters: {dynamo_recompile_limit_hits()}"
    try:
        torch.testing.assert_close(probe.losses, eager, rtol=1e-6, atol=1e-7)
    except AssertionError as err:
        problems["losses differ from eager"] = f"{probe.losses} vs {eager}: {err}"
    if problems:
        problems["compiled-graph calls of the last step, per frame"] = probe.calls_by_code(-1)
    assert not problems, "\n".join(f"{key}: {value}" for key, value in problems.items())


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="needs `transformers` (the real-model test extra)")
@pytest.mark.parametrize("call_kwargs", [{}, {"use_cache": False}], ids=["as_called", "use_cache_false"])
def test_deep_llama_compiles_every_block_with_regions(call_kwargs, limit_hits):
    """A 32-layer HF Llama under `regions="auto"`: every block compiled, none more than once, none left eager.

    Called as users call it, the model builds a `DynamicCache` in training and every layer indexes it with its own
    `layer_idx`. Sharing one compiled block, each layer recompiled it until Dynamo's recompile limit (8) left the
    deeper layers eager (issue 11). The layers differ in `layer_idx`, so each is compiled on its own.
    """
    layers = 32
    make_module = lambda: HFModule(lambda: llama(layers), causal_lm_sample, **call_kwargs)  # noqa: E731
    eager = eager_losses(make_module, "auto", STEPS)

    fresh_dynamo()
    backend = CountingAotEager(f"llama{layers}-{call_kwargs}")
    probe = StepProbe(backend)
    trainer = fit(make_module, "auto", STEPS, {"backend": backend, "regions": "auto"}, probe)

    # each block that differs in `layer_idx` is compiled from a code object of its own, a copy of regions' trampoline,
    # as is each module around the blocks: one compile each, training only, one batch shape, no recompiles
    regions = lightning_side("regions")
    module = trainer.lightning_module
    blocks = regions._find_regions(module, "auto")
    around = regions._rest_of_model(module, blocks)
    trampoline = regions._region_call(lambda: None, own_code=False).__code__
    where = (trampoline.co_name, trampoline.co_filename, trampoline.co_firstlineno)
    region_compiles = sum(1 for m in get_compilation_metrics() if (m.co_name, m.co_filename, m.co_firstlineno) == where)
    problems = {}
    if len(blocks) != layers or region_compiles != layers + len(around):
        problems["compiles of the regions (blocks, modules around them)"] = (region_compiles, layers, len(around))
    for step, uncompiled in enumerate(probe.uncompiled_params):
        if uncompiled:
            problems[f"step {step}: parameters that reached no compiled graph"] = describe(uncompiled)
    hits = limit_hits(trainer)
    if hits or dynamo_recompile_limit_hits():
        problems["recompile-limit hits"] = f"{hits}; Dynamo's counters: {dynamo_recompile_limit_hits()}"
    try:
        torch.testing.assert_close(probe.losses, eager, rtol=1e-6, atol=1e-7)
    except AssertionError as err:
        problems["losses differ from eager"] = f"{probe.losses} vs {eager}: {err}"
    assert not problems, "\n".join(f"{key}: {value}" for key, value in problems.items())
