"""Each Trainer's runs get Dynamo's whole recompile budget, however many Trainers compiled before them in the process.

Dynamo keeps its compiled entries, its recompile count and its "skip" marks per code object, for the life of the
process. In a sweep (Optuna, Ray Tune, a notebook: one model class, a new Trainer and a new width or depth per trial),
each trial added entries to the same code objects: the step methods of the model class and, where DDP's call is
compiled (its python reducer), Lightning's own forward redirection, which every model shares. Measured when DDP's call
was always compiled (2026-11): from the 9th trial on one device, and the 5th under DDP, every step ran eagerly.

So when a run starts for another Trainer than the last compiled run of the process, each code object that Dynamo first
converted during a compiled run, and that holds more than half of Dynamo's recompile limit in compiled entries (or was
left "skip" at the limit), is reset: its entries, its count and its mark go, and this Trainer compiles it afresh. So is
code that holds no entry, which Dynamo marked "skip" when it failed to compile it (a graph break in a loop): this
Trainer tries it again, and its run summary names the cause from this run's own failure, rather than "an earlier error
in this process". Code with fewer entries keeps them (a step keeps at most one per grad mode and batch shape class:
four), so repeated runs of one configuration (cross-validation) reuse their compiled code; code compiled outside the
Trainer's runs is left alone. The runs of one Trainer (``fit``, then ``validate``, ``test``, ``predict``) share their
compiled code: each step compiles once for all of them.

``torch.compile(isolate_recompiles=True)`` (torch 2.13+) keeps apart only the frames of one call, not a Trainer's runs,
and no other torch has it; a reset works on every torch.

"""

import time
import types
import weakref
from typing import Any

from lightning_compile_patch.compile_features import _CompileFeature, _CompileOptions, _flag
from lightning_compile_patch.compile_features import _private_names as private_names
from lightning_compile_patch.compile_features._run import _CompileRun

#: The Trainer whose run compiled last in this process, and the spans of ``converted_codes()`` that compiled runs added
#: (adjacent runs share one span, so this stays as short as the runs are interleaved with code compiled outside them),
#: and the code that failed to compile in that Trainer's runs (weak references; emptied when another Trainer starts).
_LAST: dict[str, Any] = {"trainer": None, "start": None, "spans": [], "started_us": None, "failed": []}


class _CompileBudget(_CompileFeature):
    """Resets what earlier Trainers compiled, when another Trainer's run starts."""

    keys = {"compile_budget": "True: each Trainer's runs get a recompile budget of their own for the code they compile"}

    def on_run_start(self, run: _CompileRun, model: Any) -> None:
        seen = private_names.converted_codes()
        spans: list[list[int]] = _LAST["spans"]
        if spans and spans[-1][1] > len(seen):  # `torch._dynamo.reset()` emptied Dynamo's record: so is ours
            spans.clear()
        last = _LAST["trainer"]() if _LAST["trainer"] is not None else None
        if last is not run.trainer:
            codes = [code for start, end in spans for ref in seen[start:end] if (code := ref()) is not None]
            run.reset(codes, crowded_only=True)
            # code that failed to compile after it had compiled entries (a step that raised in one of its branches):
            # Dynamo marked it "skip" with its entries kept
            run.reset(code for ref in _LAST["failed"] if (code := ref()) is not None)
            _LAST["failed"] = []
        _LAST.update(trainer=weakref.ref(run.trainer), start=len(seen), started_us=time.time_ns() // 1000)

    def __init__(self, options: _CompileOptions) -> None:
        _flag(options, "compile_budget")

    def teardown(self, run: _CompileRun) -> None:
        start, end, spans = _LAST["start"], len(private_names.converted_codes()), _LAST["spans"]
        if start is None or start > end:
            return
        _LAST["failed"] += _failed_codes(_LAST["started_us"])
        if spans and spans[-1][1] == start:
            spans[-1][1] = end
        else:
            spans.append([start, end])
        _LAST["start"] = None


def _failed_codes(since_us: int) -> list["weakref.ref[types.CodeType]"]:
    """The code Dynamo failed to compile since ``since_us``, from its compilation metrics (none on torch 2.1)."""
    return [weakref.ref(code) for code in private_names.failed_codes(since_us)]


FEATURE = _CompileBudget
