"""The script of Lightning's `use_compile` feature request trains 2 epochs on CPU, both ways, as written (inductor)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TARGET

SEED = Path(__file__).parents[1] / "examples" / "seed_ddp_compiled_autograd.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        TARGET == "upstream", reason="the seed imports pytorch_lightning, which the series leaves as is"
    ),
]


@pytest.mark.parametrize("model", ["compiled", "plain"])
def test_seed_script_trains_two_epochs(model, tmp_path):
    result = run_seed(model, tmp_path)
    finished = re.search(r"seed run finished: model=(\w+) steps=(\d+) mse_after_training=([\d.]+)", result.stdout)
    assert finished, result.stdout[-2000:]
    assert finished.group(1) == model
    assert int(finished.group(2)) == 64  # 2 epochs of 1000 samples in batches of 32
    assert float(finished.group(3)) < 1.0  # y = sum(x) over 10 features has variance 10 before training
    if model == "plain":  # `use_compile=True`: the run's summary; a compiled model passed in gets none
        assert "compiled after the wrap: _CompileSummary(stage='fit'" in result.stdout
    dynamo = re.search(r"dynamo: graphs=(\d+) graph_breaks=(\d+)", result.stdout)
    assert dynamo, result.stdout[-2000:]
    assert int(dynamo.group(1)) > 0
    assert dynamo.group(2) == "0"  # python_reducer: DDP's forward is one graph with the model


def test_seed_setup_in_one_option_trains_two_epochs_in_two_spawned_processes(tmp_path):
    """`use_compile={"compiled_autograd": True}` under `ddp_spawn`: python reducer, compiled autograd, in each rank."""
    result = run_seed("option", tmp_path)
    finished = re.search(r"seed run finished: model=option steps=\S+ mse_after_training=([\d.]+)", result.stdout)
    assert finished, result.stdout[-2000:]
    assert float(finished.group(1)) < 5.0  # half the steps of one process (2 ranks); the weights came back trained
    output = result.stdout + result.stderr
    # each rank's summary: every training step compiled, the backward too
    summary = re.search(r"steps: training (\d+) compiled / 0 eager, compiled autograd: (\d+) backward graph", output)
    assert summary, output[-3000:]
    assert int(summary.group(1)) == 32  # 2 epochs of 500 samples per rank in batches of 32
    assert int(summary.group(2)) > 0


def run_seed(model: str, tmp_path) -> subprocess.CompletedProcess:
    # a cache of the test's own, so that inductor compiles from scratch: it wins over one the process inherited (torch
    # sets the variable in this process at its first inductor compile, so an earlier inductor test can leave one)
    cache = tmp_path / "inductor"
    result = subprocess.run(
        [sys.executable, str(SEED), "--model", model],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**_env(), "TORCHINDUCTOR_CACHE_DIR": str(cache)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # inductor compiled into that cache
    assert list(cache.rglob("*.py")), f"inductor wrote no code to {cache}"
    return result


def _env():
    import os

    return {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
