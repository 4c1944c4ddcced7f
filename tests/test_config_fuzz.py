"""Fuzzing `use_compile` against its documented contract (docs/usage.md, "Errors"), not against the parser.

The oracle below is written from the documentation and from `torch.compile` itself: which type each key takes (a
wrong type is a `TypeError`), which values it takes (a wrong value is a `ValueError`), and, for what torch defines
(backend names, modes, inductor options), whatever `torch.compile` accepts. Where the documentation leaves the outcome
open, the oracle allows each of the outcomes it leaves open. `Trainer(use_compile=...)` must do what it says.
"""

import inspect
import os
from collections.abc import Mapping

import pytest
import torch
import torch._inductor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import QUIET, TORCH_2_7
from lightning.pytorch import Trainer

#: `torch.compile`'s own keyword arguments: the signature is torch's contract, not this package's.
TORCH_KEYS = [name for name in inspect.signature(torch.compile).parameters if name != "model"]
OWN_KEYS = ["optimize_ddp", "fallback", "regions", "cache"]
OK, ANY = {None}, {None, TypeError, ValueError}
OPTIMIZE_DDP = ("auto", True, False, "ddp_optimizer", "no_optimization")  # and "python_reducer": applied or refused


def _noop():
    pass


def torch_accepts(**kwargs):
    try:
        torch.compile(_noop, **kwargs)
    except Exception:
        return False
    return True


def is_bool(value):
    return isinstance(value, bool)


def allowed_for(key, value, options):
    """The outcomes the contract allows for one key: `None` (accepted), `TypeError` or `ValueError`."""
    if key == "backend":
        if isinstance(value, str):
            return OK if value in torch._dynamo.list_backends(exclude_tags=()) else {ValueError}
        return OK if callable(value) else ({None, TypeError} if value is None else {TypeError})
    if key == "mode":
        if value is None:
            return OK
        return (
            (OK if torch_accepts(mode=value) else {ValueError}) if isinstance(value, str) else {TypeError, ValueError}
        )
    if key == "options":
        if value is None:
            return OK
        if not isinstance(value, Mapping):
            return {TypeError}
        if options.get("backend", "inductor") not in (None, "inductor"):
            return OK  # another backend's own options: passed through to it
        if torch_accepts(options=dict(value)):
            return OK
        # inductor's settings, checked by torch in the dict's order: an unknown name is a ValueError, a known one of the
        # wrong type a TypeError, and the first bad one decides
        unknown = set(value) - set(torch._inductor.list_options())
        wrong_type = any(not torch_accepts(options={name: item}) for name, item in value.items() if name not in unknown)
        return {ValueError} | ({TypeError} if wrong_type else set()) if unknown else {TypeError}
    if key in ("fullgraph", "disable", "isolate_recompiles"):
        return OK if is_bool(value) else ({None, TypeError} if value is None else {TypeError})
    if key == "dynamic":
        return OK if value is None or is_bool(value) else {TypeError}
    if key == "name":
        return OK if value is None or isinstance(value, str) else {TypeError}
    if key == "recompile_limit":
        if value is None or (isinstance(value, int) and not is_bool(value) and value > 0):
            return OK
        return {ValueError} if isinstance(value, int) and not is_bool(value) else {TypeError, ValueError}
    if key == "optimize_ddp":
        if value == "python_reducer":
            return {None, ValueError}
        if value is None:
            return OK  # unset: torch's own setting applies (the package's default is "auto")
        return OK if any(type(value) is type(c) and value == c for c in OPTIMIZE_DDP) else {ValueError}
    if key == "fallback":
        return OK if value is None or value is False or value == "eager" else {ValueError}  # False: off, as None
    if key == "regions":
        if value is False:
            return OK  # off, as for every feature's key
        if value is None:
            return {None, TypeError}
        items = value if isinstance(value, (list, tuple)) else [value]
        valid = value == "auto" or (len(items) > 0 and all(region(v) for v in items))
        return OK if valid else {TypeError}
    if key == "cache":
        path = isinstance(value, (str, os.PathLike)) and str(value)
        if value is True or path:
            return OK if TORCH_2_7 else {RuntimeError}  # "a feature that needs a newer torch (`cache` before 2.7)"
        return OK if value is None or value is False else {TypeError}
    if key in TORCH_KEYS:
        return ANY  # a torch.compile argument the documentation says nothing about
    return {ValueError}  # an unknown key


def region(item):
    """One entry of `regions`: an `nn.Module` subclass or a class name."""
    return (isinstance(item, type) and issubclass(item, torch.nn.Module)) or (
        isinstance(item, str) and item.isidentifier()
    )


def allowed(value):
    """The outcomes the contract allows for a whole `use_compile` value."""
    if value is None or is_bool(value):
        return OK
    if not isinstance(value, Mapping):
        return {TypeError}
    per_key = [allowed_for(key, v, value) for key, v in value.items()]
    if value.get("mode") is not None and value.get("options") is not None:
        per_key.append({ValueError})  # torch.compile takes one of them
    errors = set().union(*per_key) - OK
    return errors if any(None not in outcomes for outcomes in per_key) else errors | OK


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
    st.dictionaries(st.sampled_from(TORCH_KEYS + OWN_KEYS) | st.text(max_size=10), values, max_size=4),
    st.dictionaries(
        st.just("options"), st.dictionaries(st.sampled_from(["max_autotune", "shape_padding", "x"]), values)
    ),
)


def outcome(value):
    """What `Trainer(use_compile=value)` does: `None` (accepts it) or the documented error it raises."""
    try:
        Trainer(use_compile=value, **QUIET)
    except (TypeError, ValueError, RuntimeError) as error:
        return error
    return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(use_compile)
def test_every_value_is_accepted_or_rejected_as_documented(value):
    expected, error = allowed(value), outcome(value)
    assert (type(error) if error else None) in expected, (value, expected, error)
    assert error is None or "use_compile" in str(error)  # the message names the argument


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(use_compile)
def test_what_the_trainer_accepts_torch_compile_accepts_too(value):
    if isinstance(value, Mapping) and outcome(value) is None:
        torch.compile(_noop, **{key: v for key, v in value.items() if key in TORCH_KEYS})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ({"backend": "indcutor"}, ValueError),
        ({"backend": 3}, TypeError),
        ({"mode": "fast"}, ValueError),
        ({"mode": "max-autotune", "options": {}}, ValueError),
        ({"options": {"shape_padding": 1}}, TypeError),
        ({"options": {"anything": 1}, "backend": "aot_eager"}, None),
        ({"fullgraph": "yes"}, TypeError),
        ({"optimize_ddp": 1}, ValueError),
        ({"regions": [int]}, TypeError),
        ({"regions": False}, None),
        ({"fallback": False}, None),
        ({"fallback": True}, ValueError),
        ({"cache": 3}, TypeError),
        ({"cache": "dir"}, None if TORCH_2_7 else RuntimeError),
        ({"backedn": "eager"}, ValueError),
        ([{"backend": "eager"}], TypeError),
    ],
)
def test_the_oracle_itself_on_hand_picked_values(value, expected):
    """The oracle, checked by hand where the documentation is explicit, so that a wrong oracle cannot hide a bug."""
    assert allowed(value) == {expected}
    error = outcome(value)
    assert (type(error) if error else None) is expected, error
