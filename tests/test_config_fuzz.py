"""Fuzzing `use_compile`: every value is either accepted, and then accepted by `torch.compile` too, or rejected with
one of the documented errors (`TypeError` for a wrong type, `ValueError` for a wrong value), never anything else."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import QUIET, lightning_side
from lightning.pytorch import Trainer

config_module = lightning_side("config")
KEYS = [*config_module._torch_compile_keys(), *config_module._OWN_KEYS]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 10),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(["inductor", "eager", "aot_eager", "default", "max-autotune", "reduce-overhead", "auto", "Block"]),
    st.sampled_from([torch.nn.Linear, int, object]),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
use_compile = st.one_of(
    values,
    st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=10), values, max_size=4),
    st.dictionaries(
        st.just("options"), st.dictionaries(st.sampled_from(["max_autotune", "shape_padding", "x"]), values)
    ),
)


def rejection(value):
    """The documented error type the parser raises for ``value``, and its message; ``(None, "")`` if accepted."""
    try:
        config = config_module._parse_use_compile(value)
    except (TypeError, ValueError) as error:
        return type(error), str(error)
    if config is not None:
        torch.compile(lambda x: x, **config.compile_kwargs)  # what the Trainer accepts, torch.compile accepts
    return None, ""


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(use_compile)
def test_every_value_is_accepted_or_rejected_with_a_documented_error(value):
    error, message = rejection(value)
    if error is not None:
        assert "use_compile" in message


@settings(max_examples=25, deadline=None)
@given(use_compile)
def test_the_trainer_raises_the_same_errors(value):
    expected, _ = rejection(value)
    if expected is None:
        Trainer(use_compile=value, **QUIET)
    else:
        with pytest.raises(expected):
            Trainer(use_compile=value, **QUIET)
