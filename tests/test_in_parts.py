"""Compiled in parts: where Dynamo cannot compile a step whole, the modules the step calls still run compiled.

Each case below is a step that Dynamo gives up on as a whole frame. With ``in_parts`` (on by default) the step's own
code runs eagerly and the modules it calls run their own graphs: every step counts as "compiled in parts", with its
cause, and trains exactly as eager does. With ``in_parts`` off, the same steps run no graph at all.
"""

import inspect
import time
import warnings

import pytest
import torch
import torch.nn.functional as F
from packaging.version import Version
from torch import nn
from torch.utils.data import DataLoader, Dataset

from helpers import QUIET, TORCH_2_13, CountingBackend, last_summary, leftovers
from lightning.pytorch import LightningModule, Trainer, seed_everything
from lightning.pytorch.demos.boring_classes import RandomDataset

TORCH_2_15 = Version(torch.__version__.split("+")[0]) >= Version("2.15")


class AverageDataset(Dataset):
    """The dataset of Lightning's `common/tbptt.rst`, shorter."""

    def __init__(self, dataset_len=8, sequence_len=12):
        self.input_seq = torch.randn(dataset_len, sequence_len, 10)
        top, bottom = self.input_seq.chunk(2, -1)
        self.output_seq = top + bottom.roll(shifts=1, dims=-1)

    def __len__(self):
        return len(self.input_seq)

    def __getitem__(self, item):
        return self.input_seq[item], self.output_seq[item]


class TruncatedBPTT(LightningModule):
    """Truncated BPTT as Lightning's `common/tbptt.rst` writes it: a loop over time chunks, optimizing in each.

    Dynamo skips the step (a graph break in its loop) and `forward` (it calls an `nn.LSTM`).
    """

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.truncated_bptt_steps = 3
        self.rnn = nn.LSTM(10, 20, batch_first=True)
        self.linear_out = nn.Linear(in_features=20, out_features=5)

    def forward(self, x, hs):
        seq, hs = self.rnn(x, hs)
        return self.linear_out(seq), hs

    def training_step(self, batch, batch_idx):
        x, y = batch
        split_x, split_y = [x.tensor_split(self.truncated_bptt_steps, dim=1), y.tensor_split(3, dim=1)]
        hiddens = None
        optimizer = self.optimizers()
        losses = []
        for x, y in zip(split_x, split_y):  # noqa: B905 (as the docs write it)
            y_pred, hiddens = self(x, hiddens)
            loss = F.mse_loss(y_pred, y)
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()
            hiddens = [h.detach() for h in hiddens]
            losses.append(loss.detach())
        self.log("train_loss", sum(losses) / len(losses))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(AverageDataset(), batch_size=2)


class Image(torch.Tensor):
    """A tensor subclass whose `shape` reads `super().shape`, as torchvision's `tv_tensors` do."""

    @property
    def shape(self):
        return super().shape


class TwoModules(LightningModule):
    """Every step calls `self.step`, which calls an encoder and a head: Dynamo compiles it whole."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(32, 16), nn.ReLU())
        self.head = nn.Linear(16, 2)

    def step(self, batch):
        return self.head(self.encoder(batch)).sum()

    def training_step(self, batch, batch_idx):
        loss = self.step(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.step(batch))

    def test_step(self, batch, batch_idx):
        self.log("test_loss", self.step(batch))

    def predict_step(self, batch, batch_idx):
        return self.step(batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 8), batch_size=2)

    val_dataloader = test_dataloader = predict_dataloader = train_dataloader


class ObservedException(TwoModules):
    """A step that reads the batch as an `Image`: Dynamo's trace of `super().shape` raises inside the traced code,
    which handles nothing ("Observed exception"), so Dynamo skips the step (torch 2.13)."""

    def step(self, batch):
        rows = batch.as_subclass(Image).shape[0]
        out = self.head(self.encoder(batch))
        return out.sum() / rows


class LSTMBesideOthers(TwoModules):
    """A step that calls an `nn.LSTM` between two other modules. torch 2.13 compiles the step up to the LSTM and runs
    the rest uncompiled (the head, the loss); torch 2.15 compiles around it."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(16, 16, batch_first=True)

    def training_step(self, batch, batch_idx):
        hidden = self.encoder(batch)
        hidden, _ = self.lstm(hidden.unsqueeze(1))
        loss = self.head(hidden.squeeze(1)).sum()
        self.log("train_loss", loss)
        return loss


class ChunkLoop(TwoModules):
    """A step that loops over chunks of the batch, with a `print` in the loop, calling two `nn.Sequential`."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(16, 2))

    def step(self, batch):
        loss = 0
        for i, chunk in enumerate(batch.split(16, dim=1)):
            print(f"chunk {i}", end="\r")
            loss = loss + self.head(self.encoder(chunk)).sum()
        return loss


@torch.library.custom_op("lightning_compile_patch_tests::shift", mutates_args=())
def shift(x: torch.Tensor) -> torch.Tensor:
    """An op with no fake implementation: it runs eagerly, and Dynamo fails on it while it traces."""
    return x + 1


class DynamoError(TwoModules):
    """A step whose tracing fails inside Dynamo (`TorchRuntimeError`), as a library's autoregressive model's did."""

    def step(self, batch):
        return self.head(self.encoder(shift(batch))).sum()


def train(model_class, use_compile, stage="fit", strategy="auto", steps=4):
    seed_everything(0)
    model = model_class()
    trainer = Trainer(
        use_compile=use_compile,
        strategy=strategy,
        **{**QUIET, "max_steps": steps, "limit_val_batches": 2, "limit_test_batches": 2, "limit_predict_batches": 2},
        num_sanity_val_steps=0,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = getattr(trainer, stage)(model)
    return model, trainer, out, [str(w.message) for w in caught]


def assert_trains_as_eager(model_class, use_compile, stage="fit", strategy="auto"):
    eager, eager_trainer, eager_out, _ = train(model_class, None, stage, strategy)
    model, trainer, out, warned = train(model_class, use_compile, stage, strategy)
    for ours, theirs in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs)
    assert trainer.logged_metrics.keys() == eager_trainer.logged_metrics.keys()
    for key, value in eager_trainer.logged_metrics.items():
        torch.testing.assert_close(trainer.logged_metrics[key], value)
    torch.testing.assert_close(out, eager_out)
    assert leftovers(model) == []
    return last_summary(trainer), warned


LOOP = "skipped: graph break in loop"
OBSERVED = "skipped: Observed exception"
#: torch 2.6 fails to compile `as_subclass` (an internal error) where 2.13 skips the frame ("Observed exception")
FROM_2_13 = pytest.mark.skipif(not TORCH_2_13, reason="torch 2.6 raises on `as_subclass` where 2.13 skips the frame")
SKIPS = [(TruncatedBPTT, LOOP), (ChunkLoop, LOOP), pytest.param(ObservedException, OBSERVED, marks=FROM_2_13)]


@pytest.mark.parametrize(("model_class", "cause"), SKIPS)
def test_a_step_dynamo_skips_runs_compiled_in_parts_and_trains_as_eager(model_class, cause):
    backend = CountingBackend("parts")
    summary, warned = assert_trains_as_eager(model_class, {"backend": backend})
    trained = summary.parts_steps["training"]
    assert trained >= 2
    assert summary.compiled_steps == summary.eager_steps == {}
    assert set(summary.parts_causes) == {cause if TORCH_2_13 else next(iter(summary.parts_causes))}  # 2.6 words it so
    assert sum(summary.parts_causes.values()) == sum(summary.parts_steps.values())
    assert backend.calls >= trained  # a graph ran in every step, the first one included
    # the cause once, where it is, and what ran compiled
    (told,) = [w for w in warned if "ran compiled in parts" in w]
    assert f"{__file__}:" in told or not TORCH_2_13  # torch 2.6's records do not say where


@pytest.mark.parametrize(("model_class", "cause"), SKIPS)
def test_without_in_parts_the_same_steps_run_eagerly(model_class, cause):
    backend = CountingBackend("whole")
    summary, _ = assert_trains_as_eager(model_class, {"backend": backend, "in_parts": False})
    if model_class is TruncatedBPTT:  # its `forward` is compiled on its own by Lightning: the linear after the LSTM
        assert summary.parts_steps["training"] >= 2
        return
    assert summary.parts_steps == {}
    assert set(summary.eager_causes) == {cause if TORCH_2_13 else next(iter(summary.eager_causes))}
    assert sum(summary.eager_causes.values()) == sum(summary.eager_steps.values())
    assert backend.calls == 0


def test_the_summary_names_the_modules_that_ran_compiled_on_their_own():
    summary, _ = assert_trains_as_eager(ChunkLoop, {"backend": "aot_eager"})
    assert "in parts: 2 modules ran compiled on their own (`encoder`, `head`)" in summary.notes


def test_the_modules_a_step_calls_after_an_lstm_run_compiled():
    backend = CountingBackend("lstm")
    assert_trains_as_eager(LSTMBesideOthers, {"backend": backend, "in_parts": False})
    without = backend.calls
    backend = CountingBackend("lstm-parts")
    summary, _ = assert_trains_as_eager(LSTMBesideOthers, {"backend": backend})
    assert summary.eager_steps == {}
    if not TORCH_2_15:  # 2.13 runs the rest of the step after the LSTM uncompiled: the head then runs its own graph
        assert "`head`" in summary.notes[0]
        assert backend.calls > without


class Looping(nn.Module):
    """A module whose `forward` Dynamo skips (a graph break in its loop), around two layers of its own."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(16, 16)
        self.outer = nn.Linear(16, 16)

    def forward(self, x):
        for i in range(2):
            print(f"layer pass {i}", end="\r")
            x = self.inner(x)
        return self.outer(x)


class LoopingModule(ChunkLoop):
    """A step that calls a module whose own `forward` Dynamo skips."""

    def __init__(self):
        super().__init__()
        self.middle = Looping()

    def step(self, batch):
        return self.head(self.middle(self.encoder(batch[:, :16]))).sum()


def test_a_module_dynamo_skips_runs_eagerly_with_the_modules_inside_it_compiled():
    summary, _ = assert_trains_as_eager(LoopingModule, {"backend": "aot_eager"})
    assert summary.compiled_steps["training"] == 4  # the step compiles around the module it cannot trace
    (note,) = summary.notes
    assert "`middle.inner`" in note, note
    assert "`middle.outer`" in note, note
    if TORCH_2_13:  # torch 2.6 records a frame skipped for a loop as no failure
        assert "`middle` eager (Dynamo skipped it: " in note, note


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_every_stage_runs_compiled_in_parts(stage):
    summary, _ = assert_trains_as_eager(ChunkLoop, {"backend": "aot_eager"}, stage=stage)
    assert summary.parts_steps == {"evaluation": 2}
    assert summary.eager_steps == {}


def test_under_ddp_a_skipped_step_runs_compiled_in_parts():
    summary, _ = assert_trains_as_eager(ChunkLoop, {"backend": "aot_eager"}, strategy="ddp")
    assert summary.parts_steps == {"training": 4, "evaluation": 2}
    assert summary.compiled_steps == summary.eager_steps == {}


def test_a_step_that_compiles_whole_compiles_the_same_graphs_with_in_parts():
    # the modules compiled on their own are traced inside the step's graph: no graph break, nothing compiled twice
    counts = {}
    for in_parts in (False, True):
        torch._dynamo.reset()  # the step's code holds the other run's entries otherwise: a recompile
        backend = CountingBackend(f"whole-{in_parts}")
        summary, _ = assert_trains_as_eager(TwoModules, {"backend": backend, "in_parts": in_parts})
        counts[in_parts] = (backend.graphs, summary.graph_breaks, summary.recompiles, summary.compiled_steps)
    assert counts[True] == counts[False]
    assert counts[True][3] == {"training": 4, "evaluation": 2}


def test_a_compile_error_stops_the_run_by_default():
    with pytest.raises(RuntimeError, match=r"could not compile the fit step.*'fallback': 'eager'"):
        train(DynamoError, {"backend": "aot_eager"})


class SlowRetry(DynamoError):
    """A `DynamoError` whose step takes a second the first time it runs uncompiled: the retry that `fallback` makes."""

    slept = False

    def step(self, batch):
        if not torch.compiler.is_compiling() and not self.slept:
            self.slept = True
            time.sleep(1.0)
        return super().step(batch)


def test_a_first_step_that_fallback_calls_again_is_announced_once_with_its_whole_time(caplog):
    # bug: the summary's wrapper, innermost, announced "compiling the first training step" at each of fallback's calls
    # of the first step, and "took 0.1 s" as the retry began: the failed compile's time, without the retry's second
    with caplog.at_level("INFO"):
        assert_trains_as_eager(SlowRetry, {"backend": "aot_eager", "fallback": "eager"})
    told = [record.getMessage() for record in caplog.records if "first" in record.getMessage()]
    assert sum("compiling the first training step" in line for line in told) == 1, told
    (took,) = [line for line in told if "first compiled training step took" in line]
    assert float(took.rsplit(" took ", 1)[1].split()[0]) >= 1.0, took


def test_fallback_eager_after_a_compile_error_runs_the_failed_frames_eagerly_and_the_rest_compiled():
    summary, warned = assert_trains_as_eager(DynamoError, {"backend": "aot_eager", "fallback": "eager"})
    told = [w for w in warned if "fallback='eager'" in w]
    assert "continues with `training_step`, `step` uncompiled, and the rest compiled" in told[0]
    assert "continues with `validation_step` uncompiled" in told[1]  # `step` was already
    assert len(told) == 2
    assert summary.parts_steps == {"training": 4, "evaluation": 2}
    assert not summary.fell_back


def test_fallback_eager_says_the_steps_ran_eagerly_where_nothing_else_compiles():
    summary, _ = assert_trains_as_eager(DynamoError, {"backend": "aot_eager", "fallback": "eager", "in_parts": False})
    assert summary.eager_steps == {"training": 4, "evaluation": 2}
    assert summary.parts_steps == {}
    (cause,) = summary.eager_causes
    assert "fake tensor" in cause or not TORCH_2_13


class ImageBatches(TwoModules):
    """Convolutions over batches of a tensor subclass, as image libraries pass torchvision's `tv_tensors.Image`."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1)

    def step(self, batch):
        images = batch.view(-1, 2, 4, 4).as_subclass(Image)  # `shape`: Dynamo skips the step (Observed exception)
        return self.conv(images).sum() / images.shape[0]


@FROM_2_13
@pytest.mark.parametrize("backend", ["aot_eager", "eager"])
def test_a_module_whose_compile_fails_on_the_batch_runs_uncompiled_and_is_named(backend):
    # torch 2.13's aot_eager fails on the subclass inside the compiled convolution ("Multiple dispatch failed"): the
    # step Dynamo skipped ran eagerly before `in_parts`, and must not stop the run now
    summary, _ = assert_trains_as_eager(ImageBatches, {"backend": backend})
    (note,) = summary.notes
    failed_on_subclass = backend == "aot_eager" and not TORCH_2_15
    if failed_on_subclass:
        assert note.startswith("in parts: `conv` eager (torch failed on it: TypeError: Multiple dispatch failed"), note
        assert summary.eager_steps == {"training": 4, "evaluation": 2}
    else:
        assert note == "in parts: 1 module ran compiled on its own (`conv`)", note
        assert summary.parts_steps == {"training": 4, "evaluation": 2}


def test_a_module_keeps_its_forward_s_signature_during_the_run_and_nothing_after():
    # libraries read a module's `forward` signature (`inspect.signature(self.forward)`), during a run too
    seen = []

    class Inspects(ChunkLoop):
        def on_train_batch_start(self, batch, batch_idx):
            seen.append((str(inspect.signature(self.encoder.forward)), "forward" in vars(self.encoder)))

    model, _, _, _ = train(Inspects, {"backend": "aot_eager"})
    assert seen[0] == (str(inspect.signature(nn.Sequential().forward)), True)  # `(input)`, not `(*args, **kwargs)`
    assert "forward" not in vars(model.encoder)


def test_a_torchscript_submodule_is_left_as_it_is():
    # TorchScript's module holds a `forward` of its own, which Python cannot set (`_CachedForward`)
    class Scripted(ChunkLoop):
        def __init__(self):
            super().__init__()
            self.head = torch.jit.script(nn.Linear(16, 2))

    summary, _ = assert_trains_as_eager(Scripted, {"backend": "aot_eager"})
    assert summary.notes == ["in parts: 1 module ran compiled on its own (`encoder`)"]


@pytest.mark.skipif(not TORCH_2_13, reason="torch 2.6's disable wrapper, set on the class, does not bind as a method")
def test_a_step_marked_compiler_disable_keeps_what_it_calls_uncompiled():
    # the mark says "this and all it calls": the modules compiled on their own would run compiled inside it
    class Disabled(TwoModules):
        training_step = torch.compiler.disable(TwoModules.training_step)

    backend = CountingBackend("disabled")
    summary, _ = assert_trains_as_eager(Disabled, {"backend": backend})
    assert summary.notes == []
    assert summary.eager_steps["training"] == 4
    assert summary.compiled_steps == {"evaluation": 2}  # the validation step, compiled whole


@pytest.mark.parametrize("model_class", [TruncatedBPTT, ChunkLoop])
def test_a_sweep_of_more_runs_than_the_recompile_limit_stays_compiled_in_parts(model_class):
    """Twelve runs in one process, each with a new model whose step Dynamo skips: Dynamo's recompile limit (8) and its
    skip marks last the process and count per code object, so without the per-run resets the later runs' modules would
    stop compiling and their steps would run eager."""
    backend = CountingBackend("sweep")
    for trial in range(12):
        before = backend.calls
        _, trainer, _, _ = train(model_class, {"backend": backend}, steps=2)  # TBPTT: 3 optimizer steps per batch
        summary = last_summary(trainer)
        trained = summary.parts_steps.get("training", 0)
        assert trained >= 1, (trial, summary)
        assert summary.eager_steps == {}, (trial, summary)
        assert backend.calls - before >= trained, trial  # a graph ran in each step of this run


def test_twelve_epochs_stay_compiled_in_parts_without_a_recompile_per_epoch():
    """The step reads nothing of the epoch; the modules it calls compile once and run every epoch's steps."""
    backend = CountingBackend("epochs")
    seed_everything(0)
    model = TruncatedBPTT()
    trainer = Trainer(use_compile={"backend": backend}, max_epochs=12, limit_train_batches=1, **QUIET)
    trainer.fit(model)
    summary = last_summary(trainer)
    assert summary.parts_steps == {"training": 12}, summary
    assert summary.eager_steps == {}, summary
    # where torch compiles the LSTM (2.15), its hidden state goes from `None` to tensors within each batch: one
    # recompile for each kind of input, never one per epoch (without `stage_guards`: 11 on torch 2.13, 16 on 2.15)
    assert summary.recompiles <= 2, summary
    assert backend.graphs <= 4  # the modules' graphs, compiled once: not one set per epoch


def test_the_tuner_s_trials_run_compiled_in_parts():
    from lightning.pytorch.tuner import Tuner

    class Tunable(ChunkLoop):
        def __init__(self):
            super().__init__()
            self.lr = 0.1

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)

        def train_dataloader(self):
            return DataLoader(RandomDataset(32, 64), batch_size=2)

    backend = CountingBackend("tuner")
    trainer = Trainer(use_compile={"backend": backend}, max_epochs=1, **QUIET)
    finder = Tuner(trainer).lr_find(Tunable(), num_training=6, early_stop_threshold=None)
    assert len(finder.results["lr"]) == 6
    summary = last_summary(trainer)
    assert summary.parts_steps.get("training", 0) >= 6, summary
    assert summary.eager_steps == {}, summary
