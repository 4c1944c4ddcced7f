"""Two CPU processes: ``ddp_spawn`` children compile too, though they never import ``lightning_compile_patch``.

The children unpickle the Trainer. Its compile connector is an object of this package (or, on a patched Lightning, of
Lightning itself), so unpickling it imports the package, and the import patches the child's Trainer before it runs.
"""

import json
from pathlib import Path

import pytest
import torch

from conftest import TARGET
from helpers import QUIET, CountingBackend, LoggingModel, ReleaseProcessGroup, read_rank_events, run_launched_script
from lightning.pytorch import Trainer, seed_everything

pytestmark = pytest.mark.slow


def two_processes():
    return {**QUIET, "devices": 2, "callbacks": [ReleaseProcessGroup()]}


def test_ddp_spawn_children_compile(tmp_path):
    backend = CountingBackend("spawn", log_dir=tmp_path)
    trainer = Trainer(
        strategy="ddp_spawn",
        use_compile={"backend": backend},
        max_epochs=1,
        limit_train_batches=3,
        limit_val_batches=1,
        **two_processes(),
    )
    trainer.fit(LoggingModel())
    events = read_rank_events(tmp_path)
    assert sorted(events) == ["rank0", "rank1"]
    for rank_events in events.values():
        assert "graphs" in rank_events
        assert "calls" in rank_events
    assert {"train_loss", "val_loss"} <= trainer.callback_metrics.keys()


def test_ddp_spawn_reapplies_a_compiled_model(tmp_path):
    backend = CountingBackend("spawn_compiled", log_dir=tmp_path)
    model = torch.compile(LoggingModel(), backend=backend)
    trainer = Trainer(strategy="ddp_spawn", max_steps=2, limit_val_batches=0, **two_processes())
    trainer.fit(model)
    events = read_rank_events(tmp_path)
    assert sorted(events) == ["rank0", "rank1"]
    assert all("calls" in rank_events for rank_events in events.values())


def test_ddp_spawn_matches_eager_weights(tmp_path):
    weights = {}
    for name, use_compile in (("eager", None), ("compiled", {"backend": "aot_eager"})):
        seed_everything(3)
        model = LoggingModel()
        trainer = Trainer(
            strategy="ddp_spawn", use_compile=use_compile, max_steps=3, limit_val_batches=0, **two_processes()
        )
        trainer.fit(model)
        weights[name] = model.layer.weight.detach().clone()
    torch.testing.assert_close(weights["compiled"], weights["eager"])


SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
{import_line}
import torch
from helpers import QUIET, CountingBackend, LoggingModel
from lightning.pytorch import Trainer, seed_everything

seed_everything(0)
backend = CountingBackend("ddp", log_dir={log_dir!r})
use_compile = {{"backend": backend}} if {compiled!r} else None
options = {{**QUIET, "devices": 2, "max_steps": 3, "limit_val_batches": 1}}
trainer = Trainer(strategy="ddp", use_compile=use_compile, **options)
model = LoggingModel()
trainer.fit(model)
if trainer.global_rank == 0:
    print("WEIGHTS", model.layer.weight.detach().flatten().tolist(), flush=True)
# Lightning leaves the gloo process group alive; a rank that exits while its peer still holds the group can
# abort in gloo's thread destructors ("terminate called without an active exception"). Close it on every rank.
torch.distributed.barrier()
torch.distributed.destroy_process_group()
"""


def run_ddp_script(tmp_path, compiled):
    import_line = "import lightning_compile_patch" if TARGET == "package" else ""
    workdir = tmp_path / ("compiled" if compiled else "eager")
    workdir.mkdir()
    tests = str(Path(__file__).parent)
    source = SCRIPT.format(tests=tests, import_line=import_line, log_dir=str(workdir), compiled=compiled)
    result = run_launched_script(workdir, source)
    weights = next(line for line in result.stdout.splitlines() if line.startswith("WEIGHTS "))
    return json.loads(weights[len("WEIGHTS ") :]), read_rank_events(workdir)


def test_ddp_subprocess_launcher_patches_every_rank(tmp_path):
    """`strategy="ddp"` re-runs the script in each rank; the script's own import patches each of them."""
    eager, _ = run_ddp_script(tmp_path, compiled=False)
    compiled, events = run_ddp_script(tmp_path, compiled=True)
    assert sorted(events) == ["rank0", "rank1"]
    assert all("calls" in rank_events for rank_events in events.values())
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager))
