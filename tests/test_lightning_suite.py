"""Smoke checks of tools/lightning_suite/run.py's bookkeeping: the runs of Lightning's own tests are its nox session."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))

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
        "recompile_limit_hits": [],
    }
    stock = {"t::a": record("t::a", "passed")}
    table, wrong = run.report({"stock": stock, "compiled": {"t::a": record("t::a", "passed", [summary])}}, {}, {}, "x")
    assert not wrong
    assert "| 1 | 1 | training 3 | training 2 | 1 | 0 | 1 |" in table
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
