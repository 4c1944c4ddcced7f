"""Smoke checks of tools/lightning_suite/run.py's bookkeeping: the runs of Lightning's own tests are its nox session."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))  # tools/

from lightning_suite import run


def record(nodeid: str, outcome: str, runs: list | None = None) -> dict:
    return {"nodeid": nodeid, "outcome": outcome, "error": None if outcome == "passed" else "E: x", "runs": runs or []}


def test_compare_sorts_new_failures_expected_and_stale(tmp_path: Path) -> None:
    listed = tmp_path / "expected.txt"
    listed.write_text("# header\ncompiled t::expected  # a reason\n* t::stale  # another\n")
    expected = run.load_expected(listed)
    base = {n: record(n, "passed") for n in ("t::same", "t::new", "t::expected", "t::stale")}
    base |= {"t::both": record("t::both", "failed"), "t::fixed": record("t::fixed", "error")}
    other = {**base, "t::new": record("t::new", "failed"), "t::expected": record("t::expected", "error")}
    other["t::fixed"] = record("t::fixed", "passed")
    result = run.compare(base, other, "compiled", expected)
    assert result.new_failures == ["t::new"]
    assert result.expected == ["t::expected"]
    assert result.stale == ["t::stale"]
    assert result.new_passes == ["t::fixed"]
    assert result.fails_both == ["t::both"]
    assert run.compare(base, other, "regions", expected).new_failures == ["t::expected", "t::new"]


def test_report_fails_on_a_new_failure_and_counts_steps() -> None:
    summary = {
        "fn": "fit",
        "compiled": True,
        "recompiles": 1,
        "compiled_steps": {"training": 3},
        "eager_steps": {"training": 2},
        "eager_causes": {"a cause": 2},
        "parts_steps": {"evaluation": 4},
        "recompile_limit_hits": [],
    }
    stock = {"t::a": record("t::a", "passed")}
    table, wrong = run.report({"stock": stock, "compiled": {"t::a": record("t::a", "passed", [summary])}}, {}, {}, "x")
    assert not wrong
    assert "| 1 | 1 | training 3 | evaluation 4 | training 2 | 1 | 0 | 1 |" in table
    assert "| a cause | 2 | 1 |" in table
    _, wrong = run.report({"stock": stock, "compiled": {"t::a": record("t::a", "failed")}}, {}, {}, "x")
    assert wrong


def test_records_of_a_worker_win_over_the_controllers(tmp_path: Path) -> None:
    (tmp_path / "controller-1.jsonl").write_text('{"nodeid": "t::a", "outcome": "failed", "runs": []}\n')
    (tmp_path / "gw0-2.jsonl").write_text('{"nodeid": "t::a", "outcome": "passed", "runs": [{"fn": "fit"}]}\n')
    (tmp_path / "gw1-3.jsonl").write_text("")
    assert run.load_records(tmp_path)["t::a"]["outcome"] == "passed"
    (tmp_path / "gw0-2.jsonl").write_text("")  # the worker crashed: the controller's record is all there is
    assert run.load_records(tmp_path)["t::a"]["outcome"] == "failed"


def test_stock_where_failed_runs_stock_on_the_failures_alone_and_still_finds_a_new_one(tmp_path: Path) -> None:
    # CI runs stock only where another mode failed (`--stock-where-failed`): a test that failed compiled and passes
    # stock must still be a new failure, one that fails both must not, and what passed compiled needs no stock run
    outcomes = {"new": "failed", "both": "error", "fine": "passed", "listed": "passed"}
    (tmp_path / "records" / "compiled").mkdir(parents=True)
    lines = [
        f'{{"nodeid": "tests/t.py::{name}", "outcome": "{outcome}", "runs": []}}' for name, outcome in outcomes.items()
    ]
    (tmp_path / "records" / "compiled" / "gw0-1.jsonl").write_text("\n".join(lines) + "\n")
    expected = {("compiled", "tests/t.py::listed"): "a reason", ("*", "tests/t.py::elsewhere"): "not in this selection"}
    only = run.failed_elsewhere(tmp_path, ["stock", "compiled"], expected)
    assert only == ["t.py::both", "t.py::listed", "t.py::new"]  # as pytest takes them, from tests/
    stock = {n: record(n, "passed") for n in ("tests/t.py::new", "tests/t.py::listed")}
    stock["tests/t.py::both"] = record("tests/t.py::both", "failed")
    compiled = run.load_records(tmp_path / "records" / "compiled")
    result = run.compare(stock, compiled, "compiled", expected, stock_where_failed=True)
    assert result.new_failures == ["tests/t.py::new"]
    assert result.fails_both == ["tests/t.py::both"]
    assert result.stale == ["tests/t.py::listed"]
    assert result.stock_not_run == ["tests/t.py::fine"]
    assert result.missing == []
    _, wrong = run.report({"stock": stock, "compiled": compiled}, {}, expected, "x", stock_where_failed=True)
    assert wrong


def test_the_plugin_reads_the_summary_of_a_compiled_run_and_none_of_an_uncompiled_one(tmp_path: Path) -> None:
    # the record's "compiled" and step counts come from here: the summary moved from the connector to the summary
    # module, and an old reader found none for every run
    import lightning_compile_patch  # noqa: F401
    from lightning.pytorch import Trainer
    from lightning.pytorch.demos.boring_classes import BoringModel
    from lightning_suite import plugin

    quiet = {"max_steps": 2, "limit_val_batches": 0, "logger": False, "enable_checkpointing": False}
    quiet |= {"enable_progress_bar": False, "enable_model_summary": False, "default_root_dir": tmp_path}
    plain = Trainer(**quiet)
    plain.fit(BoringModel())
    assert plugin._summary_of(plain) is None
    compiled = Trainer(use_compile={"backend": "eager"}, **quiet)
    compiled.fit(BoringModel())
    summary = plugin._summary_of(compiled)
    assert summary is not None
    assert summary.compiled_steps["training"] == 2
