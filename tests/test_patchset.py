"""The upstream series is generated from the package and cannot drift from it; the apply helper is all-or-nothing."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import apply_series  # noqa: E402
import patchset  # noqa: E402
from upstream import series  # noqa: E402

pytestmark = pytest.mark.package_only


def test_committed_series_matches_the_package():
    """Regenerates every new file and every edit, and compares them with patches/ (no Lightning checkout needed)."""
    assert patchset.check(patchset.Base(None)) == []


def test_every_patch_is_a_git_am_mbox():
    for path in sorted((ROOT / "patches").glob("*.patch")):
        text = path.read_text()
        assert text.startswith("From ")
        assert "\nFrom: " in text
        assert "\nSubject: [PATCH " in text
        assert "\n---\ndiff --git " in text


def test_new_files_are_the_package_modules_with_lightning_imports():
    rendered = patchset.render_module("connector", features=set())
    assert rendered.startswith("# Copyright The Lightning AI team.")
    assert "lightning_compile_patch" not in rendered
    assert "from lightning.pytorch.utilities.compile_config import" in rendered
    ast.parse(rendered)


def test_tagged_lines_appear_from_their_feature_on():
    without = patchset.render_module("config", features=set())
    with_regions = patchset.render_module("config", features={"regions"})
    assert "# patch:" not in without + with_regions
    assert '"regions":' not in without
    assert '"regions":' in with_regions
    ast.parse(without)
    ast.parse(with_regions)


def test_drift_is_detected(monkeypatch):
    original = patchset.render_module

    def changed(module, features):
        text = original(module, features)
        return text.replace("`use_compile` wins", "`use_compile` wins!") if module == "connector" else text

    monkeypatch.setattr(patchset, "render_module", changed)
    problems = patchset.check(patchset.Base(None))
    assert any("compile_connector.py differs" in p for p in problems)


def _connector_calls(source: str) -> set[str]:
    """The `_compile_connector` methods called in ``source``."""
    tree = ast.parse(source)
    return {
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, (ast.Attribute, ast.Name))
        and getattr(node.func.value, "attr", getattr(node.func.value, "id", None))
        in ("_compile_connector", "connector")
    }


def test_trainer_edits_call_the_connector_where_the_monkeypatch_does():
    added = "\n".join(
        line.strip()
        for edit in series.USE_COMPILE.edits
        if edit.path == series.TRAINER
        for line in edit.new.splitlines()
    )
    upstream_calls = {
        call for call in ("verify_strategy", "unwrap", "on_run_start", "compile", "teardown") if call in added
    }
    package_calls = _connector_calls((ROOT / "src/lightning_compile_patch/patch.py").read_text())
    assert upstream_calls == package_calls == {"verify_strategy", "unwrap", "on_run_start", "compile", "teardown"}
    assert "_CompileConnector(self, use_compile)" in added


def _fake_fork(tmp_path, version="2.6.6", trainer="class Trainer: ...\n"):
    fork = tmp_path / "fork"
    (fork / "src/lightning/pytorch/trainer").mkdir(parents=True)
    (fork / "src/version.info").write_text(version + "\n")
    (fork / apply_series.TRAINER).write_text(trainer)
    for command in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", *command], cwd=fork, check=True)
    return fork


def test_apply_refuses_a_dirty_fork(tmp_path):
    fork = _fake_fork(tmp_path)
    (fork / apply_series.TRAINER).write_text("changed\n")
    with pytest.raises(apply_series.RefusedError, match="uncommitted changes"):
        apply_series.check_fork(fork, allow_version=False)


def test_apply_refuses_another_version(tmp_path):
    fork = _fake_fork(tmp_path, version="2.5.0")
    with pytest.raises(apply_series.RefusedError, match=r"Lightning 2\.5\.0; the series is made for 2\.6\.6"):
        apply_series.check_fork(fork, allow_version=False)


def test_apply_refuses_a_fork_that_has_the_series(tmp_path):
    fork = _fake_fork(tmp_path, trainer="use_compile = None\n")
    with pytest.raises(apply_series.RefusedError, match="applied already"):
        apply_series.check_fork(fork, allow_version=False)


def test_apply_refuses_what_is_not_a_repository(tmp_path):
    with pytest.raises(apply_series.RefusedError, match="not a git work tree"):
        apply_series.check_fork(tmp_path, allow_version=False)


def test_a_series_that_does_not_apply_leaves_the_fork_unchanged(tmp_path):
    fork = _fake_fork(tmp_path)  # not Lightning: no hunk of the series applies
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=fork, capture_output=True, text=True).stdout
    assert apply_series.main([str(fork)]) == 1
    after = subprocess.run(["git", "rev-parse", "HEAD"], cwd=fork, capture_output=True, text=True).stdout
    status = subprocess.run(["git", "status", "--porcelain"], cwd=fork, capture_output=True, text=True).stdout
    assert after == head
    assert status == ""


@pytest.mark.parametrize("level", range(len(series.SERIES)))
def test_every_patch_leaves_importable_code(level, tmp_path):
    """Each patch of the series, applied alone on top of the ones before, leaves no undefined or unused name."""
    ruff = pytest.importorskip("ruff")  # noqa: F841
    features = patchset.features_up_to(level)
    for module in patchset.UPSTREAM_MODULES:
        (tmp_path / f"{module}.py").write_text(patchset.render_module(module, features))
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F,E9", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout
