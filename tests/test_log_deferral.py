"""`self.log` in a compiled step: recorded while the step is traced, replayed right after it, so nothing breaks the
graph and every stage logs what an eager run logs."""

import pytest
import torch

from helpers import CountingBackend, dynamo_stats
from test_stages import STAGE_BATCHES, CompiledCallsPerStep, run_all_stages


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_compiled_steps_log_the_same_values_as_eager(strategy):
    _, eager, eager_predictions = run_all_stages(strategy, None)
    _, compiled, compiled_predictions = run_all_stages(strategy, {"backend": "eager"})
    for stage in ("fit", "validate", "test"):
        assert compiled[stage].keys() == eager[stage].keys()
        for key, value in eager[stage].items():
            torch.testing.assert_close(compiled[stage][key], value)
    assert {"train_loss", "val_loss"} <= eager["fit"].keys()
    assert {"test_loss", "test_twice"} <= eager["test"].keys()
    for ours, theirs in zip(compiled_predictions, eager_predictions, strict=True):
        torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_logging_causes_no_graph_break(strategy):
    run_all_stages(strategy, {"backend": "eager"})
    stats = dynamo_stats()
    assert stats.graphs > 0
    assert stats.unintended_breaks == 0, stats.graph_breaks


def test_fullgraph_works_with_a_model_that_logs():
    """`self.log` is replayed outside the graph, so `fullgraph=True` holds on one device."""
    backend = CountingBackend("fullgraph")
    calls = CompiledCallsPerStep(backend)
    run_all_stages("auto", {"backend": backend, "fullgraph": True}, callbacks=[calls])
    assert dynamo_stats().graph_breaks == {}
    # and the steps did compile and run as graphs: with nothing compiled there would be no break either
    assert backend.graphs > 0
    assert {stage: len(n) for stage, n in calls.calls.items()} == STAGE_BATCHES
    assert all(n > 0 for per_batch in calls.calls.values() for n in per_batch), calls.calls
