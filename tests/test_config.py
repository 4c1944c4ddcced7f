"""`Trainer(use_compile=...)` rejects bad input at construction, with an error that names the problem and the fix."""

import pytest
import torch

from helpers import QUIET, connector_module
from lightning.pytorch import Trainer
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.strategies import Strategy


def record_compile_calls(monkeypatch):
    """From now on, records the arguments of every `torch.compile` call, and compiles with the `eager` backend."""
    calls = []
    compile_ = torch.compile

    def recording(model=None, **kwargs):
        # the run summary counts compiled steps through a backend that stands for the given backend, mode and options
        given = getattr(kwargs.get("backend"), "given", None)
        calls.append({**{k: v for k, v in kwargs.items() if k != "backend"}, **given} if given is not None else kwargs)
        kept = {key: value for key, value in kwargs.items() if key not in ("backend", "mode", "options")}
        return compile_(model, backend="eager", **kept)

    monkeypatch.setattr(torch, "compile", recording)
    return calls


@pytest.mark.parametrize(
    ("value", "compile_kwargs"),
    [
        (True, {}),
        ({}, {}),
        (False, None),
        (None, None),
        ({"backend": "eager"}, {"backend": "eager"}),
        ({"backend": "aot_eager", "dynamic": False}, {"backend": "aot_eager", "dynamic": False}),
    ],
)
def test_accepts_bool_none_and_dict_and_compiles_with_exactly_its_arguments(value, compile_kwargs, monkeypatch):
    trainer = Trainer(use_compile=value, max_steps=1, limit_val_batches=0, **QUIET)
    calls = record_compile_calls(monkeypatch)
    trainer.fit(BoringModel())
    if compile_kwargs is None:
        assert calls == []  # None with a plain model, and False: nothing compiled
    else:
        assert calls
        assert all(kwargs == compile_kwargs for kwargs in calls), calls  # nothing added, dropped or changed


@pytest.mark.parametrize("value", [1, 0, "true", ["eager"], 1.0, object()])
def test_rejects_other_types(value):
    with pytest.raises(TypeError, match=r"use_compile=.*pass `True`, `False`, `None` or a dict"):
        Trainer(use_compile=value, **QUIET)


def test_unknown_key_lists_the_valid_keys_and_suggests_one():
    with pytest.raises(ValueError, match="unknown key 'backedn'") as err:
        Trainer(use_compile={"backedn": "eager"}, **QUIET)
    message = str(err.value)
    assert "Did you mean 'backend'?" in message
    for key in ("backend", "mode", "fullgraph", "dynamic", "options", "disable", "optimize_ddp", "fallback"):
        assert repr(key) in message


def test_unknown_backend_lists_the_registered_ones():
    with pytest.raises(ValueError, match=r"refuses.*'indcutor'.*list_backends.*Did you mean 'inductor'"):
        Trainer(use_compile={"backend": "indcutor"}, **QUIET)


def test_backend_may_be_a_callable_and_its_compiled_code_runs():
    compiled, ran = [], []

    def backend(gm, example_inputs):
        compiled.append(gm)

        def run(*args):
            ran.append(len(compiled))
            return gm.forward(*args)

        return run

    Trainer(use_compile={"backend": backend}, max_steps=1, limit_val_batches=0, **QUIET).fit(BoringModel())
    assert compiled  # the callable itself compiled the graphs
    assert ran  # and what it returned ran


def test_backend_of_wrong_type():
    with pytest.raises(TypeError, match="backend name or a callable"):
        Trainer(use_compile={"backend": 3}, **QUIET)


def test_unknown_mode_lists_the_modes():
    with pytest.raises(ValueError, match=r"refuses.*mode=fast") as err:
        Trainer(use_compile={"mode": "fast"}, **QUIET)
    assert "max-autotune" in str(err.value)
    assert "reduce-overhead" in str(err.value)


def test_mode_and_options_together():
    with pytest.raises(ValueError, match=r"refuses.*mode or options"):
        Trainer(use_compile={"mode": "max-autotune", "options": {"max_autotune": True}}, **QUIET)


def test_unknown_inductor_option():
    with pytest.raises(ValueError, match=r"refuses.*option shape_paddin"):
        Trainer(use_compile={"options": {"shape_paddin": True}}, **QUIET)


def test_what_torch_compile_accepts_passes():
    Trainer(use_compile={"options": {"max_autotune": True, "epilogue_fusion": False}}, **QUIET)
    Trainer(use_compile={"mode": "max-autotune-no-cudagraphs", "dynamic": False}, **QUIET)
    if hasattr(torch.compiler, "skip_guard_on_all_nn_modules_unsafe"):  # `guard_filter_fn` is torch's, not inductor's
        guard_filter = torch.compiler.skip_guard_on_all_nn_modules_unsafe
        Trainer(use_compile={"options": {"guard_filter_fn": guard_filter}}, **QUIET)


def test_options_of_other_backends_pass_through_to_torch_compile(monkeypatch):
    value = {"backend": "aot_eager", "options": {"anything": 1}}
    trainer = Trainer(use_compile=value, max_steps=1, limit_val_batches=0, **QUIET)
    calls = record_compile_calls(monkeypatch)
    trainer.fit(BoringModel())
    assert calls
    assert all(kwargs == value for kwargs in calls), calls  # not checked against inductor's settings, not dropped


@pytest.mark.parametrize(
    ("key", "value", "error"),
    [
        ("fullgraph", "yes", TypeError),
        ("disable", 1, TypeError),
        ("dynamic", "auto", TypeError),
        ("options", ["max_autotune"], TypeError),
        ("optimize_ddp", "sometimes", ValueError),
        ("optimize_ddp", 1, ValueError),
        ("fallback", "cpu", ValueError),
    ],
)
def test_values_of_the_wrong_kind(key, value, error):
    with pytest.raises(error, match=key):
        Trainer(use_compile={key: value}, **QUIET)


class _UnsupportedStrategy(Strategy):
    """A custom strategy that is none of the ones `use_compile` supports."""

    root_device = torch.device("cpu")
    is_global_zero = True

    def model_to_device(self):
        pass

    def reduce(self, tensor, *args, **kwargs):
        return tensor

    def barrier(self, *args, **kwargs):
        pass

    def broadcast(self, obj, src=0):
        return obj

    def all_gather(self, tensor, *args, **kwargs):
        return tensor


def test_unsupported_strategy_fails_at_construction(tmp_path):
    strategy = _UnsupportedStrategy(accelerator=CPUAccelerator())
    # a strategy the Trainer takes without `use_compile`: the refusal below is for compiling only
    accepted = Trainer(
        strategy=strategy, default_root_dir=tmp_path, **{**QUIET, "devices": "auto", "accelerator": "auto"}
    )
    assert accepted.strategy is strategy
    with pytest.raises(
        RuntimeError, match=r"incompatible with the current strategy: `_Unsupp.*`Trainer\(use_compile=\.\.\.\)`"
    ):
        Trainer(
            strategy=strategy,
            use_compile=True,
            default_root_dir=tmp_path,
            **{**QUIET, "devices": "auto", "accelerator": "auto"},
        )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("use_compile", [None, False])
def test_unsupported_strategy_is_fine_without_use_compile(use_compile):
    strategy = _UnsupportedStrategy(accelerator=CPUAccelerator())
    trainer = Trainer(strategy=strategy, use_compile=use_compile, **{**QUIET, "devices": "auto", "accelerator": "auto"})
    assert trainer.strategy is strategy  # neither refused nor replaced: only `use_compile` needs a supported one


def test_model_parallel_takes_use_compile_and_refuses_a_compiled_model_passed_in_as_lightning_does(tmp_path):
    from lightning.pytorch.strategies import ModelParallelStrategy

    # `use_compile` compiles under it (the tensor-parallel checks are its own)
    Trainer(strategy=ModelParallelStrategy(), use_compile=True, default_root_dir=tmp_path, **QUIET)
    # a compiled model passed in without `use_compile` gets Lightning's refusal, nothing more
    trainer = Trainer(strategy=ModelParallelStrategy(), default_root_dir=tmp_path, **QUIET)
    with pytest.raises(RuntimeError, match="incompatible with the current strategy: `ModelParallelStrategy`"):
        trainer.fit(torch.compile(BoringModel(), backend="eager"))


def test_deepspeed_is_rejected():
    from lightning.pytorch.strategies import DeepSpeedStrategy

    strategy = object.__new__(DeepSpeedStrategy)  # constructing it needs deepspeed, which this suite does not install
    with pytest.raises(RuntimeError, match="incompatible with the current strategy: `DeepSpeedStrategy`"):
        connector_module()._verify_strategy_can_compile(strategy)


FIT = {**QUIET, "max_steps": 2, "limit_val_batches": 0}


def test_bad_input_changes_no_weight(tmp_path):
    model = BoringModel()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="unknown key"):
        # the model goes to `fit`, as in a user's script: a check made only later in the run would have trained it
        Trainer(use_compile={"nope": 1}, default_root_dir=tmp_path, **FIT).fit(model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert list(tmp_path.iterdir()) == []


def test_environment_variable_sets_use_compile(monkeypatch):
    """Lightning reads `PL_TRAINER_<ARGUMENT>` for every Trainer argument; `use_compile` is one of them."""
    monkeypatch.setenv("PL_TRAINER_USE_COMPILE", "{'backend': 'eager', 'dynamic': False}")
    from_environment = Trainer(max_steps=1, limit_val_batches=0, **QUIET)
    explicit = Trainer(use_compile=False, max_steps=1, limit_val_batches=0, **QUIET)  # an explicit argument wins
    calls = record_compile_calls(monkeypatch)
    from_environment.fit(BoringModel())
    assert calls
    assert all(kwargs == {"backend": "eager", "dynamic": False} for kwargs in calls), calls
    calls.clear()
    explicit.fit(BoringModel())
    assert calls == []
