"""Warm start: keep what the compiler produced, per rank and per configuration, and reuse it in the next run.

``use_compile={"cache": DIR}`` (or ``True`` for the default directory) does two things for each run:

* it loads, before the first compiled step, the artifacts that :func:`torch.compiler.save_cache_artifacts` wrote at
  the end of the last run of the same configuration on this rank, and saves them again at the end of this run. The
  file is portable: copy it to another machine with the same software, and the graphs there are not compiled again;
* it keeps inductor's own on-disk cache for the configuration in the same directory (unless you set
  ``TORCHINDUCTOR_CACHE_DIR`` yourself). On a CPU, that is where the compiled C++ kernels live: the portable file does
  not carry them.

A file that cannot be read, or that another configuration or release wrote, is ignored with a warning: the run then
compiles cold and writes a new one. Nothing here can stop a run.

Trust: the artifacts hold generated code that runs in the training process. So, as ssh does with its key directory,
the cache is used only if the directory, the configuration's folder and the file belong to the current user, are no
symbolic links, and are not writable by group or others; otherwise the run warns, naming the path and the fix, and
compiles cold without reading or writing anything there. New folders are created ``0700`` and files ``0600``. A cache
that a team shares on purpose is an explicit opt-in: ``use_compile={"cache": DIR, "cache_shared": True}``.

"""

import hashlib
import json
import os
import platform
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch

import lightning.pytorch as pl
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from lightning_compile_patch.compile_features import _CompileFeature, _CompileOptions
from lightning_compile_patch.compile_features import _private_names as private_names
from lightning_compile_patch.compile_features._run import _CompileRun

_MAGIC = b"LIGHTNING-COMPILE-CACHE 1\n"
_INDUCTOR_DIR_ENV = "TORCHINDUCTOR_CACHE_DIR"


def _default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/lightning/compile``, or ``~/.cache/lightning/compile``."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "lightning", "compile")


def _parse_cache_dir(cache: Any) -> Optional[str]:
    """Validates a ``cache`` value: ``True`` (the default directory), ``False``/``None`` (none), or a path."""
    if cache is None or cache is False:
        return None
    if cache is True:
        return _default_cache_dir()
    if isinstance(cache, (str, os.PathLike)) and str(cache):
        return os.path.abspath(os.path.expanduser(os.fspath(cache)))
    raise TypeError(
        f"`Trainer(use_compile={{'cache': {cache!r}}})` must be `True` (the default directory, {_default_cache_dir()})"
        " or the path of a directory."
    )


def _untrusted(paths: list[Path]) -> Optional[str]:
    """Why one of ``paths`` (those that exist) cannot be trusted to hold code for this user, or ``None``."""
    for path in paths:
        try:
            info = path.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(info.st_mode):
            return f"{path} is a symbolic link"
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            return f"{path} belongs to another user (uid {info.st_uid})"
        if info.st_mode & 0o022:
            return f"{path} is writable by group or others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def _structure(module: torch.nn.Module) -> str:
    """A digest of the model's parameter names, shapes and dtypes: two sizes of one class get separate caches."""
    shapes = [(name, tuple(p.shape), str(p.dtype)) for name, p in module.named_parameters()]
    return hashlib.sha256(repr(shapes).encode()).hexdigest()[:16]


def _configuration(trainer: "pl.Trainer", compile_kwargs: dict[str, Any], keys: Mapping[str, Any]) -> dict[str, Any]:
    """What the compiled artifacts depend on, besides the graphs themselves (which torch keys on its own).

    ``keys``: the other keys of ``use_compile``, which may change what is compiled (``regions``) or how.

    """
    strategy = trainer.strategy
    device = strategy.root_device
    return {
        "torch": torch.__version__,
        "lightning": pl.__version__,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
        "world_size": strategy.world_size,
        "strategy": type(strategy).__name__,
        "precision": str(trainer.precision),
        "model": f"{type(trainer.lightning_module).__module__}.{type(trainer.lightning_module).__qualname__}",
        "parameters": _structure(trainer.lightning_module),
        "compile": {key: _describe(value) for key, value in sorted(compile_kwargs.items())},
        "keys": {key: _describe(value) for key, value in sorted(keys.items())},
    }


def _describe(value: Any) -> Union[str, int, float, bool, list, dict, None]:
    """A JSON-able, stable description of a configuration value (callables by name)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [_describe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _describe(v) for k, v in sorted(value.items())}
    return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', type(value).__qualname__)}"


def _warm_start(run: _CompileRun, cache: str, shared: bool = False) -> Callable[[], None]:
    """Loads this configuration's artifacts for this rank, and returns the function that saves them at the end."""
    trainer = run.trainer
    others = {key: value for key, value in run.options.keys.items() if key not in _Cache.keys}
    configuration = _configuration(trainer, dict(run.given or {}), others)
    key = hashlib.sha256(json.dumps(configuration, sort_keys=True).encode()).hexdigest()[:16]
    folder = Path(cache) / f"{type(trainer.lightning_module).__name__}-{key}"
    artifacts = folder / f"rank{trainer.global_rank}.bin"
    reason = None if shared else _untrusted([Path(cache), folder, folder / "inductor", artifacts])
    if reason is not None:
        rank_zero_warn(
            f"`use_compile`: the compile cache is not used, because {reason}: its files hold code that would run in"
            f" this process. Compiling cold. Use a directory of your own (`chmod go-w`), or pass"
            " `'cache_shared': True` to trust a cache shared on purpose."
        )
        return lambda: None
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    _use_inductor_dir(run, folder / "inductor")
    _load(artifacts, configuration)
    return lambda: _save(artifacts, configuration)


def _use_inductor_dir(run: _CompileRun, path: Path) -> None:
    """Points inductor's on-disk cache at ``path`` for the run, unless the user chose a directory."""
    previous = os.environ.get(_INDUCTOR_DIR_ENV)
    default = private_names.inductor_default_cache_dir()
    if previous is not None and os.path.abspath(previous) != os.path.abspath(default):
        return  # set by the user (inductor sets it to its default on first use)
    run.setenv(_INDUCTOR_DIR_ENV, str(path), scope="run")


def _load(path: Path, configuration: dict[str, Any]) -> None:
    """Hot-loads the artifacts in ``path`` into torch's caches; warns and does nothing if they do not fit."""
    if not path.exists():
        rank_zero_info(f"`use_compile`: no compile cache at {path.parent} yet; this run compiles cold and fills it.")
        return
    try:
        data = path.read_bytes()
        if not data.startswith(_MAGIC):
            raise ValueError("not a compile cache file")
        header, _, payload = data[len(_MAGIC) :].partition(b"\n")
        saved = json.loads(header)
        if saved != configuration:
            changed = sorted(k for k in configuration if saved.get(k) != configuration[k])
            rank_zero_warn(
                f"`use_compile`: the compile cache {path} was written for another configuration (it differs in"
                f" {', '.join(changed)}); compiling cold. It is replaced at the end of this run."
            )
            return
        info = torch.compiler.load_cache_artifacts(payload)
    except Exception as error:  # a cache must never stop a run
        rank_zero_warn(f"`use_compile`: the compile cache {path} cannot be read ({error}); compiling cold.")
        return
    count = sum(len(keys) for keys in info.artifacts.values()) if info is not None else 0
    rank_zero_info(f"`use_compile`: loaded {count} compiled artifacts from {path}.")


def _save(path: Path, configuration: dict[str, Any]) -> None:
    """Writes what torch compiled in this process to ``path``, atomically; warns if that fails."""
    try:
        saved = torch.compiler.save_cache_artifacts()
        if saved is None:
            return  # the backend produced nothing to cache (for instance "eager")
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        header = json.dumps(configuration, sort_keys=True).encode()
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp:
            tmp.write(_MAGIC + header + b"\n" + saved[0])
        os.replace(tmp.name, path)
    except Exception as error:
        rank_zero_warn(f"`use_compile`: could not write the compile cache {path} ({error}); the run is unaffected.")


class _Cache(_CompileFeature):
    """Loads the compiled artifacts of the last run of this configuration before compiling, and saves them after."""

    keys = {
        "cache": "a directory for compiled artifacts, to start warm next time; True for the default",
        "cache_shared": "True to trust a cache directory that others can write (default False)",
    }

    def __init__(self, options: _CompileOptions) -> None:
        self.cache = _parse_cache_dir(options.keys.get("cache"))
        if self.cache is not None and not hasattr(torch.compiler, "save_cache_artifacts"):
            raise RuntimeError(
                "`Trainer(use_compile={'cache': ...})` needs torch 2.7 or newer (for `save_cache_artifacts`), but torch"
                f" {torch.__version__} is installed. Upgrade torch, or leave 'cache' out."
            )
        self.shared = options.keys.get("cache_shared", False)
        if not isinstance(self.shared, bool):
            raise TypeError(f"`Trainer(use_compile={{'cache_shared': {self.shared!r}}})` must be a bool.")
        self._save: Optional[Callable[[], None]] = None

    def setup(self, run: _CompileRun) -> Mapping[str, Any]:
        if self.cache is not None:
            self._save = _warm_start(run, self.cache, self.shared)
        return {}

    def teardown(self, run: _CompileRun) -> None:
        save, self._save = self._save, None
        if save is not None:
            save()


FEATURE = _Cache
