"""The upstream series is generated from the package and cannot drift from it; the apply helper is all-or-nothing."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import apply_series  # noqa: E402
import patchset  # noqa: E402
from upstream import series  # noqa: E402


@pytest.mark.parametrize("base_name", series.BASES)
def test_committed_ladder_matches_the_package(base_name):
    """Regenerates every new file and every edit, and compares them with patches/ (no Lightning checkout needed)."""
    assert patchset.check(patchset.Base(None), base_name) == []


def test_committed_2_6_6_ladder_matches_the_package_byte_for_byte_in_src():
    """The installed Lightning 2.6.6 is the base's ``src/``: every edit of a Lightning source file, byte for byte."""
    import lightning

    if lightning.__version__ != "2.6.6":
        pytest.skip(f"the installed Lightning is {lightning.__version__}, not the 2.6.6 base")
    assert patchset.check(patchset.InstalledLightning(), "2.6.6") == []


@pytest.mark.parametrize("base_name", series.BASES)
def test_every_patch_is_a_git_am_mbox(base_name):
    paths = sorted(patchset.series_dir(base_name).glob("*.patch"))
    assert len(paths) == len(series.series(base_name))
    for path in paths:
        text = path.read_text()
        assert text.startswith("From ")
        assert "\nFrom: " in text
        assert "\nSubject: [PATCH " in text
        assert "\n---\ndiff --git " in text


def test_new_files_are_the_package_modules_with_lightning_imports():
    rendered = patchset.render_module("compile_connector")
    assert rendered.startswith("# Copyright The Lightning AI team.")
    assert "lightning_compile_patch" not in rendered
    assert "from lightning.pytorch.trainer.connectors.compile_features import (" in rendered
    feature = patchset.render_module("compile_features.regions")
    assert "from lightning.pytorch.trainer.connectors.compile_features import _CompileFeature" in feature
    ast.parse(rendered)
    ast.parse(feature)


def _src_lines_added(patch_file: Path) -> int:
    return sum(
        1
        for path, section in patchset.split_sections(patch_file.read_text())[1].items()
        if path.startswith("src/") and not path.endswith("CHANGELOG.md")
        for line in section.splitlines()
        if line.startswith("+") and not line.startswith("+++")
    )


@pytest.mark.parametrize(("subject", "most"), [("REAPPLY", 95), ("USE_COMPILE", 175)])
def test_the_rungs_a_maintainer_would_merge_stay_small(subject, most):
    # Fabric's re-apply (#19280) was 94 src lines; the `ddp_spawn` fix adds its connector (the unwrap where the launcher
    # pickles the model, and the compile after the setup: 73 lines with docstrings, 13 of license), the Trainer's
    # calls, and the strategy check (its body moved into a function of its own, which the Trainer calls for a model it
    # is to compile): 94. Elsewhere the model takes Lightning's own path, left compiled after the run, and it compiles
    # the steps, not the wrapper, so it needs no undo and no reset of the forward redirection (the seam's, with the
    # wrapper's compile). The fix of Fabric's capture is a rung of its own.
    # `use_compile`: the flag, its check by `torch.compile`, the refusal of a model compiled by hand otherwise, and the
    # undo, in `_teardown`, of what it compiled of a model passed in plain, and a run uncompiled where torch compiles
    # nothing (`disable=True`, `TORCHDYNAMO_DISABLE=1`), which crashed in `from_compiled`: 173
    for base_name in series.BASES:
        number = [patch.subject for patch in series.series(base_name)].index(getattr(series, subject).subject) + 1
        [patch_file] = patchset.series_dir(base_name).glob(f"{number:04d}-*.patch")
        assert _src_lines_added(patch_file) <= most, base_name


def test_the_core_stack_is_the_fixes_then_the_reapply_then_use_compile_then_the_seam():
    *fixes, reapply, use_compile, seam = series.CORE_STACK
    assert (reapply, use_compile, seam) == (series.REAPPLY, series.USE_COMPILE, series.FEATURE_SEAM)
    assert reapply.modules == use_compile.modules == ("compile_connector",)
    assert (reapply.rung, use_compile.rung, seam.rung) == ("reapply", "use_compile", "")
    assert seam.modules == (
        "compile_features",
        "compile_features._private_names",
        "compile_features._run",
        "compile_connector",
    )
    assert len(fixes) == 4
    for fix in fixes:  # a fix of Lightning's own code, with its tests, that can merge alone
        assert fix.modules == ()
        assert fix.subject.startswith("Fix ")
        assert {type(edit).__name__ for edit in fix.edits} >= {"ReplaceDef"}


def test_the_reapply_rung_adds_no_argument_no_seam_no_undo_and_no_private_torch_name():
    connector = patchset.render_module("compile_connector", "reapply")
    assert "use_compile" not in connector
    assert "_CompileFeature" not in connector
    assert "compile_features" not in connector
    # it compiles the steps (`from_compiled`), not the wrapper, and resets nothing: none of the wrapper's private names
    for private in ("torch._C", "torch._dynamo.config", "reset_code", "_compiled_call_impl", "wrapped_forward"):
        assert private not in connector, private
    # it leaves the model compiled after the run, as master does: no undo, and no change of the Trainer's teardown
    assert "def teardown" not in connector
    assert "defer" not in connector
    trainer_lines = "\n".join(edit.new for edit in series.REAPPLY.edits if edit.path == series.TRAINER)
    assert "use_compile" not in trainer_lines
    assert "teardown" not in trainer_lines
    ast.parse(connector)


def test_every_rung_of_the_connector_is_lint_clean(tmp_path):
    pytest.importorskip("ruff")
    for name, rung in {"reapply": "reapply", "use_compile": "use_compile", "all": ""}.items():
        (tmp_path / f"{name}.py").write_text(patchset.render_module("compile_connector", rung))
    command = [sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F,E9,I", "--line-length", "120"]
    command += ["--config", 'lint.isort.known-first-party = ["lightning"]']  # as Lightning's pyproject.toml has it
    result = subprocess.run([*command, str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_each_later_patch_adds_one_feature_module_and_edits_no_core_code():
    core_paths = {patchset.upstream_path("compile_connector"), series.TRAINER, series.COMPILE_UTILS, series.STRATEGY}
    for base_name in series.BASES:
        for patch in series.series(base_name)[len(series.CORE_STACK) :]:
            # one feature module; the run's compile errors come with `fallback`, which builds on them
            expected = 2 if patch.subject == series.FALLBACK.subject else 1
            assert len(patch.modules) == expected, patch.subject
            assert all(module.startswith("compile_features.") for module in patch.modules)
            assert not {edit.path for edit in patch.edits} & core_paths, patch.subject


def test_each_fix_adds_its_tests_to_lightnings_own_test_files():
    # three reviews asked for the fixes' tests beside Lightning's tests of the same code, not in files of their own
    *fixes, _, _, _ = series.CORE_STACK
    for fix in fixes:
        assert not fix.tests, fix.subject
        added = [edit for edit in fix.edits if isinstance(edit, series.AddTests)]
        assert added, fix.subject
        assert all(edit.node_ids() for edit in added), fix.subject


_LIGHTNING_TESTS = """\
import torch

from lightning.pytorch import Trainer
from tests_pytorch.helpers.runif import RunIf


def test_first():
    pass


@RunIf(dynamo=True)
def test_second():
    pass
"""


def _added_tests(tmp_path, monkeypatch, source: str) -> str:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_new.py").write_text(source)
    monkeypatch.setattr(series, "HERE", tmp_path)
    return patchset.add_tests(_LIGHTNING_TESTS, series.AddTests("tests/test_x.py", "test_new.py", after="test_first"))


def test_added_tests_go_after_their_anchor_with_a_new_module_imported_in_order(tmp_path, monkeypatch):
    source = "import torch\n\nfrom lightning.pytorch.strategies import DDPStrategy\n\n\ndef test_added():\n    pass\n"
    out = _added_tests(tmp_path, monkeypatch, source)
    assert out == _LIGHTNING_TESTS.replace(
        "from lightning.pytorch import Trainer\n",
        "from lightning.pytorch import Trainer\nfrom lightning.pytorch.strategies import DDPStrategy\n",
    ).replace("def test_first():\n    pass\n", "def test_first():\n    pass\n\n\ndef test_added():\n    pass\n")


@pytest.mark.parametrize(
    ("source", "match"),
    [
        ("from lightning.pytorch import LightningModule\n\n\ndef test_added():\n    pass\n", "lacks"),
        ("import torch\n\n\ndef test_second():\n    pass\n", "already defines"),
    ],
)
def test_added_tests_refuse_an_import_the_file_lacks_and_a_name_it_has(tmp_path, monkeypatch, source, match):
    with pytest.raises(ValueError, match=match):
        _added_tests(tmp_path, monkeypatch, source)


def test_drift_is_detected(monkeypatch):
    original = patchset.render_module

    def changed(module, rung=""):
        text = original(module, rung)
        return text.replace("a compile of", "a compile, of") if module == "compile_connector" else text

    monkeypatch.setattr(patchset, "render_module", changed)
    for base_name in series.BASES:
        problems = patchset.check(patchset.Base(None), base_name)
        assert any("compile_connector.py differs" in p for p in problems), base_name


def test_drift_in_a_lightning_fix_is_detected(monkeypatch):
    import lightning

    if lightning.__version__ != "2.6.6":
        pytest.skip(f"the installed Lightning is {lightning.__version__}, not the 2.6.6 base")
    original = patchset.fixed_source
    monkeypatch.setattr(patchset, "fixed_source", lambda edit, rung="": original(edit, rung) + "    # drift\n")
    problems = patchset.check(patchset.InstalledLightning(), "2.6.6")
    assert any("utilities/compile.py differs" in p for p in problems)
    assert any("strategies/strategy.py differs" in p for p in problems)


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
        for patch in (series.REAPPLY, series.USE_COMPILE, series.FEATURE_SEAM)  # the seam adds `on_run_start`
        for edit in patch.edits
        if edit.path == series.TRAINER
        for line in edit.new.splitlines()
    )
    # the calls themselves, parsed: a substring such as "compile" would match `_compile_connector` anywhere
    upstream_calls = set(re.findall(r"self\._compile_connector\.(\w+)\(", added))
    package_calls = _connector_calls((ROOT / "src/lightning_compile_patch/_monkeypatch/patch.py").read_text())
    # (the monkeypatch compiles after `strategy.setup` by replacing it for the run, through the run's `replace`)
    assert upstream_calls == package_calls == {"verify_strategy", "unwrap", "on_run_start", "compile", "teardown"}
    assert "self._compile_connector = _CompileConnector(self, use_compile)" in added


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


@pytest.mark.parametrize("base_name", series.BASES)
def test_every_rung_on_the_core_alone_leaves_importable_code(base_name, tmp_path):
    """The core with any one feature module, as a maintainer may take it, has no undefined or unused name."""
    pytest.importorskip("ruff")
    for patch in series.series(base_name)[len(series.CORE_STACK) :]:
        folder = tmp_path / patch.modules[0]
        folder.mkdir()
        for module in ("compile_connector", patch.modules[0]):
            (folder / f"{module}.py").write_text(patchset.render_module(module))
        result = subprocess.run(
            [sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F,E9", str(folder)],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stdout


def test_the_package_is_the_last_rung_one_program_a_file():
    """No file of the package holds lines of another rung: the last rung's files are the package's, as they are."""
    for path in patchset.PACKAGE_DIR.rglob("*.py"):
        assert "# [ladder" not in path.read_text(), path
    for module in patchset.UPSTREAM_MODULES:
        assert patchset.source_file(module) == patchset.upstream_modules.module_path(module)


def test_each_earlier_rung_file_is_one_a_patch_takes_and_differs_from_the_package():
    rungs = {patch.rung: patch for base_name in series.BASES for patch in series.series(base_name) if patch.rung}
    files = sorted(patchset.RUNGS.rglob("*.py"))
    assert files, patchset.RUNGS
    for path in files:
        rung = path.relative_to(patchset.RUNGS).parts[0]
        relative = path.relative_to(patchset.RUNGS / rung)
        patch = rungs[rung]
        module = ".".join(relative.with_suffix("").parts)
        fixes = {edit.name for edit in patch.edits if isinstance(edit, series.ReplaceDef)}
        assert module in patch.modules or (module == "lightning_fixes" and fixes), path
        assert path.read_text() != (patchset.PACKAGE_DIR / relative).read_text(), f"{path} is the package's own"
    # the patch takes the rung's own version: the re-apply rung's connector has no `use_compile`
    assert "use_compile" not in patchset.render_module("compile_connector", "reapply")
    assert "use_compile" in patchset.render_module("compile_connector", "use_compile")
    reapply_fix = next(e for e in series.REAPPLY.edits if isinstance(e, series.ReplaceDef))
    assert "use_compile" not in patchset.fixed_source(reapply_fix, "reapply")
    assert "use_compile" in patchset.fixed_source(reapply_fix)


#: The functions an earlier rung defines otherwise than the package, and why. Every other function a rung file shares
#: with the package must be the package's, so that a fix made in the package is made in the rung too.
RUNG_DIFFERENCES = {
    "reapply/lightning_fixes.py": {"_verify_strategy_can_compile": "its message names no `use_compile`"},
    "reapply/compile_connector.py": {
        "_CompileConnector.__init__": "no argument: nothing parsed, nothing to undo",
        "_CompileConnector.unwrap": "keeps a compiled model's arguments only",
        "_CompileConnector.compile": "re-applies a compiled model's compile, with no seam",
    },
    "use_compile/compile_connector.py": {
        "_CompileConnector.__init__": "no features",
        "_CompileConnector.verify_strategy": "no features to verify",
        "_CompileConnector.unwrap": "no features",
        "_CompileConnector.compile": "no seam: compiles the steps, with no feature hooks",
        "_CompileConnector.teardown": "its own undo list, not the run's",
        "_parse_use_compile": "torch's keys only, no feature keys",
        "_check_compile_kwargs": "the seam rung adds the checks of arguments newer torch versions take unchecked",
    },
}


def _functions(path: Path) -> dict[str, str]:
    """Each function of a module, by qualified name (``Class.method``), as its syntax tree."""
    functions: dict[str, str] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef):
                functions[prefix + node.name] = ast.dump(node)
            elif isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")

    visit(ast.parse(path.read_text()).body, "")
    return functions


def test_each_function_an_earlier_rung_shares_with_the_package_is_the_packages_unless_declared():
    found: dict[str, dict[str, str]] = {}
    for path in sorted(patchset.RUNGS.rglob("*.py")):
        rung_file = path.relative_to(patchset.RUNGS).as_posix()
        ours = _functions(patchset.PACKAGE_DIR / Path(rung_file).relative_to(Path(rung_file).parts[0]))
        theirs = _functions(path)
        differ = {name for name in theirs if name in ours and theirs[name] != ours[name]}
        assert differ == set(RUNG_DIFFERENCES.get(rung_file, {})), (
            f"{rung_file}: functions that differ from the package's without a reason in RUNG_DIFFERENCES, or declared"
            " but now equal; make the package's fix in the rung too, or declare why the rung differs"
        )
        found[rung_file] = {name for name in theirs if name in ours and theirs[name] == ours[name]}
    assert found["use_compile/compile_connector.py"], "the use_compile rung shares functions with the package"


def test_the_seam_runs_one_way_the_connector_imports_the_features_and_no_feature_imports_the_connector():
    for module in patchset.UPSTREAM_MODULES:
        if module.startswith("compile_features"):
            tree = ast.parse(patchset.upstream_modules.module_path(module).read_text())
            imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
            assert "lightning_compile_patch.compile_connector" not in imported, module
