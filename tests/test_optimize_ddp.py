"""The `optimize_ddp` policy: "auto" splits DDP's graph only with more than one process; a user's value is kept."""

import pytest
import torch._dynamo.config as dynamo_config

from helpers import QUIET, LoggingModel
from lightning.pytorch import Callback, Trainer


class Record(Callback):
    def on_train_batch_start(self, *_):
        self.value = dynamo_config.optimize_ddp


def run(use_compile, strategy="ddp"):
    record = Record()
    trainer = Trainer(strategy=strategy, use_compile=use_compile, callbacks=[record], max_steps=1, **QUIET)
    trainer.fit(LoggingModel())
    return record.value


@pytest.mark.parametrize(
    ("choice", "during"), [("auto", False), (True, True), (False, False), ("ddp_optimizer", "ddp_optimizer")]
)
def test_the_choice_holds_during_the_run_and_is_restored_after(choice, during):
    # bug: untested policy; "auto" with one process must not split, and nothing may outlive the run
    before = dynamo_config.optimize_ddp
    assert run({"backend": "eager", "optimize_ddp": choice}) == during
    assert dynamo_config.optimize_ddp == before


def test_auto_keeps_a_value_the_user_set_in_torch():
    with dynamo_config.patch(optimize_ddp="no_optimization"):
        assert run({"backend": "eager"}) == "no_optimization"
        assert dynamo_config.optimize_ddp == "no_optimization"


def test_one_device_leaves_it_alone():
    before = dynamo_config.optimize_ddp
    assert run({"backend": "eager", "optimize_ddp": False}, strategy="auto") == before


def test_python_reducer_set_in_torch_trains_on_one_device():
    # bug: the check that DDP was built with the python reducer ran without DDP, and refused every one-device run
    with dynamo_config.patch(optimize_ddp="python_reducer"):
        assert run({"backend": "eager"}, strategy="auto") == "python_reducer"


def test_python_reducer_does_not_refuse_a_stage_ddp_does_not_wrap():
    # bug: DDP wraps the model to fit only, so `validate` under DDP with the python reducer chosen raised
    before = dynamo_config.optimize_ddp
    use_compile = {"backend": "eager", "optimize_ddp": "python_reducer"}
    trainer = Trainer(strategy="ddp", use_compile=use_compile, limit_val_batches=2, **QUIET)
    trainer.validate(LoggingModel(), verbose=False)
    assert dynamo_config.optimize_ddp == before
