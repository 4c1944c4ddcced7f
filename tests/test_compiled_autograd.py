"""`use_compile={"compiled_autograd": ...}`: the backward compiled too, and under DDP with its all-reduces inside.

The seed of this project trains with DDP's python reducer and compiled autograd, set up by hand in one process. The
option does it in each rank, under every launcher, and puts back what it changed.
"""

import contextlib
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch._dynamo import compiled_autograd, trace_rules
from torch._dynamo.utils import counters
from torch.utils.data import DataLoader

from conftest import TARGET
from helpers import (
    QUIET,
    TORCH_2_13,
    BackwardGraphs,
    ManualModel,
    RankReport,
    ReleaseProcessGroup,
    last_summary,
    read_backward_graphs,
    read_rank_reports,
    run_launched_script,
)
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from lightning.pytorch.strategies import DDPStrategy

DDP_FILE = "torch.nn.parallel.distributed"
#: What building a DDP under its python reducer sets in inductor's config for the process.
INDUCTOR_SETTINGS_DDP_SETS = ("_fuse_ddp_communication", "_fuse_ddp_bucket_size")


class BatchNormModel(BoringModel):
    """Buffers that DDP broadcasts from rank 0 before each forward: the running statistics."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Sequential(nn.Linear(32, 16), nn.BatchNorm1d(16), nn.Linear(16, 2))

    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 64), batch_size=4)


def fit_two_spawned_ranks(tmp_path: Path, name: str, model_cls, compiled: bool, **trainer_kwargs) -> dict:
    """Fits ``model_cls`` on 2 ``ddp_spawn`` ranks, eagerly or with compiled autograd; returns each rank's report."""
    log_dir = tmp_path / name
    log_dir.mkdir()
    backward = {"backend": BackwardGraphs(log_dir)}
    use_compile = {"backend": "aot_eager", "compiled_autograd": backward} if compiled else None
    seed_everything(7)
    trainer = Trainer(
        use_compile=use_compile,
        max_steps=4,
        limit_val_batches=0,
        **{**QUIET, "devices": 2, "callbacks": [RankReport(log_dir), ReleaseProcessGroup()]},
        **trainer_kwargs,
    )
    trainer.fit(model_cls())
    return {"ranks": read_rank_reports(log_dir), "backward": read_backward_graphs(log_dir)}


def assert_compiled_autograd_ran_and_left_nothing(run: dict) -> None:
    assert sorted(run["ranks"]) == [0, 1]
    for rank, report in run["ranks"].items():
        assert report["captures"] > 0, rank
        # the python reducer's all-reduce is inside the compiled backward graph, in every rank
        assert any(graph["all_reduce"] for graph in run["backward"][rank]), rank
        assert report["hooks"] == 0, rank  # else a later plain `backward()` would still all-reduce
        assert report["compiled_autograd_on"] is False, rank
        assert report["optimize_ddp"] == "True", rank  # torch's default, as before the run
        assert report["fuse_ddp_communication"] is False, rank
        assert report["ddp_inlined"] is False, rank


def assert_same_state(compiled: dict, eager: dict) -> None:
    """Every parameter and buffer, in each rank, equal to eager DDP's.

    Bitwise on torch 2.13 and 2.14; on 2.6 and 2.9 manual optimization differs in the last bits (measured: 3e-8).
    """
    for rank in (0, 1):
        for name, values in eager["ranks"][rank]["state"].items():
            state = compiled["ranks"][rank]["state"][name]
            if TORCH_2_13:
                assert state == values, (rank, name)
            else:
                torch.testing.assert_close(torch.tensor(state), torch.tensor(values), msg=f"rank {rank}: {name}")


pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("model_cls", "static_graph", "trainer_kwargs"),
    [
        # eager DDP itself fails with a static graph and accumulation (`no_sync`): torch's assert in its C++ reducer
        pytest.param(BatchNormModel, False, {"accumulate_grad_batches": 2}, id="batchnorm-accumulation"),
        pytest.param(BatchNormModel, True, {}, id="batchnorm-static_graph"),
        pytest.param(ManualModel, False, {}, id="manual-optimization"),
    ],
)
def test_ddp_spawn_equals_eager_ddp_in_every_rank(tmp_path, model_cls, static_graph, trainer_kwargs):
    runs = {
        name: fit_two_spawned_ranks(
            tmp_path,
            name,
            model_cls,
            compiled=name == "compiled",
            strategy=DDPStrategy(start_method="spawn", static_graph=static_graph),
            **trainer_kwargs,
        )
        for name in ("eager", "compiled")
    }
    assert_compiled_autograd_ran_and_left_nothing(runs["compiled"])
    assert_same_state(runs["compiled"], runs["eager"])


SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
{import_line}
from helpers import QUIET, BackwardGraphs, RankReport, ReleaseProcessGroup
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.demos.boring_classes import BoringModel

seed_everything(7)
log_dir = {log_dir!r}
backward = {{"backend": BackwardGraphs(log_dir)}}
use_compile = {{"backend": "aot_eager", "compiled_autograd": backward}} if {compiled!r} else None
callbacks = [RankReport(log_dir), ReleaseProcessGroup()]
trainer = Trainer(strategy="ddp", use_compile=use_compile, max_steps=4, limit_val_batches=0,
                  **{{**QUIET, "devices": 2, "callbacks": callbacks}})
trainer.fit(BoringModel())
"""


def fit_two_launched_ranks(tmp_path: Path, name: str, compiled: bool) -> dict:
    """``strategy="ddp"``: the subprocess launcher runs the script again for rank 1; nothing is set in the parent."""
    log_dir = tmp_path / name
    log_dir.mkdir()
    import_line = "import lightning_compile_patch" if TARGET == "package" else ""
    tests = str(Path(__file__).parent)
    run_launched_script(
        log_dir, SCRIPT.format(tests=tests, import_line=import_line, log_dir=str(log_dir), compiled=compiled)
    )
    return {"ranks": read_rank_reports(log_dir), "backward": read_backward_graphs(log_dir)}


def test_ddp_subprocess_launcher_equals_eager_ddp_in_every_rank(tmp_path):
    runs = {name: fit_two_launched_ranks(tmp_path, name, name == "compiled") for name in ("eager", "compiled")}
    assert_compiled_autograd_ran_and_left_nothing(runs["compiled"])
    assert_same_state(runs["compiled"], runs["eager"])


@pytest.mark.parametrize("strategy", ["auto", "ddp"], ids=["one-device", "ddp-one-process"])
def test_in_process_equals_eager_and_restores_the_process(tmp_path, strategy):
    """One device: compiled autograd alone. DDP in this process: the globals DDP sets for the process are put back."""
    weights = {}
    for name, use_compile in (("eager", None), ("compiled", {"backend": "aot_eager", "compiled_autograd": True})):
        seed_everything(7)
        model = BatchNormModel()
        trainer = Trainer(strategy=strategy, use_compile=use_compile, max_steps=4, limit_val_batches=0, **QUIET)
        captures = counters["compiled_autograd"]["captures"]
        optimize_ddp = torch._dynamo.config.optimize_ddp
        fuse_ddp_bucket_size = torch._inductor.config._fuse_ddp_bucket_size
        trainer.fit(model)
        weights[name] = {k: v.clone() for k, v in model.state_dict().items()}
    assert counters["compiled_autograd"]["captures"] > captures
    assert last_summary(trainer).notes == ["compiled autograd: 1 backward graph compiled"]
    for key, value in weights["eager"].items():
        assert torch.equal(weights["compiled"][key], value), key
    assert not compiled_autograd.compiled_autograd_enabled
    assert torch._dynamo.config.optimize_ddp == optimize_ddp
    assert DDP_FILE not in trace_rules.LEGACY_MOD_INLINELIST
    assert torch._inductor.config._fuse_ddp_communication is False
    assert torch._inductor.config._fuse_ddp_bucket_size == fuse_ddp_bucket_size
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())


class RecordReducer(Callback):
    """What DDP's reducer setting is, and whether compiled autograd is on, in each stage's first batch."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple] = {}

    def _record(self, trainer, *_) -> None:
        state = (torch._dynamo.config.optimize_ddp, bool(compiled_autograd.compiled_autograd_enabled))
        self.seen.setdefault(trainer.state.stage.value, state)

    on_train_batch_start = on_validation_batch_start = on_test_batch_start = on_predict_batch_start = _record


def test_the_python_reducer_is_set_to_fit_only():
    """DDP wraps the model to fit only: validate, test and predict run the LightningModule itself, with the default."""
    record = RecordReducer()
    use_compile = {"backend": "eager", "compiled_autograd": True}
    trainer = Trainer(strategy="ddp", use_compile=use_compile, max_steps=2, callbacks=[record], **QUIET)
    model = BoringModel()
    trainer.fit(model)
    for stage in (trainer.validate, trainer.test, trainer.predict):
        stage(model)
    assert record.seen["train"] == ("python_reducer", True)
    for stage in ("validate", "test", "predict"):  # compiled autograd on (no backward runs), the python reducer not
        assert record.seen[stage][1] is True, stage
        assert record.seen[stage][0] != "python_reducer", stage
    assert torch._dynamo.config.optimize_ddp is True
    assert not compiled_autograd.compiled_autograd_enabled


class PreForwardRunsAsPython(Callback):
    """Counts, per training step, the calls of DDP's ``_pre_forward`` that ran as Python (its own frame)."""

    def __init__(self) -> None:
        self.per_step: list[int] = []
        self._code = torch.nn.parallel.DistributedDataParallel._pre_forward.__code__

    def on_train_batch_start(self, *_) -> None:
        self.per_step.append(0)

        def profile(frame, event, arg):
            if event == "call" and frame.f_code is self._code:
                self.per_step[-1] += 1

        sys.setprofile(profile)  # traced code runs as a graph: its frames do not show here

    def on_train_batch_end(self, *_) -> None:
        sys.setprofile(None)


@pytest.mark.parametrize("how", ["use_compile", "compiled model, the reducer set by hand"])
def test_under_the_python_reducer_ddp_pre_forward_runs_compiled_at_every_step(how):
    """The first seed's own setup: with DDP's python reducer, DDP's call is compiled, its ``_pre_forward`` with it.

    Under DDP's C++ reducer the steps are compiled inside DDP's call, which runs as Python whatever compiles it; the
    python reducer is the one setup where compiling the call traces DDP's own code.
    """
    probe = PreForwardRunsAsPython()
    model = BoringModel()
    by_hand = how != "use_compile"
    if by_hand:
        model, use_compile = torch.compile(model, backend="eager"), None
    else:
        use_compile = {"backend": "eager", "compiled_autograd": True}
    trainer = Trainer(
        strategy="ddp", use_compile=use_compile, max_steps=4, limit_val_batches=0, callbacks=[probe], **QUIET
    )
    with contextlib.ExitStack() as by_hand_settings:
        if by_hand:  # the user's own settings, which DDP's python reducer adds to: put back for the next tests
            by_hand_settings.enter_context(torch._dynamo.config.patch(optimize_ddp="python_reducer"))
            fused = {name: getattr(torch._inductor.config, name) for name in INDUCTOR_SETTINGS_DDP_SETS}
            by_hand_settings.enter_context(torch._inductor.config.patch(fused))
            by_hand_settings.callback(trace_rules.get_legacy_mod_inlinelist.cache_clear)
            by_hand_settings.callback(trace_rules.LEGACY_MOD_INLINELIST.discard, DDP_FILE)
        trainer.fit(model)
    assert probe.per_step[1:] == [0, 0, 0]  # the first step compiles: Dynamo runs the frame to trace it
    assert trainer.strategy.model._compiled_call_impl is None  # the wrapper's compile ends with the run


class ResetsTheReducer(BoringModel):
    def setup(self, stage):
        torch._dynamo.config.optimize_ddp = True  # after `fit` started, before DDP is built


def test_a_reducer_setting_changed_after_fit_started_is_named():
    trainer = Trainer(strategy="ddp", use_compile={"backend": "eager", "compiled_autograd": True}, max_steps=1, **QUIET)
    with pytest.raises(RuntimeError, match=r"was changed after `fit` started \(in a `setup` or `configure_model`"):
        trainer.fit(ResetsTheReducer())
    assert torch._dynamo.config.optimize_ddp is True
    assert not compiled_autograd.compiled_autograd_enabled


class FailingModel(BoringModel):
    def training_step(self, batch, batch_idx):
        if batch_idx == 2:
            raise RuntimeError("failed at step 2")
        return super().training_step(batch, batch_idx)


def test_a_failed_run_leaves_compiled_autograd_and_ddp_as_they_were():
    trainer = Trainer(strategy="ddp", use_compile={"backend": "eager", "compiled_autograd": True}, max_steps=4, **QUIET)
    with pytest.raises(RuntimeError, match="failed at step 2"):
        trainer.fit(FailingModel())
    assert not compiled_autograd.compiled_autograd_enabled
    assert torch._dynamo.config.optimize_ddp is True
    assert DDP_FILE not in trace_rules.LEGACY_MOD_INLINELIST
    assert torch._inductor.config._fuse_ddp_communication is False
    assert all(not p._post_accumulate_grad_hooks for p in trainer.lightning_module.parameters())


# --- refused at `Trainer(...)`, each with what to do ---


@pytest.mark.parametrize("value", [1, "yes", ["backend"]])
def test_a_value_other_than_true_or_a_dict_is_refused(value):
    with pytest.raises(TypeError, match=r"must be `True` .* or a dict of `torch.compile` arguments"):
        Trainer(use_compile={"compiled_autograd": value}, **QUIET)


def test_an_unknown_backward_argument_is_refused():
    with pytest.raises(ValueError, match=r"'bakend'.* is not a `torch.compile` argument"):
        Trainer(use_compile={"compiled_autograd": {"bakend": "eager"}}, **QUIET)


@pytest.mark.parametrize("optimize_ddp", [True, False, "ddp_optimizer", "no_optimization"])
def test_an_optimize_ddp_other_than_the_python_reducer_is_refused(optimize_ddp):
    with pytest.raises(ValueError, match=r"needs DDP's python reducer. Remove 'optimize_ddp'"):
        Trainer(use_compile={"compiled_autograd": True, "optimize_ddp": optimize_ddp}, **QUIET)


def test_the_python_reducer_is_accepted():
    Trainer(use_compile={"compiled_autograd": True, "optimize_ddp": "python_reducer"}, **QUIET)


def test_bucket_cap_mb_list_is_refused_when_the_trainer_is_built():
    strategy = DDPStrategy(bucket_cap_mb_list=[1, 25])
    with pytest.raises(ValueError, match=r"does not support\s+`bucket_cap_mb_list`"):
        Trainer(strategy=strategy, use_compile={"compiled_autograd": True}, **QUIET)


@pytest.mark.parametrize(
    ("strategy", "what"),
    [
        (DDPStrategy(find_unused_parameters=True), "`find_unused_parameters`"),
        (DDPStrategy(ddp_comm_hook=lambda state, bucket: None), "a communication hook per parameter"),
    ],
    ids=["find_unused_parameters", "ddp_comm_hook"],
)
def test_ddp_settings_the_python_reducer_lacks_are_refused(strategy, what):
    with pytest.raises(ValueError, match=what):
        Trainer(strategy=strategy, use_compile={"compiled_autograd": True}, **QUIET)


def test_a_strategy_other_than_ddp_or_one_device_is_refused():
    from lightning.pytorch.strategies import ModelParallelStrategy

    with pytest.raises(ValueError, match=r"supports one device and DDP, not ModelParallelStrategy"):
        Trainer(strategy=ModelParallelStrategy(), use_compile={"compiled_autograd": True}, **QUIET)


def test_fallback_is_refused_with_it():
    with pytest.raises(ValueError, match=r"'fallback': 'eager'}\)` cannot be combined: after a compile error"):
        Trainer(use_compile={"compiled_autograd": True, "fallback": "eager"}, **QUIET)


def test_a_torch_without_the_switch_is_refused(monkeypatch):
    monkeypatch.delattr(compiled_autograd, "_enable")
    with pytest.raises(RuntimeError, match=r"needs torch>=2.6 .* Upgrade torch, or remove 'compiled_autograd'"):
        Trainer(use_compile={"compiled_autograd": True}, **QUIET)
