"""Checks the ``torch.compile`` arguments of ``use_compile`` when the Trainer is built, not at the first step.

``torch.compile`` checks its backend, mode and options when it is called, and the Trainer calls it after the strategy
has set the model up, minutes into a run, after the data has been prepared. Here ``torch.compile`` checks them itself,
when the Trainer is built:
a dry call on a function that is never run builds the backend, which looks up its name and applies the mode and the
options, so every value torch accepts passes and every value it refuses fails with its own reason. What torch takes
without a check (the type of a flag, of the backend) is checked here. (A model compiled before it is passed in had its
arguments checked by ``torch.compile`` itself.)

"""

import difflib
from collections.abc import Mapping
from typing import Any

import torch

from lightning_compile_patch.compile_connector import _CompileFeature, _CompileOptions


class _CompileArguments(_CompileFeature):
    """Checks the arguments with ``torch.compile`` itself, and the types it does not check."""

    def __init__(self, options: _CompileOptions) -> None:
        _check_compile_kwargs(options.torch_kwargs)


def _never_run() -> None:
    """What the dry ``torch.compile`` call compiles: it is never called, so nothing is traced."""


def _check_compile_kwargs(kwargs: Mapping[str, Any]) -> None:
    """Checks ``torch.compile`` arguments now, rather than at the first step."""
    for key in ("fullgraph", "disable", "dynamic", "isolate_recompiles"):
        if kwargs.get(key) is not None and not isinstance(kwargs[key], bool):
            raise TypeError(f"`Trainer(use_compile={{{key!r}: {kwargs[key]!r}}})` must be a bool.")
    for key in ("mode", "name"):
        if kwargs.get(key) is not None and not isinstance(kwargs[key], str):
            raise TypeError(f"`Trainer(use_compile={{{key!r}: {kwargs[key]!r}}})` must be a string.")
    if kwargs.get("options") is not None and not isinstance(kwargs["options"], Mapping):
        raise TypeError("`Trainer(use_compile={'options': ...})` must be a dict of backend options.")
    for key in ("shapes_spec", "dynamic_shapes"):  # torch 2.13 and 2.14 name it differently
        spec = kwargs.get(key)
        if spec is not None and not isinstance(spec, Mapping) and type(spec).__name__ != "ParamsSpec":
            raise TypeError(f"`Trainer(use_compile={{{key!r}: {spec!r}}})` must be a dict, a `ParamsSpec` or `None`.")
    limit = kwargs.get("recompile_limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        kind = ValueError if isinstance(limit, int) and not isinstance(limit, bool) else TypeError
        raise kind(f"`Trainer(use_compile={{'recompile_limit': {limit!r}}})` must be a positive int.")
    backend = kwargs.get("backend", "inductor")
    if not callable(backend) and not isinstance(backend, str):
        raise TypeError(f"`Trainer(use_compile={{'backend': {backend!r}}})` must be a backend name or a callable.")
    try:
        torch.compile(_never_run, **kwargs)
    except Exception as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        names = torch.compiler.list_backends(exclude_tags=()) if isinstance(backend, str) else []
        close = [name for name in difflib.get_close_matches(str(backend), names, n=1) if name != backend]
        hint = f" Did you mean {close[0]!r}?" if close else ""
        kind = TypeError if reason.startswith("Unexpected type") else ValueError  # an option of the wrong type
        raise kind(f"`torch.compile` refuses `Trainer(use_compile=...)`'s arguments: {reason}{hint}") from error


FEATURE = _CompileArguments
