"""What ``Trainer(use_compile=...)`` accepts, and the errors for what it does not.

Every check runs when the ``Trainer`` is constructed, so a typo fails in the first second of a run and not after the
data has been prepared and the model has been moved to the device.

"""

import difflib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Optional, Union

import torch

_USE_COMPILE_INPUT = Optional[Union[bool, dict[str, Any]]]

#: ``optimize_ddp`` values: ``"auto"`` picks by world size (see :func:`_resolve_optimize_ddp`).
_OPTIMIZE_DDP_CHOICES = ("auto", True, False, "ddp_optimizer", "python_reducer", "no_optimization")
_FALLBACK_CHOICES = (None, "eager")

#: Keys of our own, next to the ones ``torch.compile`` takes. Each maps to a one-line description for error messages.
_OWN_KEYS: dict[str, str] = {
    "optimize_ddp": "how DDP's graph is split into buckets: 'auto' (default), True, False or a torch mode name",
    "fallback": "None (default: a compile error stops the run) or 'eager' (warn once and continue uncompiled)",
    "regions": "compile each repeated block on its own: 'auto', a class, classes or class names",  # patch: regions
    "cache": "a directory for compiled artifacts, to start warm next time; True for the default",  # patch: cache
}


@dataclass(frozen=True)
class _CompileConfig:
    """A validated ``use_compile`` value."""

    #: Keyword arguments for :func:`torch.compile`.
    compile_kwargs: dict[str, Any] = field(default_factory=dict)
    #: The ``torch._dynamo.config.optimize_ddp`` policy while DDP is compiled.
    optimize_ddp: Union[str, bool] = "auto"
    #: What happens when compilation fails: ``None`` raises, ``"eager"`` warns and runs uncompiled.
    fallback: Optional[str] = None
    #: Which repeated blocks to compile one by one; ``None`` compiles the whole step as one region.  # patch: regions
    regions: Optional[Union[str, tuple[Union[type, str], ...]]] = None  # patch: regions
    #: Where compiled artifacts are kept between runs; ``None`` keeps nothing.  # patch: cache
    cache: Optional[str] = None  # patch: cache

    @property
    def backend(self) -> Union[str, Callable]:
        """The backend that will compile the graphs."""
        return self.compile_kwargs.get("backend") or "inductor"

    def describe(self) -> str:
        """The value as a user would write it, with the defaults left out, for messages."""
        defaults = _CompileConfig()
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "compile_kwargs"}
        items = {**self.compile_kwargs, **{k: v for k, v in own.items() if v != getattr(defaults, k)}}
        return "{" + ", ".join(f"{key!r}: {_short(value)}" for key, value in items.items()) + "}"


def _short(value: Any) -> str:
    """A short ``repr``, naming callables and classes instead of printing them."""
    if callable(value) and not isinstance(value, type):
        return getattr(value, "__name__", type(value).__name__)
    if isinstance(value, type):
        return value.__name__
    if isinstance(value, tuple):
        return "(" + ", ".join(_short(item) for item in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def _torch_compile_keys() -> tuple[str, ...]:
    """The keyword arguments :func:`torch.compile` takes in the installed version of PyTorch."""
    return tuple(name for name in inspect.signature(torch.compile).parameters if name != "model")


def _parse_use_compile(use_compile: Any) -> Optional[_CompileConfig]:
    """Validates a ``use_compile`` value and returns what it asks for.

    Returns:
        ``None`` for ``None`` and ``False`` (the Trainer compiles nothing of its own accord), otherwise the config.

    Raises:
        TypeError: If ``use_compile`` is not ``None``, a bool or a dict, or if a value in the dict has the wrong type.
        ValueError: If the dict has an unknown key or an unknown value.

    """
    if use_compile is None or use_compile is False:
        return None
    if use_compile is True:
        return _CompileConfig()
    if isinstance(use_compile, Mapping):
        return _config_from_mapping(use_compile)
    raise TypeError(
        f"`Trainer(use_compile={use_compile!r})` is not supported: pass `True`, `False`, `None` or a dict of"
        f" `torch.compile` arguments such as `use_compile={{'backend': 'inductor'}}`."
        f" Got a value of type `{type(use_compile).__name__}`."
    )


def _config_from_mapping(options: Mapping) -> _CompileConfig:
    """Checks every key and value of a ``use_compile`` dict and builds the config from it."""
    torch_keys = _torch_compile_keys()
    valid_keys = (*torch_keys, *_OWN_KEYS)
    for key in options:
        if key not in valid_keys:
            raise ValueError(_unknown_key_message(key, torch_keys))
    compile_kwargs = {key: value for key, value in options.items() if key in torch_keys}
    _check_compile_kwargs(compile_kwargs)
    own = {key: value for key, value in options.items() if key in _OWN_KEYS}
    if "optimize_ddp" in own:
        own["optimize_ddp"] = _check_choice("optimize_ddp", own["optimize_ddp"], _OPTIMIZE_DDP_CHOICES)
    if "fallback" in own:
        own["fallback"] = _check_choice("fallback", own["fallback"], _FALLBACK_CHOICES)
    if "regions" in own:  # patch: regions
        from lightning_compile_patch.regions import _parse_regions  # patch: regions

        own["regions"] = _parse_regions(own["regions"])  # patch: regions
    if "cache" in own:  # patch: cache
        from lightning_compile_patch.cache import _parse_cache_dir  # patch: cache

        own["cache"] = _parse_cache_dir(own["cache"])  # patch: cache
    return _CompileConfig(compile_kwargs=compile_kwargs, **own)


def _unknown_key_message(key: Any, torch_keys: tuple[str, ...]) -> str:
    """Names the unknown key, the closest valid one, and every valid key with what it does."""
    suggestion = difflib.get_close_matches(str(key), [*torch_keys, *_OWN_KEYS], n=1)
    hint = f" Did you mean {suggestion[0]!r}?" if suggestion else ""
    own = "; ".join(f"{name!r}: {description}" for name, description in _OWN_KEYS.items())
    return (
        f"`Trainer(use_compile=...)` got the unknown key {key!r}.{hint}"
        f" Valid keys are the arguments of `torch.compile` ({', '.join(repr(k) for k in torch_keys)})"
        f" and these of the Trainer's own: {own}."
    )


def _check_choice(key: str, value: Any, choices: tuple) -> Any:
    """Returns ``value`` if it is one of ``choices``, otherwise raises an error that lists them."""
    # `True == 1` in Python, so compare types too: `optimize_ddp=1` is a mistake, not `True`
    if any(value is choice or (type(value) is type(choice) and value == choice) for choice in choices):
        return value
    raise ValueError(
        f"`Trainer(use_compile={{{key!r}: {value!r}}})` is not supported. Choose one of:"
        f" {', '.join(repr(c) for c in choices)}."
    )


def _check_compile_kwargs(kwargs: dict[str, Any]) -> None:
    """Checks the ``torch.compile`` arguments now, rather than at the first training step."""
    for key in ("fullgraph", "disable", "isolate_recompiles"):
        if key in kwargs and not isinstance(kwargs[key], bool):
            raise TypeError(
                f"`Trainer(use_compile={{{key!r}: {kwargs[key]!r}}})` must be a bool,"
                f" got `{type(kwargs[key]).__name__}`."
            )
    if kwargs.get("dynamic") is not None and not isinstance(kwargs["dynamic"], bool):
        raise TypeError(
            f"`Trainer(use_compile={{'dynamic': {kwargs['dynamic']!r}}})` must be `None`, `True` or `False`,"
            f" got `{type(kwargs['dynamic']).__name__}`."
        )
    for key in ("name",):
        if kwargs.get(key) is not None and not isinstance(kwargs[key], str):
            raise TypeError(
                f"`Trainer(use_compile={{{key!r}: ...}})` must be a string, got `{type(kwargs[key]).__name__}`."
            )
    limit = kwargs.get("recompile_limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"`Trainer(use_compile={{'recompile_limit': {limit!r}}})` must be a positive int or `None`.")
    if "backend" in kwargs:
        _check_backend(kwargs["backend"])
    if kwargs.get("mode") is not None and kwargs.get("options") is not None:
        raise ValueError(
            "`Trainer(use_compile=...)` got both 'mode' and 'options', which `torch.compile` cannot combine. Pass"
            " one of them: to tweak a mode, start from `torch._inductor.list_mode_options(mode)` and pass the"
            " result, with your changes, as 'options'."
        )
    if kwargs.get("mode") is not None:
        _check_mode(kwargs["mode"])
    if kwargs.get("options") is not None:
        _check_options(kwargs["options"], kwargs.get("backend"))
    try:  # the rest of what torch.compile checks when it is called, such as the types of inductor options
        torch.compile(_noop, **kwargs)
    except Exception as error:
        raise ValueError(f"`Trainer(use_compile=...)`: `torch.compile` rejects these arguments: {error}") from error


def _noop() -> None:
    """What :func:`_check_compile_kwargs` hands to ``torch.compile`` to have the arguments checked."""


def _check_backend(backend: Any) -> None:
    """Accepts a registered backend name or a callable, as :func:`torch.compile` does."""
    if callable(backend):
        return
    if not isinstance(backend, str):
        raise TypeError(
            f"`Trainer(use_compile={{'backend': {backend!r}}})` must be a backend name or a callable,"
            f" got `{type(backend).__name__}`."
        )
    registered = torch._dynamo.list_backends(exclude_tags=())
    if backend not in registered:
        suggestion = difflib.get_close_matches(backend, registered, n=1)
        hint = f" Did you mean {suggestion[0]!r}?" if suggestion else ""
        raise ValueError(
            f"`Trainer(use_compile={{'backend': {backend!r}}})` names no registered `torch.compile` backend.{hint}"
            f" Registered backends: {', '.join(registered)}. Register your own with"
            " `torch._dynamo.register_backend`, or pass the backend callable itself."
        )


def _check_mode(mode: Any) -> None:
    """Accepts the mode names :func:`torch.compile` knows."""
    import torch._inductor

    modes = list(torch._inductor.list_mode_options())
    if mode not in modes:
        raise ValueError(
            f"`Trainer(use_compile={{'mode': {mode!r}}})`: {mode!r} is not a `torch.compile` mode. Choose one of:"
            f" {', '.join(repr(m) for m in modes)}, or leave 'mode' out for the default."
        )


def _check_options(options: Any, backend: Any) -> None:
    """Checks that ``options`` is a dict, and, for inductor, that every key is an inductor setting."""
    if not isinstance(options, Mapping):
        raise TypeError(
            "`Trainer(use_compile={'options': ...})` must be a dict of backend settings,"
            f" got `{type(options).__name__}`."
        )
    if backend not in (None, "inductor"):
        return  # other backends define their own options
    import torch._inductor

    known = torch._inductor.list_options()
    for key in options:
        if key not in known:
            suggestion = difflib.get_close_matches(str(key), known, n=1)
            hint = f" Did you mean {suggestion[0]!r}?" if suggestion else ""
            raise ValueError(
                f"`Trainer(use_compile={{'options': {{{key!r}: ...}}}})` is not an inductor setting.{hint}"
                " `torch._inductor.list_options()` lists them all."
            )


def _config_from_compile_kwargs(compile_kwargs: Optional[dict[str, Any]]) -> _CompileConfig:
    """Builds the config that re-applies the arguments a model was passed to :func:`torch.compile` with."""
    kwargs = dict(compile_kwargs or {})
    _check_compile_kwargs(kwargs)
    return _CompileConfig(compile_kwargs=kwargs)
