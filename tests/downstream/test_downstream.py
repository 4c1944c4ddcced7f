"""Libraries built on Lightning pass ``use_compile`` through their own Trainer arguments, and train as they do eager.

Each library builds its own ``Trainer`` from arguments its user passes through (``trainer_kwargs``,
``pl_trainer_kwargs``, a model's keyword arguments). Each case trains a small model on tiny synthetic data from a
random init, eager and then with ``use_compile``, and compares: every training loss, every logged name and value, and
the predictions (rtol 1e-4). Every step of the compiled runs is compiled, or counted eager with the cause the case
states: a cause that is torch's (``docs/torch-bug-reports.md``) or the library's code (``docs/usage.md``), never a
guess ("skipped") and never a budget used up by an earlier case.
"""

import importlib
import logging
import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import pandas as pd
import pytest
import torch

import lightning_compile_patch

USE_COMPILE = {"backend": "aot_eager"}
RTOL, ATOL = 1e-4, 1e-6
#: Why a step of a library's model runs eagerly where torch cannot compile it; each one is told in a warning too.
LOOP = "skipped: graph break in loop"  # the library's step loops over a pandas object Dynamo does not trace
PARTS = "in parts"  # the step's own code ran eagerly, the modules it calls compiled (`in_parts`)
RAISED = "skipped: Observed exception"  # docs/repros/property_attribute_error_fallback.py: torch's


@dataclass
class Run:
    """What one training and prediction did, as the user sees it."""

    losses: list = field(default_factory=list)
    logged: list = field(default_factory=list)
    predictions: Any = None
    trainers: list = field(default_factory=list)


def recorder(flavour: str, run: Run) -> Any:
    """A callback of ``flavour`` (``pytorch_lightning`` or ``lightning.pytorch``) that records into ``run``.

    Libraries copy the callbacks they are given (neuralforecast deep-copies its models): the copy records into the
    same run.
    """
    callback = importlib.import_module(flavour).Callback

    class Recorder(callback):
        def __deepcopy__(self, memo: dict) -> "Recorder":
            return self

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            run.trainers.append(trainer)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            run.losses.append(float(loss))

        def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            if not trainer.sanity_checking:
                run.logged.append({name: float(value) for name, value in trainer.callback_metrics.items()})

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            run.logged.append({name: float(value) for name, value in trainer.callback_metrics.items()})

    return Recorder()


def seeded(seed: int = 0) -> None:
    import random

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def series(n: int = 80, groups: int = 2) -> pd.DataFrame:
    """Noisy sine waves, one per group."""
    rng = np.random.default_rng(0)
    t = np.arange(n)
    frames = [
        pd.DataFrame({"group": str(g), "time_idx": t, "y": np.sin(t / 5 + g) + rng.normal(0, 0.1, n)})
        for g in range(groups)
    ]
    return pd.concat(frames, ignore_index=True)


# ---- neuralforecast: a model's keyword arguments are the Trainer's (`pytorch_lightning`) ----------------------------


def neuralforecast_case(name: str, **kwargs: Any) -> Callable[[Optional[dict]], Run]:
    def train(use_compile: Optional[dict]) -> Run:
        from neuralforecast import NeuralForecast, models

        run = Run()
        data = series().rename(columns={"group": "unique_id", "time_idx": "ds"})
        extra = {} if use_compile is None else {"use_compile": use_compile}
        seeded()
        net = getattr(models, name)(
            h=4, input_size=8, max_steps=12, val_check_steps=4, random_seed=0, accelerator="cpu", logger=False,
            enable_progress_bar=False, enable_model_summary=False, callbacks=[recorder("pytorch_lightning", run)],
            **kwargs, **extra,
        )  # fmt: skip
        forecast = NeuralForecast(models=[net], freq=1)
        forecast.fit(data, val_size=8)
        run.predictions = forecast.predict()[name].to_numpy()
        return run

    return train


# ---- darts: `pl_trainer_kwargs` (`pytorch_lightning`) ---------------------------------------------------------------


def darts_case(name: str, **kwargs: Any) -> Callable[[Optional[dict]], Run]:
    def train(use_compile: Optional[dict]) -> Run:
        import darts.models
        from darts import TimeSeries

        run = Run()
        values = series(groups=1)["y"].to_numpy(np.float32)
        train_series, val_series = TimeSeries.from_values(values[:60]), TimeSeries.from_values(values[52:])
        trainer_kwargs = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False}
        trainer_kwargs["callbacks"] = [recorder("pytorch_lightning", run)]
        if use_compile is not None:
            trainer_kwargs["use_compile"] = use_compile
        seeded()
        net = getattr(darts.models, name)(
            input_chunk_length=8, output_chunk_length=4, n_epochs=3, batch_size=16, random_state=0,
            pl_trainer_kwargs=trainer_kwargs, **kwargs,
        )  # fmt: skip
        net.fit(train_series, val_series=val_series, verbose=False)
        run.predictions = net.predict(n=4, series=train_series, verbose=False).values()
        return run

    return train


# ---- pytorch-tabular: `TrainerConfig(trainer_kwargs=...)` (`pytorch_lightning`) -------------------------------------


def tabular_case(name: str, **kwargs: Any) -> Callable[[Optional[dict]], Run]:
    def train(use_compile: Optional[dict]) -> Run:
        import pytorch_tabular.models
        from pytorch_tabular import TabularModel
        from pytorch_tabular.config import DataConfig, OptimizerConfig, TrainerConfig

        run = Run()
        rng = np.random.default_rng(0)
        data = pd.DataFrame({"x1": rng.normal(size=200), "x2": rng.normal(size=200), "c": rng.choice(list("pqr"), 200)})
        data["y"] = data.x1 * 2 - data.x2 + (data.c == "p")
        trainer_kwargs = {} if use_compile is None else {"use_compile": use_compile}
        trainer_config = TrainerConfig(
            batch_size=32, max_epochs=3, accelerator="cpu", trainer_kwargs=trainer_kwargs, progress_bar="none",
            checkpoints=None, early_stopping=None, load_best=False, seed=0,
        )  # fmt: skip
        seeded()
        model = TabularModel(
            data_config=DataConfig(target=["y"], continuous_cols=["x1", "x2"], categorical_cols=["c"]),
            model_config=getattr(pytorch_tabular.models, name)(task="regression", **kwargs),
            optimizer_config=OptimizerConfig(),
            trainer_config=trainer_config,
            verbose=False,
        )
        model.fit(train=data[:160], validation=data[160:180], callbacks=[recorder("pytorch_lightning", run)], seed=0)
        run.predictions = model.predict(data[180:]).to_numpy()
        return run

    return train


# ---- pytorch-forecasting: the user's Trainer for `fit`, `predict(trainer_kwargs=...)` (`lightning.pytorch`) ----------


def forecasting_case(name: str, **kwargs: Any) -> Callable[[Optional[dict]], Run]:
    def train(use_compile: Optional[dict]) -> Run:
        import pytorch_forecasting
        from pytorch_forecasting import TimeSeriesDataSet

        from lightning.pytorch import Trainer

        run = Run()
        data = series()
        dataset = TimeSeriesDataSet(
            data[data.time_idx < 64], time_idx="time_idx", target="y", group_ids=["group"], max_encoder_length=8,
            max_prediction_length=4, time_varying_unknown_reals=["y"], target_normalizer=None,
        )  # fmt: skip
        validation = TimeSeriesDataSet.from_dataset(dataset, data, min_prediction_idx=64)
        train_loader = dataset.to_dataloader(train=True, batch_size=16, num_workers=0, shuffle=False)
        val_loader = validation.to_dataloader(train=False, batch_size=16, num_workers=0)
        extra = {} if use_compile is None else {"use_compile": use_compile}
        seeded()
        net = getattr(pytorch_forecasting, name).from_dataset(dataset, learning_rate=1e-2, log_interval=-1, **kwargs)
        trainer = Trainer(
            max_epochs=2, accelerator="cpu", logger=False, enable_progress_bar=False, enable_checkpointing=False,
            enable_model_summary=False, callbacks=[recorder("lightning.pytorch", run)], **extra,
        )  # fmt: skip
        trainer.fit(net, train_dataloaders=train_loader, val_dataloaders=val_loader)
        # no callbacks of our own here: given some, `predict` leaves out the one it collects the predictions with
        run.predictions = net.predict(val_loader, trainer_kwargs={"logger": False, **extra}).cpu().numpy()
        run.trainers.append(net.trainer)  # the Trainer that `predict` built
        return run

    return train


#: library-model: how to train it, and why the steps that run eagerly do, by stage and kind of step.
CASES = {
    "neuralforecast-MLP": (
        neuralforecast_case("MLP", num_layers=2, hidden_size=16),
        {"fit evaluation": (PARTS, LOOP), "predict evaluation": (PARTS, LOOP)},
    ),
    "neuralforecast-NHITS": (
        neuralforecast_case("NHITS", mlp_units=[[16, 16]] * 3),
        {"fit evaluation": (PARTS, LOOP), "predict evaluation": (PARTS, LOOP)},
    ),
    "neuralforecast-LSTM": (
        neuralforecast_case("LSTM", encoder_hidden_size=8, decoder_hidden_size=8),
        {"fit evaluation": (PARTS, LOOP), "predict evaluation": (PARTS, LOOP)},
    ),
    "darts-NBEATS": (darts_case("NBEATSModel", num_stacks=2, num_blocks=1, num_layers=2, layer_widths=16), {}),
    "darts-TiDE": (darts_case("TiDEModel", hidden_size=16), {}),
    "darts-BlockRNN": (darts_case("BlockRNNModel", model="LSTM", hidden_dim=8), {"predict evaluation": (PARTS, LOOP)}),
    "darts-TSMixer": (darts_case("TSMixerModel", hidden_size=16), {}),
    # its `predict` runs the model without a Trainer
    "pytorch_tabular-CategoryEmbedding": (
        tabular_case("CategoryEmbeddingModelConfig", layers="16-8"),
        {"fit training": (PARTS, RAISED), "fit evaluation": (PARTS, RAISED)},
    ),
    "pytorch_tabular-GANDALF": (tabular_case("GANDALFConfig", gflu_stages=2), {}),
    "pytorch_forecasting-NBeats": (forecasting_case("NBeats", widths=[16, 16]), {}),
    # Dynamo fails inside its own trace of the validation step's sampling (an internal error, "torch.Size() takes an
    # iterable of 'int'"): `fallback` runs the frames that fail uncompiled, seven nested ones, and the rest compiled
    "pytorch_forecasting-DeepAR": (forecasting_case("DeepAR", hidden_size=8, rnn_layers=1), {}, {"fallback": "eager"}),
}


def steps_line(summary: Any) -> str:
    """``fit: training 12 compiled, evaluation 3 in parts (skipped: graph break in loop)``."""
    kinds = sorted({*summary.compiled_steps, *summary.parts_steps, *summary.eager_steps})
    counts = {"compiled": summary.compiled_steps, "in parts": summary.parts_steps, "eager": summary.eager_steps}
    steps = [", ".join(f"{k} {n[k]} {how}" for how, n in counts.items() if n.get(k)) for k in kinds]
    causes = sorted({*summary.parts_causes, *summary.eager_causes})
    return f"{summary.stage}: {'; '.join(steps)}{f' ({chr(44).join(causes)})' if causes else ''}"


def not_compiled(summaries: list) -> dict[str, tuple[str, set[str]]]:
    """How each stage's steps that did not compile whole ran, ``in parts`` or ``eager``, and why."""
    found = {}
    for s in summaries:
        for how, steps, causes in (
            ("in parts", s.parts_steps, s.parts_causes),
            ("eager", s.eager_steps, s.eager_causes),
        ):
            for kind, n in steps.items():
                if n:
                    found[f"{s.stage} {kind}"] = (how, set(causes))
    return found


def close(got: Any, want: Any) -> bool:
    return np.allclose(np.asarray(got, dtype=float), np.asarray(want, dtype=float), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", list(CASES))
def test_a_library_model_trains_compiled_as_it_trains_eager(case):
    train, expected, *options = CASES[case]
    logging.getLogger("pytorch_lightning").setLevel(logging.WARNING)
    logging.getLogger("lightning").setLevel(logging.WARNING)
    eager = train(None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = train({**USE_COMPILE, **(options[0] if options else {})})
    # the same training, the same logged names and values, the same predictions
    assert len(compiled.losses) == len(eager.losses) > 0
    assert close(compiled.losses, eager.losses), (compiled.losses, eager.losses)
    assert [sorted(m) for m in compiled.logged] == [sorted(m) for m in eager.logged]
    for got, want in zip(compiled.logged, eager.logged, strict=True):
        assert all(close(got[name], want[name]) or math.isnan(want[name]) for name in want), (got, want)
    assert close(compiled.predictions, eager.predictions)
    # every step compiled, or counted eager with the cause stated above, and warned of
    summaries = [lightning_compile_patch.last_summary(trainer) for trainer in dict.fromkeys(compiled.trainers)]
    assert summaries, "no Trainer ran"
    assert all(summary is not None for summary in summaries), summaries
    trained = sum(
        sum(n.get("training", 0) for n in (s.compiled_steps, s.parts_steps, s.eager_steps)) for s in summaries
    )
    assert trained == len(eager.losses)
    found = not_compiled(summaries)
    assert set(found) == set(expected), found
    for where, (how, causes) in found.items():
        assert how == expected[where][0], (where, how, causes)
        assert expected[where][1] in causes, (where, how, causes)
    assert {c for s in summaries for c in (*s.eager_causes, *s.parts_causes)} <= {c for _, c in expected.values()}
    if os.environ.get("LCP_DOWNSTREAM_TABLE"):  # one row per case, for docs/compatibility.md (`nox -s downstream`)
        with open(os.environ["LCP_DOWNSTREAM_TABLE"], "a") as table:
            table.write(f"| {case} | {' / '.join(steps_line(s) for s in summaries)} |\n")
    warned = " ".join(str(w.message) for w in caught)
    for how, cause in set(expected.values()):
        if cause == "fallback":
            told = "It continues uncompiled (`fallback='eager'`)"
        else:
            told = ") ran compiled in parts (" if how == "in parts" else ") ran eagerly ("
        assert told in warned, (how, cause)
