"""Every change a run makes outside itself goes through the run (``compile_features._run._CompileRun``), which puts it
back: after a run, after a failed run, and after a fallback.

The run's ``replace``, ``setenv``, ``enter`` and ``defer`` are the only ways a feature changes an attribute, a torch
setting or the environment. These tests record each change as it is made, then check, once the run is over, that every
recorded attribute and variable has its value from before the run again, and that nothing is left to undo. And since a
change made around the run escapes that record, each also compares the process's own state (:func:`process_state`)
before and after.

"""

import logging
import os
import sys
from typing import Any

import pytest
import torch

import lightning.pytorch
from helpers import (
    QUIET,
    TORCH_2_7,
    TORCH_2_13,
    LoggingModel,
    ManualModel,
    connector_module,
    demo_gpt,
    last_summary,
    leftovers,
    lightning_side,
)
from lightning.pytorch import Callback, LightningModule, Trainer

pytestmark = pytest.mark.package_only  # the package's patch and the run it starts, recorded

_ABSENT = object()
#: What Lightning's DDP launcher sets in the process, stock Lightning's too.
_NOT_OURS = ("LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "OMP_NUM_THREADS", "WORLD_SIZE", "RANK")


def process_state() -> dict[str, Any]:
    """The process-wide state a compiled run may change, as values to compare: the settings of Dynamo, inductor,
    functorch and ``torch.compiler``, the environment, the import hooks, the identity of ``torch.compile`` and of
    Lightning's compile helpers and Trainer methods, the attributes of Lightning's classes that runs touch, Dynamo's
    inline list and its loggers' filters, and compiled autograd's switch."""
    from torch._dynamo import compiled_autograd, trace_rules

    # torch's first compile in a process, and its first optimizer of a class, set their own (Dynamo disables the
    # optimizers' `_init_group`, inductor sets its cache directory, an optimizer class gets its profiling `step`): done
    # before any snapshot, so that what differs is the run's
    torch.compile(torch.nn.Linear(1, 1), backend="inductor")(torch.ones(1, 1))
    for optimizer in (torch.optim.SGD, torch.optim.AdamW):
        optimizer([torch.zeros(1, requires_grad=True)], lr=0.1)
    configs = {"dynamo": torch._dynamo.config, "inductor": torch._inductor.config}
    configs["functorch"] = torch._functorch.config
    if hasattr(torch.compiler, "config"):
        configs["compiler"] = torch.compiler.config
    compile_utilities = lightning.pytorch.utilities.compile
    loggers = [name for name in logging.root.manager.loggerDict if name.startswith("torch._dynamo")]
    return {
        **{name: config.get_config_copy() for name, config in configs.items()},
        "environ": {k: v for k, v in os.environ.items() if k not in _NOT_OURS},
        "meta_path": list(sys.meta_path),
        "torch.compile": torch.compile,
        "utilities.compile": dict(vars(compile_utilities)),
        "Trainer": dict(vars(Trainer)),
        "LightningModule": dict(vars(LightningModule)),
        "optimizers": {
            f"{cls.__name__}.{name}": value
            for cls in (torch.optim.SGD, torch.optim.AdamW, torch.optim.Optimizer)
            for name, value in vars(cls).items()
        },
        "inline list": set(trace_rules.LEGACY_MOD_INLINELIST),
        "filters": {name: filters for name in loggers if (filters := list(logging.getLogger(name).filters))},
        "compiled autograd": bool(compiled_autograd.compiled_autograd_enabled),
    }


def assert_same_process_state(before: dict[str, Any]) -> None:
    after = process_state()
    for key in before.keys() | after.keys():
        was, now = before.get(key), after.get(key)
        if isinstance(was, dict) and isinstance(now, dict):  # name what differs, not the whole value
            was, now = ({k: v for k, v in d.items() if was.get(k) != now.get(k)} for d in (was, now))
        assert now == was, key


class ChangeLog:
    """Records, for each change made through a run (what a feature changes goes through it), the value it replaced."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.attributes: list[tuple[Any, str, Any, bool]] = []
        self.environment: list[tuple[str, Any]] = []
        cls = lightning_side("_run")._CompileRun
        replace, setenv = cls.replace, cls.setenv

        def recording_replace(run: Any, target: Any, name: str, value: Any, scope: str = "compile") -> None:
            own = name in getattr(target, "__dict__", {})
            self.attributes.append((target, name, getattr(target, name, _ABSENT), own))
            replace(run, target, name, value, scope)

        def recording_setenv(run: Any, name: str, value: str, scope: str = "run") -> None:
            self.environment.append((name, os.environ.get(name, _ABSENT)))
            setenv(run, name, value, scope)

        monkeypatch.setattr(cls, "replace", recording_replace)
        monkeypatch.setattr(cls, "setenv", recording_setenv)

    def names(self) -> set[str]:
        return {name for _, name, _, _ in self.attributes} | {name for name, _ in self.environment}

    def assert_all_undone(self) -> None:
        first = {}  # an attribute changed twice (two features, or two runs) must be back to its first value
        for target, name, before, own in self.attributes:
            first.setdefault((id(target), name), (target, name, before, own))
        for target, name, before, own in first.values():
            after = getattr(target, name, _ABSENT)
            assert after is before or after == before, (target, name, before, after)
            if not own and not isinstance(target, type(os)):  # from a base class: not the target's own again
                assert name not in vars(target), (target, name)
        for name, before in self.environment:
            assert os.environ.get(name, _ABSENT) == before, name
        running = connector_module()._RUNNING
        assert running == [], "the run is still registered as the process's compiled run"


def test_a_run_with_every_feature_puts_back_all_it_changed(monkeypatch, tmp_path):
    changes = ChangeLog(monkeypatch)
    before = process_state()
    gpt = demo_gpt()
    model = gpt.GPTModule(gpt.GPTConfig(n_layer=2, n_embd=32, n_head=2, block_size=16, vocab_size=64, batch_size=4))
    use_compile = {"backend": "aot_eager", "regions": "auto", "optimize_ddp": "auto"}
    if TORCH_2_7:  # the cache needs `save_cache_artifacts`; compiled autograd with regions fails in torch 2.6 itself
        use_compile |= {"cache": str(tmp_path / "cache"), "compiled_autograd": True}
    trainer = Trainer(strategy="ddp", use_compile=use_compile, max_steps=2, limit_val_batches=1, **QUIET)
    trainer.fit(model)
    # what each feature changes for the run went through the run, and came back
    expected = {"optimize_ddp", "forward", "log"}
    expected |= {"force_non_lazy_backward_lowering"} if TORCH_2_13 else set()  # torch 2.13+ has it
    expected |= {"TORCHINDUCTOR_CACHE_DIR"} if TORCH_2_7 else set()  # the cache's inductor directory, for the run
    assert expected <= changes.names(), changes.names()
    changes.assert_all_undone()
    assert_same_process_state(before)
    assert leftovers(model) == []
    assert "_compiled_call_impl" not in vars(trainer.strategy.model)  # `nn.Module.compile`'s, undone too


def test_a_manual_optimization_run_puts_back_the_classes_it_gave_its_optimizers_and_schedulers(monkeypatch):
    # bug: the run's eager `step`s were set on the optimizer's own class and the scheduler's class swapped by hand,
    # outside the run's record; an attribute added to a class could not be undone through it
    changes = ChangeLog(monkeypatch)
    before = process_state()
    optimizer_class = None

    class Scheduled(ManualModel):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)]

        def on_train_end(self):
            nonlocal optimizer_class
            optimizer_class = type(self.optimizers())

    model = Scheduled()
    trainer = Trainer(use_compile={"backend": "eager"}, max_steps=2, limit_val_batches=0, **QUIET)
    trainer.fit(model)
    assert {"step", "zero_grad", "__class__"} <= changes.names(), changes.names()
    changes.assert_all_undone()
    assert_same_process_state(before)
    assert type(trainer.lr_scheduler_configs[0].scheduler) is torch.optim.lr_scheduler.StepLR
    assert "step" not in vars(optimizer_class)
    assert "zero_grad" not in vars(optimizer_class)


def test_a_failed_run_puts_back_all_it_changed(monkeypatch):
    changes = ChangeLog(monkeypatch)
    before = process_state()

    class Failing(LoggingModel):
        def training_step(self, batch, batch_idx):
            if batch_idx == 1:
                raise ValueError("a bad batch")
            return super().training_step(batch, batch_idx)

    model = Failing()
    trainer = Trainer(strategy="ddp", use_compile={"backend": "aot_eager"}, max_steps=3, **QUIET)
    with pytest.raises(ValueError, match="a bad batch"):
        trainer.fit(model)
    assert {"optimize_ddp", "log"} <= changes.names(), changes.names()
    changes.assert_all_undone()
    assert_same_process_state(before)
    assert leftovers(model) == []
    assert "_compiled_call_impl" not in vars(trainer.strategy.model)


def test_a_fallback_puts_back_what_it_compiled_at_once_and_the_run_settings_at_the_end(monkeypatch):
    changes = ChangeLog(monkeypatch)
    before = process_state()

    def backend(gm, example_inputs):
        raise RuntimeError("backend exploded")

    settings_during_steps: list[Any] = []
    compiled_during_steps: list[bool] = []

    class Watching(LoggingModel):
        def training_step(self, batch, batch_idx):
            settings_during_steps.append(torch._dynamo.config.optimize_ddp)
            compiled_during_steps.append(self._compiler_ctx is not None)  # the steps compiled with `from_compiled`
            return super().training_step(batch, batch_idx)

    model = Watching()
    trainer = Trainer(strategy="ddp", use_compile={"backend": backend, "fallback": "eager"}, max_steps=3, **QUIET)
    with pytest.warns(UserWarning, match="continues uncompiled"):
        trainer.fit(model)
    assert last_summary(trainer).fell_back
    # the run's own settings held for every step, after the fallback too (one process: no graph split)
    assert settings_during_steps == [False, False, False], settings_during_steps
    # what was compiled was undone at the fallback, in the first step: the steps after it found nothing compiled
    assert compiled_during_steps == [False, False, False], compiled_during_steps
    changes.assert_all_undone()
    assert_same_process_state(before)
    assert leftovers(model) == []


def test_a_run_whose_teardown_never_ran_does_not_block_the_next():
    # bug: when an `on_exception` callback raised, Lightning skipped the teardown; the run stayed registered as the
    # process's compiled run, and every later `use_compile` Trainer was refused
    class FailingHandler(Callback):
        def on_exception(self, trainer, pl_module, exception):
            raise RuntimeError("the handler failed too")

    class Failing(LoggingModel):
        def training_step(self, batch, batch_idx):
            raise ValueError("a bad batch")

    first = Trainer(use_compile={"backend": "eager"}, max_steps=2, callbacks=[FailingHandler()], **QUIET)
    with pytest.raises(RuntimeError, match="the handler failed too"):
        first.fit(Failing())
    second = Trainer(use_compile={"backend": "eager"}, max_steps=2, **QUIET)
    second.fit(LoggingModel())
    assert last_summary(second).compiled_steps["training"] == 2
    assert connector_module()._RUNNING == []
