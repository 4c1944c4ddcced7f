"""Smoke tests of ``benchmarks/``: every path of ``bench.py`` runs and reports; the GPU probe and session are sound.

Benchmarks measure and do not assert; these only check that the tools work (``--smoke``: a tiny GPT, backend
``aot_eager``, a few steps, one strategy), writing into a temporary directory rather than ``docs/``. The GPU probe runs
on CPU, where its designs must agree on the loss; the prepared GPU session is checked for what can be checked without
a GPU: its syntax and the options it passes.
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


PROBE = ROOT / "benchmarks" / "regions_gpu_probe.py"
GPU_SESSION = ROOT / "benchmarks" / "gpu_session.sh"
PROBE_VARIANTS = ("whole", "regions+rest+step", "regions+step", "regions-eager-step", "block.compile()")


@pytest.mark.slow
@pytest.mark.package_only
def test_gpu_probe_runs_every_design_on_cpu_with_the_same_loss(tmp_path):
    """The GPU probe, run on CPU with ``aot_eager``: every regional design trains to the whole model's loss."""
    command = [sys.executable, str(PROBE), "--device", "cpu", "--backend", "aot_eager", "--layers", "2"]
    command += ["--steps", "4", "--variants", ",".join(PROBE_VARIANTS), "--profile", str(tmp_path / "profile")]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = {}
    for line in result.stdout.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0] in PROBE_VARIANTS:
            rows[cells[0]] = float(cells[-1])
    assert set(rows) == set(PROBE_VARIANTS), result.stdout
    for variant, loss in rows.items():
        assert loss == pytest.approx(rows["whole"], rel=1e-4), variant
    assert {p.name for p in (tmp_path / "profile").iterdir()} >= {"whole.txt", "regions+rest+step.json"}


@pytest.mark.package_only
def test_gpu_session_script_calls_only_options_the_scripts_have():
    """``gpu_session.sh`` waits for a GPU; until then, its syntax and every option it passes are checked here."""
    subprocess.run(["bash", "-n", str(GPU_SESSION)], check=True)
    text = GPU_SESSION.read_text().replace("\\\n", " ")
    calls = [line.split("python ", 1)[1] for line in text.splitlines() if "python benchmarks/" in line]
    calls += [line.split("python ", 1)[1] for line in text.splitlines() if "python examples/" in line]
    assert len(calls) >= 4, calls
    for call in calls:
        script, *arguments = call.split()
        options = {argument for argument in arguments if argument.startswith("--")}
        assert (ROOT / script).exists(), script
        helptext = subprocess.run(
            [sys.executable, str(ROOT / script), "--help"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        missing = [option for option in options if option not in helptext]
        assert not missing, (script, missing)
