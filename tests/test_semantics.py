"""The `use_compile` table of the README, row by row, on one device and under DDP.

| `use_compile` | model given to the Trainer | behaviour                                                     |
|---------------|----------------------------|---------------------------------------------------------------|
| `None`        | plain LightningModule      | nothing is compiled: stock Lightning                          |
| `None`        | `torch.compile(model, **kw)` | unwrap, re-apply the same kwargs after the strategy wraps   |
| `False`       | any                        | as `None`: the Trainer compiles nothing of its own            |
| `True`        | plain, or compiled alike   | compile after the wrap with torch.compile's defaults          |
| dict          | plain, or compiled alike   | the same, with these kwargs; compiled otherwise: refused      |
"""

import warnings

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from helpers import QUIET, CountingBackend, LoggingModel, StateProbe, dynamo_stats, leftovers
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities.compile import from_compiled

STRATEGIES = ["auto", "ddp"]


def fit(model, strategy, use_compile, **kwargs):
    probe = StateProbe()
    options = {**QUIET, "max_steps": 3, "limit_val_batches": 1, "num_sanity_val_steps": 0, **kwargs}
    trainer = Trainer(strategy=strategy, use_compile=use_compile, callbacks=[probe], **options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model)
    return trainer, probe.seen, [str(w.message) for w in caught]


def compiled_after_wrap(seen, strategy):
    """Whether the strategy's model was compiled after the wrap, in place, and not by Lightning's pre-wrap path."""
    state = seen["train"]
    # the steps are compiled in place with Lightning's `from_compiled`, but only after the strategy's setup; under DDP
    # (its C++ reducer) they run inside its call, which stays uncompiled
    steps = ["predict_step", "test_step", "training_step", "validation_step"]
    placed = state["compiled_steps"] == steps and state["stock_compiled"] and not seen["setup"]["stock_compiled"]
    return placed and not state["wrapper_compiled"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_none_and_plain_model_compiles_nothing(strategy):
    _, seen, _ = fit(LoggingModel(), strategy, None)
    assert seen["train"] == {
        # what the strategy runs is the module itself, or DDP around it: never a compiled wrapper in their place
        "model_type": LoggingModel if strategy == "auto" else DistributedDataParallel,
        "wrapper_compiled": False,
        "compiled_steps": [],
        "stock_compiled": False,
    }
    assert dynamo_stats().frames == 0


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_none_and_compiled_model_reapplies_its_kwargs_after_the_wrap(strategy):
    backend = CountingBackend("model_kwargs")
    compiled = torch.compile(LoggingModel(), backend=backend, dynamic=False)
    _, seen, _ = fit(compiled, strategy, None)
    assert compiled_after_wrap(seen, strategy)
    assert backend.graphs_here > 0  # the user's own backend object compiled again after the wrap, not a copy of it
    assert backend.calls > 0
    assert leftovers(compiled._orig_mod) == []


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_false_runs_a_compiled_model_as_none_does(strategy):
    # bug: `False` refused a model compiled by hand ("asks for no compile"), so a YAML `use_compile: false` added to a
    # script that passes `torch.compile(model)` broke it; `False` means the Trainer compiles nothing of its own
    runs = []
    for use_compile in (None, False):
        backend = CountingBackend(f"compiled_{use_compile}")
        compiled = torch.compile(LoggingModel(), backend=backend, dynamic=False)
        trainer, seen, messages = fit(compiled, strategy, use_compile)
        assert trainer.global_step == 3
        assert backend.calls > 0
        runs.append((seen["train"], backend.graphs, leftovers(compiled._orig_mod), messages))
    assert runs[0] == runs[1]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_none_and_a_model_compiled_with_from_compiled_is_stock_lightning(strategy):
    backend = CountingBackend("stock")
    _, seen, _ = fit(from_compiled(torch.compile(BoringModel(), backend=backend)), strategy, None)
    # stock Lightning's placement: the LightningModule's methods compiled before the wrap, never the wrapper
    assert seen["train"]["stock_compiled"]
    assert not seen["train"]["wrapper_compiled"]
    assert seen["train"]["compiled_steps"] == ["predict_step", "test_step", "training_step", "validation_step"]
    assert backend.calls > 0


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_false_and_plain_model_compiles_nothing(strategy):
    _, seen, _ = fit(LoggingModel(), strategy, False)
    assert not seen["train"]["wrapper_compiled"]
    assert seen["train"]["compiled_steps"] == []
    assert dynamo_stats().frames == 0


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("off", ["disable", "TORCHDYNAMO_DISABLE"])
def test_compiling_turned_off_as_torch_turns_it_off_trains_uncompiled_and_says_so(strategy, off, monkeypatch, caplog):
    # bug: `torch.compile` returns the module itself with `disable=True` and under `TORCHDYNAMO_DISABLE=1`, and the run
    # crashed after the strategy's setup: "`model` is required to be a `OptimizedModule`"
    backend = CountingBackend("off")
    use_compile = {"backend": backend, "disable": True} if off == "disable" else {"backend": backend}
    if off == "TORCHDYNAMO_DISABLE":
        monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    model = LoggingModel()
    with caplog.at_level("INFO"):
        trainer, seen, _ = fit(model, strategy, use_compile)
    assert trainer.global_step == 3
    assert not seen["train"]["wrapper_compiled"]
    assert seen["train"]["compiled_steps"] == []
    assert (backend.graphs, backend.calls) == (0, 0)
    why = "`use_compile={'disable': True}`" if off == "disable" else "`TORCHDYNAMO_DISABLE=1`"
    assert f"compiling is off ({why}), so this run trains uncompiled" in caplog.text
    assert leftovers(model) == []


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_dict_compiles_a_plain_model_after_the_wrap_with_its_kwargs(strategy):
    backend = CountingBackend("dict")
    model = LoggingModel()
    _, seen, _ = fit(model, strategy, {"backend": backend})
    assert compiled_after_wrap(seen, strategy)
    assert backend.graphs_here > 0  # the user's own backend object, not a copy of it
    assert backend.calls > 0
    assert leftovers(model) == []


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_dict_takes_a_compiled_model_with_its_own_arguments_and_compiles_it_once(strategy):
    backend = CountingBackend("same_arguments")
    compiled = torch.compile(LoggingModel(), backend=backend)
    _, seen, messages = fit(compiled, strategy, {"backend": backend})
    assert compiled_after_wrap(seen, strategy)
    assert backend.graphs_here > 0  # the user's own backend object, not a copy of it
    assert backend.calls > 0
    assert not any("use_compile" in m for m in messages)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_dict_refuses_a_compiled_model_with_other_arguments_before_the_run(strategy):
    model_backend, trainer_backend = CountingBackend("model"), CountingBackend("trainer")
    model = LoggingModel()
    weights = model.layer.weight.detach().clone()
    trainer = Trainer(strategy=strategy, use_compile={"backend": trainer_backend}, **QUIET)
    with pytest.raises(ValueError, match=r"compiled with `torch.compile\(model, \*\*\{'backend': .*`model._orig_mod`"):
        trainer.fit(torch.compile(model, backend=model_backend))
    assert trainer.global_step == 0
    assert torch.equal(weights, model.layer.weight)
    assert model_backend.graphs == trainer_backend.graphs == 0


@pytest.mark.slow
def test_true_uses_torch_compile_defaults(tmp_path, monkeypatch):
    """`True` means inductor, torch.compile's default backend; the generated code must run and train."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model = BoringModel()
    before = model.layer.weight.detach().clone()
    _, seen, _ = fit(model, "auto", True, max_steps=2)
    assert compiled_after_wrap(seen, "auto")
    assert dynamo_stats().graphs >= 1
    assert not torch.equal(before, model.layer.weight)


def test_model_compiled_before_lightning_was_imported_keeps_stock_behaviour():
    backend = CountingBackend("unknown_kwargs")
    compiled = torch.compile(BoringModel(), backend=backend)
    # what a compile before `import lightning` looks like: no arguments recorded (torch 2.6 keeps attributes set on
    # the compiled module on the module inside it)
    for holder in (compiled, compiled._orig_mod):
        holder.__dict__.pop("_compile_kwargs", None)
    _, seen, messages = fit(compiled, "auto", None)
    assert seen["train"]["stock_compiled"]
    # as stock Lightning, with no warning: only a launcher that pickles the model (`ddp_spawn`) warns, since it fails
    assert not any("arguments are unknown" in m for m in messages)
