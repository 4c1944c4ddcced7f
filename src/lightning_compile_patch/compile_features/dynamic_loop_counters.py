"""Lightning's loop counters are dynamic in the compiled step: reading ``self.current_epoch`` recompiles nothing.

A step that reads ``self.current_epoch`` or ``self.global_step`` (a curriculum, a KL-annealing weight, a warm-up)
reads an int through the module, ``self._trainer.fit_loop...``, and Dynamo guards such an int by its value: every new
epoch, or every step, compiled the step again, until Dynamo's recompile limit left it uncompiled for the rest of the
run. ``use_compile={"dynamic": True}`` does not change that, since it applies to the step's inputs, not to attributes.

For the run, every int under a loop of the Trainer is marked dynamic (``torch.compiler.config.dynamic_sources``, torch
2.8+, a process-wide setting put back when the run ends): the step is compiled for a symbolic epoch and step, once. A
branch on one (``if self.current_epoch == 0``) still compiles each side once. With ``use_compile={"dynamic": False}``
nothing is marked: static code was asked for (CUDA graphs, for one, would record a graph per value otherwise).

"""

from typing import Any

import torch

from lightning_compile_patch.compile_features import _CompileFeature, _CompileOptions, _flag
from lightning_compile_patch.compile_features import _private_names as private_names
from lightning_compile_patch.compile_features._run import _CompileRun


class _DynamicLoopCounters(_CompileFeature):
    """Marks the Trainer's loop counters dynamic for the run."""

    keys = {"dynamic_loop_counters": "True: reading `current_epoch` or `global_step` in a step does not recompile it"}

    def __init__(self, options: _CompileOptions) -> None:
        _flag(options, "dynamic_loop_counters")

    def on_run_start(self, run: _CompileRun, model: Any) -> None:
        if not private_names.DYNAMIC_SOURCES_MATCH_PATTERNS or (run.given or {}).get("dynamic") is False:
            return  # `dynamic=False` asks for static code: the counters stay specialized, as torch does
        config = torch.compiler.config
        given = config.dynamic_sources
        sources = private_names.TRAINER_LOOP_SOURCES
        value = f"{given},{sources}" if given else sources  # the user's own sources stay
        run.replace(config, "dynamic_sources", value, scope="run")


FEATURE = _DynamicLoopCounters
