"""Every change a run makes outside itself goes through the connector, which puts it back: after a run, after a failed
run, and after a fallback.

The connector's ``replace``, ``setenv``, ``enter`` and ``callback`` are the only ways a feature changes an attribute, a
torch setting or the environment. These tests record each change as it is made, then check, once the run is over,
that every recorded attribute and variable has its value from before the run again, and that nothing is left to undo.
"""

import os
from typing import Any

import pytest
import torch

from helpers import QUIET, LoggingModel, connector_module, demo_gpt, leftovers
from lightning.pytorch import Trainer

pytestmark = pytest.mark.package_only  # the connector's own record of what it changed

_ABSENT = object()


class ChangeLog:
    """Records, for each change made through a connector, the value it replaced."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.attributes: list[tuple[Any, str, Any, bool]] = []
        self.environment: list[tuple[str, Any]] = []
        self.connectors: list[Any] = []
        cls = connector_module()._CompileConnector
        replace, setenv, on_run_start = cls.replace, cls.setenv, cls.on_run_start

        def recording_replace(connector: Any, target: Any, name: str, value: Any, scope: str = "compile") -> None:
            own = name in getattr(target, "__dict__", {})
            self.attributes.append((target, name, getattr(target, name, _ABSENT), own))
            replace(connector, target, name, value, scope)

        def recording_setenv(connector: Any, name: str, value: str, scope: str = "run") -> None:
            self.environment.append((name, os.environ.get(name, _ABSENT)))
            setenv(connector, name, value, scope)

        def recording_start(connector: Any, model: Any) -> None:
            self.connectors.append(connector)
            on_run_start(connector, model)

        monkeypatch.setattr(cls, "replace", recording_replace)
        monkeypatch.setattr(cls, "setenv", recording_setenv)
        monkeypatch.setattr(cls, "on_run_start", recording_start)

    def names(self) -> set[str]:
        return {name for _, name, _, _ in self.attributes} | {name for name, _ in self.environment}

    def assert_all_undone(self) -> None:
        first = {}  # an attribute changed twice (two features, or two runs) must be back to its first value
        for target, name, before, own in self.attributes:
            first.setdefault((id(target), name), (target, name, before, own))
        for target, name, before, own in first.values():
            if own or isinstance(target, type(os)):
                assert getattr(target, name) is before or getattr(target, name) == before, (target, name)
            else:  # it came from the class: the instance holds no attribute of its own again
                assert name not in target.__dict__, (target, name)
        for name, before in self.environment:
            assert os.environ.get(name, _ABSENT) == before, name
        running = connector_module()._RUNNING
        assert running == [], "the run is still registered as the process's compiled run"
        for connector in self.connectors:
            assert connector._undo == {"compile": [], "run": []}, connector._undo


def test_a_run_with_every_feature_puts_back_all_it_changed(monkeypatch, tmp_path):
    changes = ChangeLog(monkeypatch)
    gpt = demo_gpt()
    model = gpt.GPTModule(gpt.GPTConfig(n_layer=2, n_embd=32, n_head=2, block_size=16, vocab_size=64, batch_size=4))
    use_compile = {
        "backend": "aot_eager",
        "regions": "auto",
        "cache": str(tmp_path / "cache"),
        "compiled_autograd": True,
        "optimize_ddp": "auto",
    }
    trainer = Trainer(strategy="ddp", use_compile=use_compile, max_steps=2, limit_val_batches=1, **QUIET)
    trainer.fit(model)
    # what each feature changes for the run went through the connector, and came back
    expected = {"optimize_ddp", "force_non_lazy_backward_lowering", "_compiled_call_impl", "forward", "log"}
    assert expected <= changes.names(), changes.names()
    assert "TORCHINDUCTOR_CACHE_DIR" in changes.names() or "TORCHINDUCTOR_CACHE_DIR" in os.environ
    changes.assert_all_undone()
    assert leftovers(model) == []


def test_a_failed_run_puts_back_all_it_changed(monkeypatch):
    changes = ChangeLog(monkeypatch)

    class Failing(LoggingModel):
        def training_step(self, batch, batch_idx):
            if batch_idx == 1:
                raise ValueError("a bad batch")
            return super().training_step(batch, batch_idx)

    model = Failing()
    trainer = Trainer(strategy="ddp", use_compile={"backend": "aot_eager"}, max_steps=3, **QUIET)
    with pytest.raises(ValueError, match="a bad batch"):
        trainer.fit(model)
    assert {"_compiled_call_impl", "optimize_ddp", "log"} <= changes.names(), changes.names()
    changes.assert_all_undone()
    assert leftovers(model) == []


def test_a_fallback_puts_back_what_it_compiled_at_once_and_the_run_settings_at_the_end(monkeypatch):
    changes = ChangeLog(monkeypatch)

    def backend(gm, example_inputs):
        raise RuntimeError("backend exploded")

    settings_during_steps: list[Any] = []

    class Watching(LoggingModel):
        def training_step(self, batch, batch_idx):
            settings_during_steps.append(torch._dynamo.config.optimize_ddp)
            return super().training_step(batch, batch_idx)

    model = Watching()
    trainer = Trainer(strategy="ddp", use_compile={"backend": backend, "fallback": "eager"}, max_steps=3, **QUIET)
    with pytest.warns(UserWarning, match="continues uncompiled"):
        trainer.fit(model)
    assert trainer._compile_connector.last_summary.fell_back
    # the run's own settings held for every step, after the fallback too (one process: no graph split)
    assert settings_during_steps == [False, False, False], settings_during_steps
    changes.assert_all_undone()
    assert leftovers(model) == []
