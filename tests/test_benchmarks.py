"""Smoke test of ``benchmarks/bench.py``: every path runs, and every number the report needs is there.

Benchmarks measure and do not assert; this only checks that the tool works (``--smoke``: a tiny GPT, backend
``aot_eager``, a few steps, one strategy), writing into a temporary directory rather than ``docs/``.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "bench.py"
REQUIRED = ("eager", "stock", "whole", "regional", "cache_cold", "cache_warm", "plain_loop")
COMPILED = ("stock", "whole", "regional", "cache_cold", "cache_warm", "plain_loop")
METRICS = ("first_step_s", "steady_step_ms", "tokens_per_s", "peak_memory_mib")
COUNTS = ("graphs", "recompiles", "graph_breaks_other", "graph_breaks_intentional")


@pytest.mark.slow
@pytest.mark.package_only  # the benchmarks import the package; the run against a patched Lightning has none
def test_bench_smoke_runs_every_path_in_a_fresh_process_and_reports_it(tmp_path):
    out = tmp_path / "out"
    parent_cache = tmp_path / "parent-inductor-cache"  # must not reach any benchmark process
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(parent_cache)}
    command = [sys.executable, str(BENCH), "--smoke", "--strategies", "auto", "--out", str(out)]
    command += ["--workdir", str(tmp_path / "work")]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]

    data = json.loads((out / "smoke.json").read_text())
    assert data["complete"]
    assert data["machine"]["torch"]
    assert data["machine"]["lightning"]
    assert data["command"]
    runs = {r["name"]: r for r in data["results"]}
    assert set(REQUIRED) <= set(runs), sorted(runs)
    for name in REQUIRED:
        run = runs[name]
        assert run["status"] == "ok", (name, run.get("error"))
        for metric in METRICS:
            assert run[metric] > 0, (name, metric, run[metric])
        for count in COUNTS:
            assert isinstance(run[count], int), (name, count)
            assert run[count] >= 0, (name, count)
        # a fresh process each, and never the parent's inductor cache
        assert str(parent_cache) != run["inductor_dir_at_start"], name
    assert len({r["pid"] for r in runs.values()}) == len(runs)
    for name in ("cache_cold", "cache_warm"):
        assert runs[name]["inductor_dir_at_start"] is None  # the package points inductor at the cache dir itself
    for name in set(REQUIRED) - {"cache_cold", "cache_warm"}:
        assert runs[name]["inductor_dir_at_start"].startswith(str(tmp_path / "work"))
    # importing lightning in bench.py itself may create the directory, but nothing may be written into it
    assert not parent_cache.exists() or not any(parent_cache.iterdir())

    assert runs["eager"]["graphs"] == 0
    for name in COMPILED:
        assert runs[name]["graphs"] >= 1, name
    assert runs["regional"]["graph_breaks_intentional"] >= 1  # the region boundaries, counted apart
    assert runs["whole"]["compile_summary"]["graphs"] >= 1
    assert runs["stock"]["steady_vs_stock"] == pytest.approx(1.0)
    assert runs["plain_loop"]["steady_vs_plain_loop"] == pytest.approx(1.0)
    assert runs["whole"]["first_step_vs_whole"] == pytest.approx(1.0)

    table = (out / "smoke.md").read_text()
    for name in REQUIRED:
        assert f"`{name}`" in table
