"""Failures: a compile error names the stage, the strategy and the config, and loses nothing; `fallback="eager"`."""

import json
import warnings

import pytest
import torch
import yaml

from helpers import QUIET, TORCH_2_13, LoggingModel, leftovers
from lightning.pytorch import Callback, Trainer, seed_everything


def exploding_backend(gm, example_inputs):
    raise RuntimeError("backend exploded")


class Boom(LoggingModel):
    def training_step(self, batch, batch_idx):
        if batch_idx == 1:
            raise ValueError("bad batch")
        return super().training_step(batch, batch_idx)


class Interrupted(LoggingModel):
    def training_step(self, batch, batch_idx):
        if batch_idx == 1:
            raise KeyboardInterrupt
        return super().training_step(batch, batch_idx)


def trainer(strategy, use_compile, **kwargs):
    return Trainer(
        strategy=strategy, use_compile=use_compile, **{**QUIET, "max_steps": 3, "limit_val_batches": 0, **kwargs}
    )


@pytest.mark.parametrize(("strategy", "strategy_name"), [("auto", "SingleDeviceStrategy"), ("ddp", "DDPStrategy")])
def test_a_failing_backend_names_stage_strategy_and_config(strategy, strategy_name):
    model = LoggingModel()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(RuntimeError, match=r"could not compile the fit step compiled by") as error:
        trainer(strategy, {"backend": exploding_backend, "dynamic": False}).fit(model)
    message = str(error.value)
    assert f"under {strategy_name}" in message
    assert "`use_compile={'backend': exploding_backend, 'dynamic': False}`" in message
    assert "backend exploded" in message
    assert "'fallback': 'eager'" in message
    # nothing was lost or left behind: no step ran, and the model is uncompiled and can be fit again
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert leftovers(model) == []
    again = trainer(strategy, {"backend": "eager"})
    again.fit(model)
    assert again.global_step == 3


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_fallback_eager_warns_once_and_trains_like_eager(strategy):
    def train(use_compile):
        seed_everything(0)
        model = LoggingModel()
        run = trainer(strategy, use_compile)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run.fit(model)
        return model, run, caught

    eager, _, _ = train(None)
    compiled, run, caught = train({"backend": exploding_backend, "fallback": "eager"})
    fallbacks = [w for w in caught if "continues uncompiled (`fallback='eager'`)" in str(w.message)]
    assert len(fallbacks) == 1
    assert run.global_step == 3
    for ours, theirs in zip(compiled.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs)
    assert leftovers(compiled) == []


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_an_error_in_the_step_keeps_its_type_and_says_where_it_came_from(strategy):
    model = Boom()
    with pytest.raises(ValueError, match="bad batch") as error:
        trainer(strategy, {"backend": "eager"}).fit(model)
    notes = getattr(error.value, "__notes__", [])
    assert any("fit step compiled by `use_compile={'backend': 'eager'}`" in note for note in notes)
    assert leftovers(model) == []


def test_keyboard_interrupt_shuts_down_gracefully_and_uncompiled():
    model = Interrupted()
    run = trainer("auto", {"backend": "eager"})
    with pytest.raises(SystemExit):  # Lightning's graceful shutdown ends with exit(1)
        run.fit(model)
    assert run.interrupted
    assert leftovers(model) == []
    model.__class__ = LoggingModel  # the same model trains again, compiled
    again = trainer("auto", {"backend": "eager"})
    again.fit(model)
    assert again.global_step == 3


class CountSteps(Callback):
    def __init__(self):
        self.steps = 0

    def on_train_batch_end(self, *args):
        self.steps += 1


def test_fallback_applies_to_regions_too():
    from helpers import demo_gpt

    gpt = demo_gpt()
    model = gpt.GPTModule(gpt.GPTConfig(n_layer=2, n_embd=16, block_size=8, vocab_size=32, samples=32))
    counter = CountSteps()
    run = trainer("auto", {"backend": exploding_backend, "regions": "auto", "fallback": "eager"}, callbacks=[counter])
    with pytest.warns(UserWarning, match="continues uncompiled"):
        run.fit(model)
    assert counter.steps == 3
    assert leftovers(model) == []
    assert all("forward" not in block.__dict__ for block in model.model.blocks)


@pytest.mark.parametrize(
    "source",
    [
        pytest.param(lambda: json.loads('{"fallback": "eager"}'), id="json"),
        pytest.param(lambda: yaml.safe_load("fallback: eager"), id="yaml"),
        pytest.param(lambda: {"fallback": "".join(["ea", "ger"])}, id="built-at-runtime"),
    ],
)
def test_fallback_eager_is_taken_by_value_however_it_arrives(source):
    # bug: the value was compared with `is`, so an "eager" that was not the interned literal was refused
    value = source()
    assert value["fallback"] == "eager"
    trainer = Trainer(use_compile={"backend": exploding_backend, **value}, **{**QUIET, "max_steps": 2})
    with pytest.warns(UserWarning, match="continues uncompiled"):
        trainer.fit(LoggingModel())
    assert trainer.global_step == 2


def test_an_unsupported_fallback_names_the_choices():
    with pytest.raises(ValueError, match=r"'fallback': 'eagre'.*pass 'eager'"):
        Trainer(use_compile={"fallback": "eagre"}, **QUIET)


class WrappedTypeError(LoggingModel):
    """A step with a call that raises `TypeError`, which Dynamo turns into an error of its own while it traces.

    With `caught`, the step handles it, as libraries built on Lightning do around optional inputs.
    """

    CALLS = {
        "torch_op": lambda batch: batch + "a",  # raised by the op on fake tensors: `TorchRuntimeError`
        "builtin": lambda batch: isinstance(batch, list[int]),  # evaluated by Dynamo: `InternalTorchDynamoError`
    }

    def __init__(self, call, caught):
        super().__init__()
        self.call, self.caught = self.CALLS[call], caught

    def training_step(self, batch, batch_idx):
        try:
            self.call(batch)
        except TypeError:
            if not self.caught:
                raise
            batch = 2 * batch
        return super().training_step(batch, batch_idx)


#: How Dynamo wraps an error of the user's, and the guard failure under inference mode: seen on torch 2.13; 2.6 differs.
TORCH_2_13_ONLY = TORCH_2_13 and torch.__version__.startswith("2.13")
ONLY_2_13 = pytest.mark.skipif(not TORCH_2_13, reason="these errors' wrapping was checked on torch 2.13 only")


@ONLY_2_13
@pytest.mark.parametrize(
    "call",
    [
        # torch 2.14.1 chains the torch op's TypeError otherwise: it arrives as a plain compile error (CI's 2.14.1 leg)
        pytest.param("torch_op", marks=pytest.mark.xfail(not TORCH_2_13_ONLY, reason="torch 2.14 chains it otherwise")),
        "builtin",
    ],
)
def test_a_type_error_that_dynamo_wraps_reaches_the_users_handler_and_says_how_to_run_the_step_as_written(call):
    for caught in (False, True):
        model = WrappedTypeError(call, caught)
        # the user's `except TypeError` around the run: Dynamo's `TorchRuntimeError` or `InternalTorchDynamoError`
        # went past it
        with pytest.raises(TypeError, match=r"could not compile the fit step.*raised `TypeError:.*'fallback': 'eager'"):
            trainer("auto", {"backend": "aot_eager"}).fit(model)
        assert leftovers(model) == []


class IndexedWithNumpy(LoggingModel):
    COLUMNS = __import__("numpy").array([1, 0, 1])

    def predict_step(self, batch, batch_idx):
        return self(batch)[:, self.COLUMNS]


@ONLY_2_13
def test_fallback_eager_covers_an_error_raised_in_dynamos_own_code():
    # `trainer.predict` inside the user's own `torch.inference_mode()`: Dynamo raises a plain `AssertionError`
    # ("Guard failed on the same frame it was created"), which is none of its exception classes
    def predict(use_compile):
        seed_everything(0)
        run = Trainer(use_compile=use_compile, limit_predict_batches=3, **QUIET)
        with torch.inference_mode():
            return run.predict(IndexedWithNumpy())

    eager = predict(None)
    with pytest.raises(RuntimeError, match=r"could not compile the predict step.*AssertionError: Guard failed"):
        predict({"backend": "aot_eager"})
    # the step runs uncompiled from then on, and the model it calls compiled
    with pytest.warns(UserWarning, match=r"AssertionError: Guard failed.*continues with `predict_step` uncompiled"):
        compiled = predict({"backend": "aot_eager", "fallback": "eager"})
    torch.testing.assert_close(compiled, eager)


def test_a_step_called_with_arguments_it_does_not_take_raises_the_users_type_error_as_eager_does():
    """Lightning's own tests rely on it (`test_invalid_dataloader_idx_raises_step`): no compile error in between."""

    class ExtraArgument(LoggingModel):
        def validation_step(self, batch, batch_idx, extra):
            return super().validation_step(batch, batch_idx)

    trainer = Trainer(use_compile={"backend": "aot_eager"}, limit_val_batches=1, **QUIET)
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'extra'") as raised:
        trainer.validate(ExtraArgument())
    assert "use_compile" not in str(raised.value)
