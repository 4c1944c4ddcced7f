"""LightningCLI sees `use_compile`: on the command line, in YAML configs, in `--help` and in `--print_config`.

Every option arrives equal, compared by value, from a literal, JSON, YAML, the command line and the environment.
"""

import contextlib
import io
import json

import pytest
import torch
import torch._dynamo
import torch._inductor.compile_fx
import yaml
from torch.utils.data import DataLoader

from helpers import TORCH_2_7, CountingBackend, LoggingModel, connector_module, feature, last_summary
from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.demos.boring_classes import RandomDataset

pytest.importorskip("jsonargparse")

#: The name under which `counting` registers its backend, so that a command line or a YAML config can name it.
COUNTING = "lcp_cli_counting"

QUIET_ARGS = [
    "--trainer.logger=false",
    "--trainer.enable_checkpointing=false",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--trainer.accelerator=cpu",
    "--trainer.devices=1",
]


def cli(*args, run=False, model=LoggingModel):
    args = [*args, *QUIET_ARGS] if run else list(args)
    return LightningCLI(model, args=args, run=run, save_config_callback=None)


class ShapeRecordingBackend(CountingBackend):
    """A counting backend that also records, per graph, whether it takes symbolic sizes (compiled as dynamic)."""

    def __init__(self, name):
        super().__init__(name)
        self.dynamic = []

    def __call__(self, gm, example_inputs):
        self.dynamic.append(any(isinstance(value, torch.SymInt) for value in example_inputs))
        return super().__call__(gm, example_inputs)


@pytest.fixture
def counting():
    """A :class:`ShapeRecordingBackend` registered as ``COUNTING`` for this test: what the CLI's value compiles with."""
    backend = ShapeRecordingBackend(COUNTING)
    torch._dynamo.register_backend(backend, name=COUNTING)
    yield backend
    registry = torch._dynamo.backends.registry
    registry._COMPILER_FNS.pop(COUNTING, None)
    registry._BACKENDS.pop(COUNTING, None)


@pytest.fixture
def inductor(monkeypatch):
    """Stands in for inductor's compiler, the default backend's: counts its graphs and runs them eagerly."""
    backend = CountingBackend("cli-inductor")
    monkeypatch.setattr(
        torch._inductor.compile_fx, "compile_fx", lambda gm, example_inputs, **_: backend(gm, example_inputs)
    )
    return backend


class PartialBatch(LoggingModel):
    """One batch of 8, then one of 4: the second compiles again, as dynamic unless `dynamic=False` was given."""

    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 12), batch_size=8)


FIT_ARGS = ["--trainer.max_steps=2", "--trainer.limit_val_batches=0"]


def test_true_on_the_command_line(inductor):
    result = cli("fit", "--trainer.use_compile", "true", *FIT_ARGS, run=True)
    # `True` is `torch.compile`'s defaults: the steps compiled with its default backend, inductor, and ran compiled
    assert result.trainer.global_step == 2
    assert inductor.graphs > 0
    assert inductor.calls >= result.trainer.global_step


def test_a_dict_on_the_command_line(counting, inductor):
    cli(
        "fit",
        "--trainer.use_compile",
        f"{{backend: {COUNTING}, dynamic: false}}",
        *FIT_ARGS,
        run=True,
        model=PartialBatch,
    )
    # both keys reached `torch.compile`: its graphs ran with the backend named, and the partial batch compiled again
    # with static sizes, where automatic dynamic shapes would have made its graph dynamic
    assert counting.calls >= 2
    assert len(counting.dynamic) >= 2
    assert not any(counting.dynamic), counting.dynamic
    assert inductor.graphs == 0


def test_a_bad_key_on_the_command_line_raises_the_trainers_error():
    """A dict parses (the argument's type allows any), so the Trainer's own check reports the key and the fix."""
    with pytest.raises(ValueError, match=r"unknown key 'backedn'\. Did you mean 'backend'\?"):
        cli("--trainer.use_compile", "{backedn: eager}")


@pytest.mark.parametrize(("value", "given"), [("3", "3"), ("[eager]", "['eager']")])
def test_a_value_of_the_wrong_type_on_the_command_line_is_a_usage_error(value, given):
    """Not a bool, dict or null: the parser rejects it from the Trainer's signature, with exit code 2."""
    stderr = io.StringIO()
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(stderr):
        cli("--trainer.use_compile", value)
    assert exit_info.value.code == 2
    assert 'Parser key "trainer.use_compile"' in stderr.getvalue()
    assert f"Given value: {given}\n" in stderr.getvalue()


def test_help_lists_use_compile(capsys):
    with pytest.raises(SystemExit):
        cli("--help")
    out = capsys.readouterr().out
    assert "--trainer.use_compile USE_COMPILE" in out
    assert "strategy has set it up" in out


def test_yaml_config_runs_fit_compiled(tmp_path, counting):
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump({"trainer": {"max_steps": 2, "limit_val_batches": 0, "use_compile": {"backend": COUNTING}}})
    )
    result = cli("fit", "--config", str(config), run=True)
    assert counting.graphs > 0  # the config's backend compiled the steps
    assert counting.calls >= 2  # and both steps ran its graphs
    assert result.trainer.global_step == 2
    assert last_summary(result.trainer).graphs > 0


class GraphBreak(LoggingModel):
    def training_step(self, batch, batch_idx):
        torch._dynamo.graph_break()
        return super().training_step(batch, batch_idx)


def test_print_config_round_trip(tmp_path, capsys, counting):
    value = {"backend": COUNTING, "fullgraph": True, "optimize_ddp": False}
    with pytest.raises(SystemExit):
        cli("--trainer.use_compile", yaml.safe_dump(value, default_flow_style=True).strip(), "--print_config")
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["trainer"]["use_compile"] == value
    config = tmp_path / "printed.yaml"
    config.write_text(yaml.safe_dump(printed))
    again = cli("fit", "--config", str(config), *FIT_ARGS, run=True)
    # what the printed config gives `torch.compile`: its backend compiled the steps, and they ran its graphs
    assert counting.graphs > 0
    assert counting.calls >= 2
    assert feature(again.trainer, "optimize_ddp").choice is False
    # and `fullgraph=True`: a step with a graph break fails to compile, where it would otherwise run in two graphs
    with pytest.raises(RuntimeError, match=r"could not compile.*graph_break"):
        cli("fit", "--config", str(config), *FIT_ARGS, run=True, model=GraphBreak)


#: A representative value of each `use_compile` key: every feature's keys (discovered below), and `torch.compile`'s.
OPTION_VALUES = {
    # the package's defaults, turned off: a `false` from JSON, YAML or the command line must arrive as `False`
    **dict.fromkeys(["summary", "compile_errors", "defer_logging", "eager_metrics", "dynamic_loop_counters"], False),
    "compile_budget": False,
    "stage_guards": False,
    "no_grad_evaluation": False,
    "check_tensor_parallel": False,
    "dynamic_lr": False,
    "list_outputs": False,
    "eager_optimizer_steps": False,
    "in_parts": False,
    "fallback": "eager",
    "regions": ["Linear"],
    "optimize_ddp": "python_reducer",
    **({"cache": "lcp-cli-cache"} if TORCH_2_7 else {}),  # the cache needs torch 2.7
    "cache_shared": True,
    "compiled_autograd": {"backend": "aot_eager"},
    "backend": "aot_eager",
    "mode": "max-autotune-no-cudagraphs",
    "dynamic": False,
    "fullgraph": True,
    "options": {"max_autotune": False},
    "disable": False,
}


def feature_keys():
    return [key for feature_class in connector_module()._feature_classes() for key in feature_class.keys]


def test_every_feature_key_has_a_value_in_the_paths_test():
    missing = set(feature_keys()) - set(OPTION_VALUES) - ({"cache"} if not TORCH_2_7 else set())
    assert not missing, "add a representative value for the new key to OPTION_VALUES"


def literal(value, tmp_path, monkeypatch):
    return Trainer(use_compile=value, logger=False)


def from_json(value, tmp_path, monkeypatch):
    return Trainer(use_compile=json.loads(json.dumps(value)), logger=False)


def yaml_config(value, tmp_path, monkeypatch):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"trainer": {"use_compile": value}}))
    return cli("--config", str(config)).trainer


def command_line(value, tmp_path, monkeypatch):
    return cli(f"--trainer.use_compile={json.dumps(value)}").trainer


def cli_environment(value, tmp_path, monkeypatch):
    monkeypatch.setenv("PL_TRAINER__USE_COMPILE", json.dumps(value))
    env = {"default_env": True}
    return LightningCLI(LoggingModel, args=[], run=False, save_config_callback=None, parser_kwargs=env)


def trainer_environment(value, tmp_path, monkeypatch):
    monkeypatch.setenv("PL_TRAINER_USE_COMPILE", repr(value))  # Lightning reads it with `ast.literal_eval`
    return Trainer(logger=False)


PATHS = [literal, from_json, yaml_config, command_line, cli_environment, trainer_environment]


@pytest.mark.parametrize("path", PATHS, ids=lambda path: path.__name__)
@pytest.mark.parametrize("value", [True, *({key: value} for key, value in OPTION_VALUES.items())], ids=repr)
def test_every_option_arrives_equal_however_it_is_given(value, path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    expected = literal(value, tmp_path, monkeypatch)._compile_connector
    given = path(value, tmp_path, monkeypatch)
    connector = (given.trainer if isinstance(given, LightningCLI) else given)._compile_connector
    assert connector.use_compile == value
    assert (connector.options.torch_kwargs, connector.options.keys) == (
        expected.options.torch_kwargs,
        expected.options.keys,
    )
    # and each feature read it as it reads the literal
    assert [vars(feature) for feature in connector.features] == [vars(feature) for feature in expected.features]
