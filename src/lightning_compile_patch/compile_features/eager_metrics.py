"""Metrics of ``torchmetrics`` under ``use_compile``: a metric is updated outside the compiled graph.

A ``torchmetrics.Metric`` is bookkeeping, like ``self.log``: each call counts itself in a Python int
(``_update_count``), caches its result and may sync across processes. Dynamo guards on that int, so a step that calls
a metric recompiles at every step until it reaches the recompile limit, and runs eager from then on. For the run, the
``forward`` of each metric class in the model and the ``update`` and ``compute`` of each metric are compiler-disabled:
the step's graph breaks around each metric call and is compiled once. A metric pickled or copied during the run
(a checkpoint's hyperparameters, an EMA copy of the model) carries none of them.

"""

import sys
from collections.abc import Mapping
from typing import Any

import torch

from lightning_compile_patch.compile_features import _CompileFeature, _CompileOptions, _flag
from lightning_compile_patch.compile_features._run import _CompileRun


class _EagerMetrics(_CompileFeature):
    """Keeps the metrics of the model out of the compiled graphs for the run."""

    keys = {"eager_metrics": "True: torchmetrics' methods run eagerly, outside the compiled graphs"}

    def __init__(self, options: _CompileOptions) -> None:
        _flag(options, "eager_metrics")

    def setup(self, run: _CompileRun) -> Mapping[str, Any]:
        if "torchmetrics" not in sys.modules:  # no metric can exist, and importing it would be slow
            return {}
        from torchmetrics import Metric

        metrics = [m for m in run.trainer.lightning_module.modules() if isinstance(m, Metric)]
        for cls in dict.fromkeys(type(metric) for metric in metrics):
            # on the class: a `forward` of the instance would be pickled with it, and copied to a deep copy, bound to
            # the original (torchmetrics drops its instance's `update` and `compute` from what it pickles, not this)
            run.replace(cls, "forward", torch.compiler.disable(cls.forward))
        for metric in metrics:
            for name in ("update", "compute"):  # torchmetrics wraps these on each instance, so they are replaced there
                run.replace(metric, name, torch.compiler.disable(getattr(metric, name)))
        return {}


FEATURE = _EagerMetrics
