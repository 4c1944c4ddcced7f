"""A trace made in one stage never runs in another: compiled steps are keyed on the Trainer's stage and function.

A step that picks a value by the stage, such as a metric name from a dict keyed by ``self.trainer.state.stage``
(``{RunningStage.SANITY_CHECKING: "sanity_check_loss", RunningStage.VALIDATING: "val_loss"}[...]``), reads an Enum that
Dynamo uses as a dict key without a guard on it (torch 2.13; ``docs/repros/enum_dict_key_guard.py``). The validation
step's trace made during the sanity check then ran in every later validation epoch, and logged ``sanity_check_loss``
instead of ``val_loss``: ReduceLROnPlateau, EarlyStopping and ModelCheckpoint on ``val_loss`` never saw it. The same
holds for ``trainer.state.fn``, which differs between fit's validation and ``validate``.

Dynamo does guard the type of every object a step reads an attribute of. So for the run, ``trainer.state`` takes a
class of its own for each pair of ``fn`` and ``stage`` (a subclass of ``TrainerState``, switched whenever Lightning
sets either): a step that reads ``trainer.state`` compiles once per stage it runs in, and a step that does not read it
compiles as before. The values stay where they are, the state compares, prints and pickles as a ``TrainerState``, and
its class is put back when the run ends.

"""

from typing import Any, Optional

import torch
from packaging.version import Version

from lightning.pytorch.trainer.states import RunningStage, TrainerFn, TrainerState
from lightning_compile_patch.compile_features import _CompileFeature, _CompileOptions, _flag
from lightning_compile_patch.compile_features._run import _CompileRun

_KEYED = ("fn", "stage")
#: The torch it was checked on (2.13): on 2.6, a step that read the state made Dynamo recurse until Python's limit.
_CHECKED = Version(torch.__version__.split("+")[0]) >= Version("2.13")


class _KeyedTrainerState(TrainerState):
    """``TrainerState`` whose class names its ``fn`` and ``stage``: the type guard of a compiled step keys on them."""

    # Lightning reads `fn` and `stage` many times a step (`trainer.training`, ...), and sets them a few times a run: the
    # class is switched as they are set, so that reading them stays a plain attribute read
    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name in _KEYED:
            object.__setattr__(self, "__class__", _keyed_class(self.fn, self.stage))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TrainerState):
            return NotImplemented
        return (self.status, self.fn, self.stage) == (other.status, other.fn, other.stage)

    __hash__ = None  # type: ignore[assignment]  # as the dataclass's

    def __repr__(self) -> str:
        return f"TrainerState(status={self.status!r}, fn={self.fn!r}, stage={self.stage!r})"

    def __reduce__(self) -> tuple:
        return TrainerState, (self.status, self.fn, self.stage)  # a plain state: the keyed classes are the run's


_CLASSES: dict[tuple[Optional[TrainerFn], Optional[RunningStage]], type[_KeyedTrainerState]] = {}


def _keyed_class(fn: Optional[TrainerFn], stage: Optional[RunningStage]) -> type[_KeyedTrainerState]:
    key = (fn, stage)
    if key not in _CLASSES:
        name = f"TrainerState[{fn.value if fn else None}, {stage.value if stage else None}]"
        _CLASSES[key] = type(name, (_KeyedTrainerState,), {"__module__": __name__})
    return _CLASSES[key]


class _StageGuards(_CompileFeature):
    """For the run, the Trainer's state takes a class per stage, so that compiled steps are keyed on it."""

    keys = {"stage_guards": "True: a step that reads `trainer.state` compiles once per stage, never reusing another's"}

    def __init__(self, options: _CompileOptions) -> None:
        _flag(options, "stage_guards")

    def on_run_start(self, run: _CompileRun, model: Any) -> None:
        if not _CHECKED:
            return  # torch 2.6's Dynamo recursed without end on the swapped class; checked on 2.13
        state = run.trainer.state
        if type(state) is not TrainerState:  # a state of another class (the user's, or keyed already): left alone
            return
        run.replace(state, "__class__", _keyed_class(state.fn, state.stage), scope="run")


FEATURE = _StageGuards
