"""Checks the ``torch.compile`` arguments of ``use_compile`` when the Trainer is built, not at the first step.

``torch.compile`` checks its backend, mode and options only when it compiles, minutes into a run, after the data has
been prepared and the model moved to the device. These checks run in ``Trainer.__init__``, and each error names the
value and what to pass instead. (A model compiled before it is passed in had its arguments checked by
``torch.compile`` itself.)

"""

import difflib
from collections.abc import Mapping
from typing import Any

import torch

from lightning_compile_patch.connector import _CompileFeature, _torch_compile_keys


class _CompileArguments(_CompileFeature):
    """Checks the backend, the mode and the backend options."""

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        _check_compile_kwargs({key: value for key, value in options.items() if key in _torch_compile_keys()})


def _check_compile_kwargs(kwargs: Mapping[str, Any]) -> None:
    """Checks ``torch.compile`` arguments now, rather than at the first step."""
    for key in ("fullgraph", "disable", "dynamic", "isolate_recompiles"):
        if kwargs.get(key) is not None and not isinstance(kwargs[key], bool):
            raise TypeError(f"`Trainer(use_compile={{{key!r}: {kwargs[key]!r}}})` must be a bool.")
    if kwargs.get("name") is not None and not isinstance(kwargs["name"], str):
        raise TypeError(f"`Trainer(use_compile={{'name': {kwargs['name']!r}}})` must be a string.")
    for key in ("shapes_spec", "dynamic_shapes"):  # torch 2.13 and 2.14 name it differently
        spec = kwargs.get(key)
        if spec is not None and not isinstance(spec, Mapping) and type(spec).__name__ != "ParamsSpec":
            raise TypeError(f"`Trainer(use_compile={{{key!r}: {spec!r}}})` must be a dict, a `ParamsSpec` or `None`.")
    limit = kwargs.get("recompile_limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
        raise TypeError(f"`Trainer(use_compile={{'recompile_limit': {limit!r}}})` must be a positive int.")
    if limit is not None and limit < 1:
        raise ValueError(f"`Trainer(use_compile={{'recompile_limit': {limit!r}}})` must be a positive int.")
    backend = kwargs.get("backend", "inductor")
    if not callable(backend) and not isinstance(backend, str):
        raise TypeError(f"`Trainer(use_compile={{'backend': {backend!r}}})` must be a backend name or a callable.")
    backends = torch._dynamo.list_backends(exclude_tags=())
    if not callable(backend) and backend not in backends:
        close = difflib.get_close_matches(backend, backends, n=1)
        raise ValueError(
            f"`Trainer(use_compile={{'backend': {backend!r}}})` names no registered `torch.compile` backend."
            f"{f' Did you mean {close[0]!r}?' if close else ''} Pass one of {backends}, a callable, or one registered"
            " with `torch._dynamo.register_backend`."
        )
    mode, options = kwargs.get("mode"), kwargs.get("options")
    if mode is not None and not isinstance(mode, str):
        raise TypeError(f"`Trainer(use_compile={{'mode': {mode!r}}})` must be a mode name, such as 'max-autotune'.")
    if mode is None and options is None:
        return
    from torch import _inductor as inductor  # large: imported only when needed

    if mode is not None and options is not None:
        raise ValueError(
            "`Trainer(use_compile=...)` got both 'mode' and 'options', which `torch.compile` cannot combine: start from"
            " `torch._inductor.list_mode_options(mode)` and pass it, with your changes, as 'options'."
        )
    if mode is not None and mode not in inductor.list_mode_options():
        raise ValueError(
            f"`Trainer(use_compile={{'mode': {mode!r}}})`: {mode!r} is not a `torch.compile` mode. Choose one of"
            f" {list(inductor.list_mode_options())}."
        )
    if options is not None and not isinstance(options, Mapping):
        raise TypeError("`Trainer(use_compile={'options': ...})` must be a dict of backend options.")
    if options is not None and backend == "inductor":
        settings = inductor.config.get_config_copy()
        for key in options:
            if str(key).replace("-", "_") not in settings:
                close = difflib.get_close_matches(str(key), settings, n=1)
                raise ValueError(
                    f"`Trainer(use_compile={{'options': {{{key!r}: ...}}}})` is not an inductor setting."
                    f"{f' Did you mean {close[0]!r}?' if close else ''} See `torch._inductor.list_options()`."
                )
        for key, value in options.items():
            name = str(key).replace("-", "_")
            if settings[name] is not None and not isinstance(value, type(settings[name])):
                raise TypeError(
                    f"`Trainer(use_compile={{'options': {{{key!r}: {value!r}}}}})` must be of type"
                    f" `{type(settings[name]).__name__}`, like inductor's setting."
                )


FEATURE = _CompileArguments
