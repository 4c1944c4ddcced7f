"""Models, a counting backend and probes shared by the behaviour suite.

Nothing here imports ``lightning_compile_patch``: the same suite runs against a Lightning with the upstream patch
applied (see ``conftest.py``).
"""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from packaging.version import Version
from torch import nn
from torch._dynamo.utils import counters, get_compilation_metrics
from torch.nn.parallel import DistributedDataParallel

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

#: Whether the installed torch is 2.13 or newer (the version this package is developed on); older ones differ in places.
TORCH_2_13 = Version(torch.__version__.split("+")[0]) >= Version("2.13")
TORCH_2_7 = Version(torch.__version__.split("+")[0]) >= Version("2.7")

QUIET = {
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "accelerator": "cpu",
    "devices": 1,
}
#: Markers that a Dynamo graph break is one torch makes on purpose, at DDP's inner module call.
DDP_BOUNDARY = "_inside_ddp_forward"
#: Markers of every graph break in DDP's own code: the boundary, and its C++ reducer and logger (torch 2.14 steps
#: into DDP's forward and breaks at them).
DDP_BREAKS = (DDP_BOUNDARY, "of class `Reducer`", "of class `Logger`")


class LoggingModel(BoringModel):
    """BoringModel that calls ``self.log`` in every step, as most real models do."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().training_step(batch, batch_idx)
        self.log("train_loss", out["loss"])
        return out

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().validation_step(batch, batch_idx)
        self.log("val_loss", out["x"])
        return out

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().test_step(batch, batch_idx)
        self.log_dict({"test_loss": out["y"], "test_twice": 2 * out["y"]})
        return out


class ManualModel(BoringModel):
    """Manual optimization: the step runs its own ``manual_backward`` and optimizer step."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        opt = self.optimizers()
        loss = self.step(batch)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        self.log("loss", loss)
        return loss


_COUNTS: dict[str, dict[str, int]] = {}


class CountingBackend:
    """A ``torch.compile`` backend that runs graphs eagerly and counts how many it compiled and ran.

    Counts live in a module-level table under ``name``, so that a copy of the backend (Lightning deep-copies the
    arguments of ``torch.compile``) counts into the same place; :attr:`graphs_here` counts on the object itself, so a
    test can tell the user's own backend from a copy of it. With ``log_dir`` set, the first compile and the first call
    are also written to a file of the process's rank, so that a test can read what spawned processes did.

    """

    def __init__(self, name: str = "counting", log_dir: Any = None) -> None:
        self.name = name
        self.log_dir = str(log_dir) if log_dir is not None else None
        _COUNTS[name] = {"graphs": 0, "calls": 0}
        #: The graphs this very object compiled: a copy of it (``copy.deepcopy``) counts its own.
        self.graphs_here = 0

    @property
    def graphs(self) -> int:
        return _COUNTS[self.name]["graphs"]

    @property
    def calls(self) -> int:
        return _COUNTS[self.name]["calls"]

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        counts = _COUNTS.setdefault(self.name, {"graphs": 0, "calls": 0})
        counts["graphs"] += 1
        self.graphs_here += 1
        self._record("graphs")

        def run(*args: Any) -> Any:
            counts["calls"] += 1
            if counts["calls"] == 1:
                self._record("calls")
            return gm.forward(*args)

        return run

    def _record(self, what: str) -> None:
        if self.log_dir is None:
            return
        rank = os.environ.get("LOCAL_RANK", "0")
        with open(Path(self.log_dir, f"rank{rank}.jsonl"), "a") as f:
            f.write(json.dumps({"event": what, "pid": os.getpid()}) + "\n")


def read_rank_events(log_dir: Path) -> dict[str, list[str]]:
    """What :class:`CountingBackend` recorded in each rank's file."""
    return {
        path.stem: [json.loads(line)["event"] for line in path.read_text().splitlines()]
        for path in sorted(Path(log_dir).glob("rank*.jsonl"))
    }


@dataclass
class DynamoStats:
    """What Dynamo did between two points."""

    graphs: int
    frames: int
    recompiles: int
    graph_breaks: dict[str, int]
    max_entries_per_code: int

    @property
    def unintended_breaks(self) -> int:
        return sum(n for reason, n in self.graph_breaks.items() if not any(m in reason for m in DDP_BREAKS))


def dynamo_stats() -> DynamoStats:
    """Dynamo's counters since the last ``torch._dynamo.reset()`` / counter clear."""
    metrics = get_compilation_metrics()
    per_code: dict[tuple, int] = {}
    for m in metrics:
        key = (m.co_name, m.co_filename, m.co_firstlineno)
        per_code[key] = max(per_code.get(key, 0), (m.cache_size or 0) + 1)
    return DynamoStats(
        graphs=counters["stats"]["unique_graphs"],
        frames=counters["frames"]["total"],
        recompiles=sum(1 for m in metrics if m.cache_size),
        graph_breaks=dict(counters["graph_break"]),
        max_entries_per_code=max(per_code.values(), default=0),
    )


def compiled_state(trainer: Trainer) -> dict[str, Any]:
    """How the strategy's model is compiled right now."""
    module = trainer.lightning_module
    model = trainer.strategy.model
    return {
        "model_type": type(model),
        "wrapper_compiled": model is not module and model._compiled_call_impl is not None,
        "compiled_steps": sorted(
            name
            for name in ("training_step", "validation_step", "test_step", "predict_step")
            if _shadowed(module, name)
        ),
        "stock_compiled": module._compiler_ctx is not None,
    }


class StateProbe(Callback):
    """Records :func:`compiled_state` at the first batch of every stage."""

    def __init__(self) -> None:
        self.seen: dict[str, dict[str, Any]] = {}

    def _record(self, trainer: Trainer, stage: str) -> None:
        self.seen.setdefault(stage, compiled_state(trainer))

    def setup(self, trainer: Trainer, pl_module: Any, stage: str) -> None:
        # before the strategy's setup: Lightning's own path compiles here, ours only after the wrap
        self.seen.setdefault("setup", {"stock_compiled": pl_module._compiler_ctx is not None})

    def on_train_batch_start(self, trainer: Trainer, *args: Any) -> None:
        self._record(trainer, "train")

    def on_validation_batch_start(self, trainer: Trainer, *args: Any) -> None:
        if trainer.sanity_checking:
            self._record(trainer, "sanity")
        else:
            self._record(trainer, "fit_validate" if trainer.state.fn == "fit" else "validate")

    def on_test_batch_start(self, trainer: Trainer, *args: Any) -> None:
        self._record(trainer, "test")

    def on_predict_batch_start(self, trainer: Trainer, *args: Any) -> None:
        self._record(trainer, "predict")


class ReleaseProcessGroup(Callback):
    """Closes the process group on every rank at teardown, after a barrier.

    Lightning leaves gloo's process group alive when a ``ddp_spawn`` child exits. A rank that exits while its peer still
    holds the group can abort in gloo's thread destructors ("terminate called without an active exception", exit by
    SIGABRT), as CI saw in an eager run: a flake of the launcher, not of compiling.
    """

    def teardown(self, trainer: Trainer, pl_module: Any, stage: str) -> None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # gloo's monitored barrier fails after a minute where a plain one would wait 30 for a rank that died
            torch.distributed.monitored_barrier(timeout=timedelta(seconds=60))
            torch.distributed.destroy_process_group()


def _shadowed(module: nn.Module, name: str) -> bool:
    """Whether an instance attribute replaces the class's method ``name`` (a bound method of it does not count)."""
    attr = module.__dict__.get(name)
    return attr is not None and not (
        getattr(attr, "__self__", None) is module and attr.__func__ is getattr(type(module), name)
    )


def leftovers(module: nn.Module) -> list[str]:
    """Every trace of compilation left on ``module`` and its submodules; empty when all is undone."""
    found = [
        f"{name or 'root'}._compiled_call_impl"
        for name, sub in module.named_modules()
        if getattr(sub, "_compiled_call_impl", None) is not None
    ]
    found += [
        f"root.{attr}"
        for attr in ("forward", "training_step", "validation_step", "test_step", "predict_step", "log", "log_dict")
        if _shadowed(module, attr)
    ]
    found += [
        f"{name}.forward"
        for name, sub in module.named_modules()
        if name and "forward" in vars(sub) and not isinstance(sub, torch.jit.ScriptModule)  # TorchScript keeps its own
    ]
    if getattr(module, "_compiler_ctx", None) is not None:
        found.append("root._compiler_ctx")
    return found


def state_dict_keys(module: nn.Module) -> list[str]:
    return sorted(module.state_dict())


@contextmanager
def no_sync_counter(trainer: Trainer) -> Iterator[list[int]]:
    """Counts how often the strategy enters ``DistributedDataParallel.no_sync``."""
    entered = [0]
    original = DistributedDataParallel.no_sync

    @contextmanager
    def counting(self: DistributedDataParallel) -> Iterator[None]:
        entered[0] += 1
        with original(self):
            yield

    DistributedDataParallel.no_sync = counting
    try:
        yield entered
    finally:
        DistributedDataParallel.no_sync = original


def example(stem: str) -> Any:
    """A file of ``examples/`` (``gpt``, ``demo``) as a module, kept in ``sys.modules`` (its classes pickle).

    Loaded from its file, so that the run against a patched Lightning does not import ``lightning_compile_patch``.
    """
    name = f"lcp_demo_{stem}"
    if name not in sys.modules:
        path = Path(__file__).parents[1] / "examples" / f"{stem}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def demo_gpt() -> Any:
    """The demo's GPT module (``examples/gpt.py``)."""
    return example("gpt")


def lightning_side(name: str) -> Any:
    """A feature module (``regions``, ``cache``, ...): Lightning's on a patched Lightning, else ours."""
    try:
        return importlib.import_module(f"lightning.pytorch.trainer.connectors.compile_features.{name}")
    except ImportError:
        return importlib.import_module(f"lightning_compile_patch.compile_features.{name}")


def connector_module() -> Any:
    """The compile connector's module: Lightning's on a patched Lightning, else ours."""
    try:
        return importlib.import_module("lightning.pytorch.trainer.connectors.compile_connector")
    except ImportError:
        return importlib.import_module("lightning_compile_patch.compile_connector")


def feature(trainer: Trainer, name: str) -> Any:
    """The Trainer's feature object of the ``use_compile`` feature module ``name`` (``summary``, ...)."""
    found = [f for f in trainer._compile_connector.features if type(f).__module__.rpartition(".")[2] == name]
    assert len(found) == 1, f"no feature of the module {name!r} on this Trainer"
    return found[0]


class LoopedValidation(BoringModel):
    """A validation step with a graph break inside its loop: Dynamo skips its whole frame, and marks it "skip"."""

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        for row in batch.split(1):
            print(end="")  # the graph break
            self.log("row", self.step(row), batch_size=1)


def last_summary(trainer: Trainer) -> Any:
    """What the compiler did in the Trainer's last run that compiled anything (the run summary feature's record)."""
    return lightning_side("summary").last_summary(trainer)


class BackwardGraphs:
    """A backend for compiled autograd: runs each backward graph eagerly, and records whether it all-reduces.

    It writes one line per graph to the file of the process's rank, so that a test can read what spawned processes
    compiled.
    """

    def __init__(self, log_dir: Any) -> None:
        self.log_dir = str(log_dir)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        targets = [str(node.target) for node in gm.graph.nodes if node.op == "call_function"]
        rank = os.environ.get("LOCAL_RANK", "0")
        with open(Path(self.log_dir, f"backward{rank}.jsonl"), "a") as f:
            f.write(json.dumps({"all_reduce": any("all_reduce" in target for target in targets)}) + "\n")
        return gm.forward


class RankReport(Callback):
    """Writes what a run left in each rank, at teardown (after ``use_compile`` undid its changes), to ``rank{N}.json``.

    Put it before :class:`ReleaseProcessGroup` in the callbacks: callbacks tear down in order.
    """

    def __init__(self, log_dir: Any) -> None:
        self.log_dir = str(log_dir)

    def teardown(self, trainer: Trainer, pl_module: Any, stage: str) -> None:
        import torch._inductor.config
        from torch._dynamo import compiled_autograd, trace_rules

        report = {
            "captures": counters["compiled_autograd"]["captures"],
            "hooks": sum(len(p._post_accumulate_grad_hooks or {}) for p in pl_module.parameters()),
            "compiled_autograd_on": bool(compiled_autograd.compiled_autograd_enabled),
            "optimize_ddp": repr(torch._dynamo.config.optimize_ddp),
            "fuse_ddp_communication": torch._inductor.config._fuse_ddp_communication,
            "ddp_inlined": "torch.nn.parallel.distributed" in trace_rules.LEGACY_MOD_INLINELIST,
            "state": {name: t.detach().double().flatten().tolist() for name, t in pl_module.state_dict().items()},
        }
        Path(self.log_dir, f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


def read_backward_graphs(log_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """What :class:`BackwardGraphs` recorded, by rank: one entry per backward graph."""
    return {
        int(p.stem[len("backward") :]): [json.loads(line) for line in p.read_text().splitlines()]
        for p in Path(log_dir).glob("backward*.jsonl")
    }


def read_rank_reports(log_dir: Path) -> dict[int, dict[str, Any]]:
    """What :class:`RankReport` wrote, by rank."""
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in sorted(Path(log_dir).glob("rank*.json"))}


def run_launched_script(workdir: Path, source: str) -> "subprocess.CompletedProcess[str]":
    """Runs ``source`` as ``workdir/train.py`` in a new process, as a user runs a script that Lightning's subprocess
    launcher (``strategy="ddp"``) starts again for the other ranks; fails the test if it fails."""
    script = workdir / "train.py"
    script.write_text(textwrap.dedent(source))
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_PORT")}
    result = subprocess.run(
        [sys.executable, str(script)], cwd=workdir, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result
