"""Manual optimization under ``use_compile``: a step may run the backward twice through one graph.

AOTAutograd donates the buffers that a compiled backward saves, so that it can free them early, and then refuses a
second backward through the same graph: ``retain_graph=True``, a closure that calls ``manual_backward`` again, or
several optimizers stepped from one loss (GANs) stop with "compiled with non-empty donated buffers". Lightning's
automatic optimization runs one backward per graph; a manual step may not. For the runs of a model with
``automatic_optimization = False``, donated buffers are off, which costs some peak memory in the backward and nothing
else.

"""

from typing import Any, Optional

import torch._functorch.config as functorch_config

import lightning.pytorch as pl
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from lightning_compile_patch.connector import _CompileConnector, _CompileFeature

#: torch 2.6+ donates buffers in compiled backwards; older releases have no such setting.
_DONATES_BUFFERS = hasattr(functorch_config, "donated_buffer")


class _ManualOptimization(_CompileFeature):
    """Switches AOTAutograd's donated buffers off for the runs of a manually optimized model."""

    order = 20

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        self._previous: Optional[bool] = None
        self._told = False

    def on_run_start(self, connector: _CompileConnector, model: "pl.LightningModule") -> None:
        if model.automatic_optimization or not _DONATES_BUFFERS or not functorch_config.donated_buffer:
            return
        # process-wide, and read when a backward is compiled, during the run: set for the run, restored in `teardown`
        self._previous, functorch_config.donated_buffer = functorch_config.donated_buffer, False
        if not self._told:
            self._told = True
            rank_zero_info(
                "`use_compile`: manual optimization can run the backward twice through one graph, so AOTAutograd's"
                " donated buffers (`torch._functorch.config.donated_buffer`) are off for this Trainer's runs."
            )

    def teardown(self, connector: _CompileConnector) -> None:
        if self._previous is not None:
            functorch_config.donated_buffer, self._previous = self._previous, None


FEATURE = _ManualOptimization
