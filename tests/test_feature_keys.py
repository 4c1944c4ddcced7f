"""Each feature does nothing unless its key is set; the package sets its defaults for every `use_compile`.

| how the model is compiled                  | features built                                           |
|--------------------------------------------|----------------------------------------------------------|
| `fit(torch.compile(model))`, no `use_compile` | the re-apply, and the features that change the model and its |
|                                            | Trainer only (`INPUT_DEFAULTS`): no backend, no process-wide setting |
| `use_compile=True` or a dict               | the package's defaults (`feature_defaults.py`), and the dict's keys |
| `use_compile={"summary": False, ...}`      | the defaults less the ones the user turned off           |
"""

import importlib
import os
from pathlib import Path

import pytest
import torch
import torch._dynamo.config as dynamo_config

from helpers import QUIET, CountingBackend, last_summary
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

pytestmark = pytest.mark.package_only  # the package's defaults; upstream, none are set

RUN = {**QUIET, "max_steps": 2, "limit_val_batches": 0}
#: What Lightning's DDP launcher sets in the process (stock Lightning does too).
LAUNCHER_ENV = ("LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "OMP_NUM_THREADS", "WORLD_SIZE", "RANK")


def feature_names(trainer):
    return sorted(type(feature).__module__.rpartition(".")[2] for feature in trainer._compile_connector.features)


def test_a_compiled_model_without_use_compile_gets_no_backend_and_no_process_wide_setting():
    # torch's first compile in a process sets TORCHINDUCTOR_CACHE_DIR to its default: do it before the snapshot
    torch.compile(torch.nn.Linear(1, 1), backend="eager")(torch.ones(1, 1))
    config_before, environ_before = dynamo_config.get_config_copy(), dict(os.environ)
    backend = CountingBackend("reapply_alone")
    trainer = Trainer(strategy="ddp", **RUN)
    seen = {}

    class Probe(BoringModel):
        def on_train_batch_start(self, *_):
            seen["dynamo"] = dynamo_config.get_config_copy()
            seen["dynamic_sources"] = getattr(torch.compiler.config, "dynamic_sources", None)  # torch 2.8+

    trainer.fit(torch.compile(Probe(), backend=backend))
    # only the features that change the model and its Trainer, nothing beyond them
    local = ["check_tensor_parallel", "defer_logging", "dynamic_lr", "eager_metrics", "eager_optimizer_steps"]
    local += ["list_outputs", "no_grad_evaluation", "stage_guards"]
    assert feature_names(trainer) == sorted(local)
    assert backend.graphs >= 1  # the user's own backend compiled, not a counting one of the package's
    assert last_summary(trainer) is None
    assert seen["dynamo"] == config_before  # `optimize_ddp` included: nothing was set for the run
    assert seen["dynamic_sources"] == getattr(torch.compiler.config, "dynamic_sources", None)
    assert dynamo_config.get_config_copy() == config_before
    # what Lightning's DDP launcher sets in the process is Lightning's; nothing else changed
    assert {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV} == environ_before


def test_use_compile_builds_the_packages_defaults_and_the_keys_it_sets():
    defaults = ["compile_budget", "compile_errors", "no_grad_evaluation", "defer_logging", "dynamic_loop_counters"]
    defaults += ["eager_metrics", "optimize_ddp", "eager_optimizer_steps", "dynamic_lr", "list_outputs", "stage_guards"]
    defaults += ["in_parts"]
    assert feature_names(Trainer(use_compile=True)) == sorted([*defaults, "summary", "check_tensor_parallel"])
    with_fallback = Trainer(use_compile={"fallback": "eager"})
    assert feature_names(with_fallback) == sorted([*defaults, "fallback", "summary", "check_tensor_parallel"])


def test_a_key_set_to_false_turns_a_default_off():
    trainer = Trainer(use_compile={"backend": "eager", "summary": False, "optimize_ddp": None}, **RUN)
    assert "summary" not in feature_names(trainer)
    assert "optimize_ddp" not in feature_names(trainer)
    trainer.fit(BoringModel())
    assert last_summary(trainer) is None


@pytest.mark.parametrize(
    "key",
    [
        "summary",
        "compile_errors",
        "defer_logging",
        "eager_metrics",
        "compile_budget",
        "stage_guards",
        "no_grad_evaluation",
        "dynamic_lr",
        "eager_optimizer_steps",
        "in_parts",
    ],
)
def test_a_feature_flag_must_be_a_bool(key):
    with pytest.raises(TypeError, match=rf"use_compile=\{{'{key}': 'yes'\}}\)` must be `True` or `False`"):
        Trainer(use_compile={key: "yes"})


def test_each_feature_module_is_named_after_a_key_it_owns_and_listed_once_in_hook_order():
    import lightning_compile_patch.compile_features as features

    modules = sorted(p.stem for p in Path(features.__file__).parent.glob("*.py") if not p.stem.startswith("_"))
    assert sorted(features.FEATURES) == modules  # a module left out of the list would never run
    assert len(set(features.FEATURES)) == len(features.FEATURES)
    for name in features.FEATURES:
        feature = importlib.import_module(f"{features.__name__}.{name}").FEATURE
        assert name in feature.keys, name
        # and its class too: `stage_guards.py` holds `_StageGuards`, `optimize_ddp.py` `_OptimizeDDP`
        assert feature.__name__.lower() == "_" + name.replace("_", ""), (name, feature.__name__)
