# Copyright The Lightning AI team.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.trainer.states import RunningStage
from tests_pytorch.helpers.runif import RunIf

# checked on torch 2.13 (on 2.6, Dynamo recursed on the swapped class: the feature does nothing there)
pytestmark = RunIf(min_torch="2.13", dynamo=True)


class NamedByStage(BoringModel):
    """Names its metric by the stage, from a dict keyed by the stage (an Enum), as libraries built on Lightning do."""

    def __init__(self):
        super().__init__()
        self.logged = []

    def validation_step(self, batch, batch_idx):
        loss = self.step(batch)
        name = {RunningStage.SANITY_CHECKING: "sanity_check_loss", RunningStage.VALIDATING: "val_loss"}
        self.log(name[self.trainer.state.stage], loss)
        return loss

    def on_validation_epoch_end(self):
        self.logged.append(sorted(k for k in self.trainer.callback_metrics if k.endswith("loss")))


def _fit(use_compile):
    seed_everything(0)
    model = NamedByStage()
    trainer = Trainer(
        use_compile=use_compile,
        max_epochs=2,
        limit_train_batches=2,
        limit_val_batches=2,
        num_sanity_val_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model)
    return model.logged


def test_a_metric_named_by_the_stage_is_logged_under_the_name_of_each_stage():
    eager = _fit(None)
    assert eager == [["sanity_check_loss"], ["val_loss"], ["val_loss"]]
    assert _fit({"backend": "eager", "stage_guards": True}) == eager


def test_the_state_is_a_plain_trainer_state_after_the_run():
    from lightning.pytorch.trainer.states import TrainerState

    use_compile = {"backend": "eager", "stage_guards": True}
    quiet = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False}
    trainer = Trainer(use_compile=use_compile, max_steps=1, limit_val_batches=0, **quiet)
    trainer.fit(BoringModel())
    assert type(trainer.state) is TrainerState
