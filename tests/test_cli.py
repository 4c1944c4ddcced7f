"""LightningCLI sees `use_compile`: on the command line, in YAML configs, in `--help` and in `--print_config`."""

import contextlib
import io

import pytest
import yaml

from helpers import LoggingModel, feature, last_summary
from lightning.pytorch.cli import LightningCLI

pytest.importorskip("jsonargparse")

QUIET_ARGS = [
    "--trainer.logger=false",
    "--trainer.enable_checkpointing=false",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--trainer.accelerator=cpu",
    "--trainer.devices=1",
]


def cli(*args, run=False):
    args = [*args, *QUIET_ARGS] if run else list(args)
    return LightningCLI(LoggingModel, args=args, run=run, save_config_callback=None)


def test_true_on_the_command_line():
    config = cli("--trainer.use_compile", "true").trainer._compile_connector
    assert config.use_compile is True
    assert config.compile_kwargs == {}


def test_a_dict_on_the_command_line():
    config = cli("--trainer.use_compile", "{backend: aot_eager, dynamic: false}").trainer._compile_connector
    assert config.compile_kwargs == {"backend": "aot_eager", "dynamic": False}


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
    assert "strategy has wrapped it" in out


def test_yaml_config_runs_fit_compiled(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump({"trainer": {"max_steps": 2, "limit_val_batches": 0, "use_compile": {"backend": "eager"}}})
    )
    result = cli("fit", "--config", str(config), run=True)
    assert result.trainer._compile_connector.compile_kwargs == {"backend": "eager"}
    assert result.trainer.global_step == 2
    assert last_summary(result.trainer).graphs > 0


def test_print_config_round_trip(tmp_path, capsys):
    value = {"backend": "aot_eager", "fullgraph": True, "optimize_ddp": False}
    with pytest.raises(SystemExit):
        cli("--trainer.use_compile", yaml.safe_dump(value, default_flow_style=True).strip(), "--print_config")
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["trainer"]["use_compile"] == value
    config = tmp_path / "printed.yaml"
    config.write_text(yaml.safe_dump(printed))
    again = cli("--config", str(config)).trainer._compile_connector
    assert again.compile_kwargs == {"backend": "aot_eager", "fullgraph": True}
    assert feature(again.trainer, "optimize_ddp").choice is False
