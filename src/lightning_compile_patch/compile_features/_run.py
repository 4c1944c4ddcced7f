"""A compiled run, as its features see it: the Trainer, the run's compile arguments, and what the run changes.

Everything a feature changes outside the run (an attribute, a torch setting, an environment variable, a context it
enters) goes through :class:`_CompileRun`, which records it in one of two scopes and undoes it, latest first, on every
path: ``"compile"``, what the run compiled (undone at the end of the run, or at once when the run goes on uncompiled),
and ``"run"``, the run's settings (undone at its end).

"""

import contextlib
import functools
import os
import types
from collections.abc import Iterable, Mapping
from typing import Any, Callable, Literal, Optional

import torch

import lightning.pytorch as pl
from lightning_compile_patch.compile_features import _CompileFeature, _CompileOptions
from lightning_compile_patch.compile_features import _private_names as private_names

_Scope = Literal["compile", "run"]
_ABSENT = object()


class _CompileRun:
    """One compiled run: what each feature's hooks get."""

    def __init__(
        self,
        trainer: "pl.Trainer",
        use_compile: Any,
        options: _CompileOptions,
        given: Mapping[str, Any],
        features: list[_CompileFeature],
    ) -> None:
        self.trainer = trainer
        #: ``Trainer(use_compile=...)`` as given, for messages.
        self.use_compile = use_compile
        #: ``use_compile`` parsed: the ``torch.compile`` arguments and the features' keys.
        self.options = options
        #: The run's ``torch.compile`` arguments as given, before the features derive :attr:`run_kwargs` from them.
        self.given = given
        #: The arguments every compile of the run uses.
        self.run_kwargs: Mapping[str, Any] = given
        #: Whether the run went on uncompiled after a compile error (:meth:`fall_back`).
        self.fell_back = False
        #: What features say of the run, for its summary (:meth:`note`).
        self.notes: list[Callable[[], Optional[str]]] = []
        self.features = features
        self._undo: dict[_Scope, list[Callable[[], Any]]] = {"compile": [], "run": []}

    def replace(self, target: Any, name: str, value: Any, scope: _Scope = "compile") -> None:
        """Sets ``target.name`` to ``value`` until the end of ``scope``, then puts back what was there.

        An attribute of the target's own ``__dict__`` (or of a module, such as ``torch._dynamo.config``), and one that a
        data descriptor of its type holds (an instance's ``__class__``), gets its value back. One that came from a base
        class, or was not there, is deleted again, from an instance or from a class alike.

        """
        found = next((vars(cls)[name] for cls in type(target).__mro__ if name in vars(cls)), None)
        own = name in getattr(target, "__dict__", {}) or isinstance(target, types.ModuleType)
        if not isinstance(target, (type, types.ModuleType)) and name != "__class__":
            self.keep_copies_plain(target, (name,), scope=scope)
        if own or hasattr(type(found), "__set__"):
            before = getattr(target, name)
            self.defer(lambda: setattr(target, name, before), scope=scope)
        else:
            self.defer(_delete, target, name, scope=scope)
        setattr(target, name, value)

    def keep_copies_plain(self, target: Any, names: tuple[str, ...], scope: _Scope = "compile") -> None:
        """Until the end of ``scope``, a pickle or deep copy of ``target`` holds ``names`` as they are now, or not.

        Call it before changing them: a checkpoint pickles the model's hyperparameters (a metric among them), and an EMA
        or SWA callback deep-copies the model during the run; the copy is the object as it was before the run, with
        nothing of the run's (a compiled step, a wrapper) that cannot be pickled, or that would act on the original.

        """
        own = vars(target)
        plain = own.get("__getstate__")
        if not isinstance(plain, _PlainState):
            plain = _PlainState(target)
            own["__getstate__"] = plain  # pickle and `copy` look it up on the instance first
            self.defer(_delete, target, "__getstate__", scope=scope)
        for name in names:
            plain.before.setdefault(name, own.get(name, _ABSENT))

    def setenv(self, name: str, value: str, scope: _Scope = "run") -> None:
        """Sets the environment variable ``name`` until the end of ``scope``, then puts back what was there."""
        before = os.environ.get(name)
        os.environ[name] = value
        if before is None:
            self.defer(lambda: os.environ.pop(name, None), scope=scope)
        else:
            self.defer(lambda: os.environ.__setitem__(name, before), scope=scope)

    def enter(self, context: contextlib.AbstractContextManager, scope: _Scope = "run") -> Any:
        """Enters ``context`` (torch's own ``config.patch``, a switch) until the end of ``scope``."""
        value = context.__enter__()
        self.defer(lambda: context.__exit__(None, None, None), scope=scope)
        return value

    def defer(self, undo: Callable[..., Any], *args: Any, scope: _Scope = "compile") -> None:
        """Calls ``undo(*args)`` when the run's changes are undone (at its teardown), latest first."""
        # not a `functools.partial`, whose arguments a `deepcopy` of the Trainer mid-run (Lightning's tests do) copies
        self._undo[scope].append(lambda: undo(*args))

    def note(self, note: Callable[[], Optional[str]]) -> None:
        """Adds what a feature says of the run to its summary: ``note()`` when the run ends, unless it is ``None``."""
        self.notes.append(note)

    def uncompile(self) -> None:
        """Undoes what this run compiled, latest first; the run's settings stay until its end."""
        self._unwind("compile")

    def fall_back(self) -> None:
        """The run goes on uncompiled after a compile error: what it compiled is undone, and its summary says so."""
        self.fell_back = True
        self.uncompile()

    def wrap(self, compiled: Callable, original: Callable) -> Callable:
        """The features' wrappers around ``compiled``; it shows ``original``'s signature, which Lightning reads."""
        if not self.features:
            return compiled
        for feature in sorted(self.features, key=lambda feature: feature.order):
            compiled = feature.wrap(self, compiled, original)

        def step(*args: Any, **kwargs: Any) -> Any:
            if torch.compiler.is_compiling():  # called from code being traced (`test_step` calls `predict_step`)
                return original(*args, **kwargs)  # traced as written, not through the features' wrappers
            return compiled(*args, **kwargs)

        return functools.update_wrapper(step, original, updated=())

    def end(self) -> None:
        """Ends the run: the features, then what was compiled, then the run's settings; each even after one raised."""
        with contextlib.ExitStack() as stack:  # callbacks run last-in, first-out
            stack.callback(self._unwind, "run")
            stack.callback(self.uncompile)
            for feature in self.features:
                stack.callback(feature.teardown, self)

    # Dynamo keeps compiled entries, a recompile count and a "skip" mark per code object, for the whole process: the
    # run is the one place that changes them, by the three policies below (and `_crowded`, the one threshold).

    def run_uncompiled(self, code: types.CodeType, scope: _Scope = "compile") -> None:
        """Dynamo runs ``code`` uncompiled as a frame of its own until the end of ``scope``, and still inlines it into
        a traced caller: a feature's own replacement (logging), or a frame whose compile failed (``fallback``).
        """
        private_names.skip_code(code)
        self.defer(private_names.reset_code, code, scope=scope)

    def reset(self, codes: Iterable[types.CodeType], crowded_only: bool = False) -> None:
        """Drops, now, what Dynamo keeps of each of ``codes``: its entries, its recompile count and its "skip" mark.

        Where earlier runs crowded code that this run shares (another Trainer's run starts), or a run failed. With
        ``crowded_only``, only the code :func:`_crowded` holds crowded, or with no entry at all: skipped after a
        failure, or it held no tensor work (trying that again costs next to nothing).

        """
        for code in codes:
            if not crowded_only or _crowded(entries := private_names.cache_entries(code)) or entries == 0:
                private_names.reset_code(code)

    def reset_crowded_code_at_end(self, model: "pl.LightningModule") -> None:
        """When the run ends, resets the shared code whose entries it grew past half of Dynamo's recompile limit.

        Every run adds entries of its own (a wrapper, shapes, a backend) to code that runs share: torch's and
        Lightning's (the module call, DDP's forward, the forward redirection) and the model's classes' (their steps,
        the functions nested in them, and the code Dynamo resumes them with after a graph break). A process that fits
        many models would reach the limit and run its later fits eagerly. Other code, such as a function the user
        compiled and called during the run, keeps its entries. (Lightning's own re-apply leaves this to the user, as
        Fabric does: ``torch.compiler.reset()`` between fits.)

        """
        # their folders, and the one above these modules': in Lightning, its own; in a distribution that runs them from
        # a folder of its own, that one (with its fixes of Lightning's code)
        ours = os.path.dirname(os.path.dirname(__file__))
        packages = tuple(folder + os.sep for folder in (*torch.__path__, *pl.__path__, ours))
        own: set[types.CodeType] = set()  # the code of the model's classes, and of the functions nested in it
        todo = [getattr(f, "__code__", None) for cls in type(model).__mro__ for f in vars(cls).values()]
        while todo:
            code = todo.pop()
            if isinstance(code, types.CodeType) and code not in own:
                own.add(code)
                todo += code.co_consts
        names = {(code.co_filename, code.co_name) for code in own}

        def shared(code: types.CodeType) -> bool:
            resumes = private_names.resumed_function(code.co_name) or code.co_name  # after a graph break
            return code.co_filename.startswith(packages) or code in own or (code.co_filename, resumes) in names

        def entries() -> dict[int, tuple[Any, int]]:  # of the shared code Dynamo has converted
            codes = [ref() for ref in private_names.converted_codes()]
            return {id(c): (c, private_names.cache_entries(c)) for c in codes if c and shared(c)}

        before = {key: n for key, (_, n) in entries().items()}

        def reset() -> None:
            for key, (code, n) in entries().items():
                if _crowded(n, before.get(key, 0)):
                    private_names.reset_code(code)  # its entries, its recompile count and its "skip" mark

        self.defer(reset, scope="run")

    def _unwind(self, scope: _Scope) -> None:
        undo = self._undo[scope]
        with contextlib.ExitStack() as stack:  # every step runs, even after one that raised
            while undo:
                stack.callback(undo.pop(0))


def _crowded(entries: int, before: int = 0) -> bool:
    """Whether code holds more of Dynamo's entries than a step keeps in steady state (two grad modes, full and partial
    batches: at most half of Dynamo's recompile limit), and more than it held before (``before``, when the run began).
    """
    return entries > max(before, private_names.recompile_limit() // 2)


class _PlainState:
    """An object's ``__getstate__`` during a run: its state with the attributes the run changed as they were before.

    An attribute the object's own ``__getstate__`` leaves out (torchmetrics' wrapped ``update``) stays out.

    """

    def __init__(self, target: Any) -> None:
        self.target = target
        self.before: dict[str, Any] = {}

    def __call__(self) -> dict[str, Any]:
        getstate = getattr(type(self.target), "__getstate__", None)  # `object` has one from Python 3.11
        state = dict(getstate(self.target) if getstate is not None else vars(self.target))
        state.pop("__getstate__", None)
        for name, value in self.before.items():
            if name in state and value is _ABSENT:
                del state[name]
            elif name in state:
                state[name] = value
        return state


def _delete(target: Any, name: str) -> None:
    """Deletes ``target.name`` if the target holds it itself (a feature's own undo may have deleted it already)."""
    if name in vars(target):
        delattr(target, name)
