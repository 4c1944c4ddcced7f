"""Smoke tests of ``benchmarks/``: the harness, the arithmetic of each table, and every command the docs name.

Benchmarks measure and do not assert; these check the tools, in well under a minute: one short ``bench.py --smoke`` run
(a tiny GPT, backend ``aot_eager``, three paths, each in a fresh process) into a temporary directory; each script's
table computed from hand-made results, where every ratio is known; the GPU probe on CPU; and the commands that
``docs/`` and ``gpu_session.sh`` name, which must exist with the options they pass.
"""

import ast
import importlib.util
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
PROBE = ROOT / "docs" / "repros" / "regions_gpu_probe.py"
GPU_SESSION = BENCHMARKS / "gpu_session.sh"
SMOKE_PATHS = ("stock", "whole", "plain_loop")
MACHINE = {"cpu": "a CPU", "usable_cores": 2, "load_average_at_start": [1.0], "platform": "Linux", "python": "3.11"}
MACHINE.update(torch="2.13.0", lightning="2.6.6", cuda=None, gpu=None)


def benchmark_script(name):
    """A script of ``benchmarks/``, imported (it imports the package)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))


def options_of(script):
    """The options a script's argument parser defines, read from its source."""
    return set(re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", script.read_text()))


def constant(script, name):
    """A module-level tuple or dict of literals in a script, read from its source."""
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{script} has no {name}")


@pytest.mark.slow
def test_bench_smoke_runs_each_path_in_a_fresh_process_and_reports_it(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    parent_cache = tmp_path / "parent-inductor-cache"  # must not reach any benchmark process
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(parent_cache)}
    command = [sys.executable, str(BENCHMARKS / "bench.py"), "--smoke", "--paths", ",".join(SMOKE_PATHS)]
    command += ["--steps", "3", "--out", str(out), "--workdir", str(work)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]

    data = json.loads((out / "smoke.json").read_text())
    assert data["complete"]
    assert data["command"].startswith("python benchmarks/bench.py --smoke")
    runs = {r["name"]: r for r in data["results"]}
    assert set(runs) == set(SMOKE_PATHS)
    for name, run in runs.items():
        assert run["status"] == "ok", (name, run.get("error"))
        assert len(run["step_times_ms"]) == 3, name
        assert min(run["first_step_s"], run["steady_step_ms"], run["peak_memory_mib"]) > 0, name
        assert run["graphs"] >= 1, name  # every one of these paths compiles
        # each in its own fresh process, with its own new inductor cache, never the parent's
        assert run["inductor_dir_at_start"] == str(work / run["strategy"] / name / "inductor"), name
    assert len({r["pid"] for r in runs.values()}) == len(runs)
    assert not parent_cache.exists() or not any(parent_cache.iterdir())
    # the three paths train the same seeded model on the same data: the same last loss
    losses = {name: run["final_loss"] for name, run in runs.items()}
    assert losses["whole"] == pytest.approx(losses["plain_loop"], rel=1e-5), losses
    assert losses["stock"] == pytest.approx(losses["plain_loop"], rel=1e-5), losses
    assert runs["whole"]["compile_summary"]["graphs"] == runs["whole"]["graphs"]
    # each ratio against the right baseline, computed here from the raw times
    whole, stock, plain = runs["whole"], runs["stock"], runs["plain_loop"]
    assert whole["steady_vs_stock"] == pytest.approx(whole["steady_step_ms"] / stock["steady_step_ms"])
    assert whole["steady_vs_plain_loop"] == pytest.approx(whole["steady_step_ms"] / plain["steady_step_ms"])
    assert stock["first_step_vs_whole"] == pytest.approx(stock["first_step_s"] / whole["first_step_s"])
    table = (out / "smoke.md").read_text()
    for name, run in runs.items():
        row = next(line for line in table.splitlines() if line.startswith(f"| `{name}`"))
        assert f"| {run['steady_step_ms']:.1f} ms |" in row, name


def bench_result(name, strategy, steady_ms, first_s, **extra):
    counts = {"graphs": 1, "recompiles": 0, "graph_breaks_other": 0, "graph_breaks_intentional": 0}
    row = {"name": name, "strategy": strategy, "status": "ok", "steady_step_ms": steady_ms, "first_step_s": first_s}
    return {**row, "tokens_per_s": 1000.0, "peak_memory_mib": 100.0, "final_loss": 1.5, **counts, **extra}


def test_bench_table_compares_each_path_with_its_own_strategys_baselines():
    bench = benchmark_script("bench")
    results = [
        bench_result("stock", "auto", 10.0, 4.0),
        bench_result(
            "whole", "auto", 8.0, 2.0, graph_breaks_other=1, compile_summary={"graph_breaks": 3, "expected_breaks": 2}
        ),
        bench_result("regional", "auto", 12.0, 1.0),
        {"name": "stock_logging", "strategy": "auto", "status": "error", "error": "InternalTorchDynamoError: x | y"},
        bench_result("whole", "ddp", 9.0, 3.0),
        bench_result("plain_loop", "none", 16.0, 5.0),
    ]
    bench.ratios(results)
    auto_whole, regional, ddp_whole = results[1], results[2], results[4]
    assert auto_whole["steady_vs_stock"] == pytest.approx(0.8)
    assert auto_whole["steady_vs_plain_loop"] == pytest.approx(0.5)
    assert regional["first_step_vs_whole"] == pytest.approx(0.5)
    assert ddp_whole["steady_vs_stock"] is None  # no stock under ddp: never another strategy's stock
    assert ddp_whole["first_step_vs_whole"] == pytest.approx(1.0)
    data = {"stem": "cpu", "mode": "cpu", "command": "python benchmarks/bench.py", "date": "today", "steps": 4}
    data.update(machine=MACHINE, description="a GPT", warmup=1, backend="inductor", results=results, complete=True)
    auto, ddp = bench.markdown(data).split('## DDP, world size 1 (`strategy="ddp"`)')
    whole_row = next(line for line in auto.splitlines() if line.startswith("| `whole`"))
    assert "| 8.0 ms |" in whole_row
    assert "| 1 (1) |" in whole_row  # 3 breaks in the run summary, 2 of them expected
    assert "| 0.80x | 0.50x | 1.00x |" in whole_row
    assert "failed: InternalTorchDynamoError: x \\| y" in auto
    assert "| `plain_loop` (no strategy) | 5.00 s | 16.0 ms |" in auto
    assert "| `plain_loop` (no strategy) |" in ddp
    assert "| — | 0.56x | 1.00x |" in next(line for line in ddp.splitlines() if line.startswith("| `whole`"))


def test_optimize_ddp_and_regions_depth_and_zero_cost_and_host_cost_tables_from_known_numbers():
    optimize_ddp = benchmark_script("optimize_ddp")
    ok = {"status": "ok", "graphs": 1, "graph_breaks_other": 0, "first_step_s": 1.0}
    results = {
        "optimize_ddp=True@2": {**ok, "steady_step_ms": 50.0, "steady_backward_ms": 30.0},
        "optimize_ddp=False@2": {**ok, "steady_step_ms": 52.0, "steady_backward_ms": 30.0},
        "eager@2": {**ok, "steady_step_ms": 65.0, "steady_backward_ms": 40.0},
        "optimize_ddp=False@1": {**ok, "steady_step_ms": 36.0, "steady_backward_ms": 16.0},
        "eager@1": {**ok, "steady_step_ms": 35.0, "steady_backward_ms": 17.0},
        "allreduce": {"status": "ok", "allreduce_ms": 10.0, "allreduce_min_ms": 7.0, "megabytes": 13.2},
    }
    results["optimize_ddp=False@2"]["ddp_reducer_buckets"] = {"bucket_bytes": [4_000_000, 5_000_000, 4_000_000]}
    model = optimize_ddp.paper_model(results)
    assert model["B"] == 3
    assert model["hideable_compiled_ms"] == pytest.approx(10.0 - 10.0 / 3)  # min(A, T) - A/B, T = 16 ms
    assert model["measured_saving_ms"] == pytest.approx(2.0)
    row = optimize_ddp._row(results, 2, "optimize_ddp=True")
    assert row[3:5] == ["0.962x", "0.769x"]  # against False and against eager, of the same world size
    combined = benchmark_script("harness").combine(
        [{**ok, "steady_step_ms": t} for t in (3.0, 1.0, 2.0)] + [{"status": "error"}]
    )
    assert (combined["steady_step_ms"], combined["repeats_ok"], combined["repeats"]) == (2.0, 3, 4)

    regions_depth = benchmark_script("regions_depth")
    depth = {"depths": [12], "toolchains": ["empty"], "results": {}}
    depth["results"]["whole-12"] = {**ok, "first_step_s": 30.0, "steady_step_ms": 40.0, "parameters": 640_000}
    depth["results"]["regional-12"] = {**ok, "first_step_s": 15.0, "steady_step_ms": 46.0, "graphs": 7}
    cells = regions_depth._row(depth, 12, "empty")
    assert cells[2:9] == ["0.64M", "30.0 s", "15.0 s", "0.50x", "40.0 ms", "46.0 ms", "1.15x"]
    assert cells[9] == "1 / 7"

    regions_hf = benchmark_script("regions_hf")
    summary = {"graphs": 37, "recompiles": 2, "recompile_limit_hits": [], "compiled_steps": {"training": 8}}
    hf = regions_hf.new_report("regions_hf", [], layers=32, steps=8, warmup=3, accelerator="cpu", results={})
    hf["results"]["whole"] = {**ok, "first_step_s": 60.0, "steady_step_ms": 50.0, "compile_summary": summary}
    hf["results"]["regional"] = {**ok, "first_step_s": 20.0, "steady_step_ms": 55.0, "compile_summary": summary}
    row = next(line for line in regions_hf.markdown(hf).splitlines() if line.startswith("| regional |"))
    assert row == "| regional | 20.0 s | 0.33x | 55.0 ms | 1.10x | 37 | 2 | 0 | 8 / 0 |"

    compiled_autograd = benchmark_script("compiled_autograd")
    notes = {"notes": ["compiled autograd: 2 backward graphs compiled"]}
    results = {"whole@2": {**ok, "steady_step_ms": 40.0}, "compiled_autograd@2": {**ok, "steady_step_ms": 30.0}}
    results["compiled_autograd@2"].update(graphs=3, compile_summary=notes, final_loss=4.25)
    row = compiled_autograd._row(results, 2, "compiled_autograd")
    assert row == [2, "`compiled_autograd`", "30.0 ms", "0.750x", "1.0 s", 3, notes["notes"][0], "4.2500"]

    zero_cost = benchmark_script("zero_cost")
    samples = {"patched": [{"construct_ms": 2.0, "fit_ms": 5.0}] * 3, "removed": [{"construct_ms": 4.0, "fit_ms": 5.0}]}
    samples["removed"] = samples["removed"] * 3
    summary = zero_cost.summarize(samples)
    assert summary["construct_ms"]["ratio_of_medians"] == pytest.approx(0.5)
    assert summary["fit_ms"]["median_paired_ratio"] == pytest.approx(1.0)

    host_cost = benchmark_script("host_cost")
    p10 = dict.fromkeys(host_cost.paths(), 1000.0)
    p10.update({"plain loop, eager": 200.0, "plain loop, `torch.compile`": 300.0, "Lightning, eager": 1000.0})
    p10.update({"Lightning, `fit(torch.compile(m))`": 900.0, "`use_compile=True`": 850.0})
    p10.update({"`use_compile`, every own key off": 810.0, "`use_compile`, only `summary` on": 830.0})
    calls = dict.fromkeys(host_cost.paths(), 1000.0)
    calls.update({"plain loop, eager": 100.0, "Lightning, eager": 1100.0, "`use_compile=True`": 1030.0})
    calls.update({"`use_compile`, only `summary` on": 1010.0})
    report = host_cost.new_report("host_cost", [], rounds=1, key_rounds=1, steps=9, sampled_steps=9)
    paired = [[900.0, 810.0, 818.1], [850.0, 800.0, 840.0], [800.0, 820.0, 820.0]]  # keys: 1.01, 1.05, 1.00
    text = host_cost.markdown({**report, "p10_us": p10, "calls": calls, "paired_us": paired})
    assert "| `use_compile=True` | 850 | 0.85x | 1030 |" in text
    assert "Lightning's own compiled path: 0.94x; against the plain compiled loop: +550 µs" in text
    assert "run to run, +30 calls per step, 3.0% of the 1000 that Lightning's loop adds" in text
    assert "In the table's times, +40 µs, 5.0% of what the loop adds" in text
    assert "| summary | +10 |" in text
    assert "| `use_compile=True` / every own key off | 1.010 (1.000 to 1.050) | 1.023 |" in text
    assert "| `use_compile=True` / Lightning's own `fit(torch.compile(m))` | 0.988 (0.909 to 1.025) | 1.023 |" in text
    assert "every key off, +8 µs per step, 1.0% of what Lightning's loop adds" in text
    assert "sampled: not measured (`pip install py-spy` to measure it, where it can attach)." in text

    loop = "_TrainingEpochLoop.run (site-packages/lightning/pytorch/loops/training_epoch_loop.py:153)"
    summary = "call (src/lightning_compile_patch/compile_features/summary.py:417)"
    seam = "step (src/lightning_compile_patch/compile_features/_run.py:133)"
    compiling = "_compile (torch/_dynamo/convert_frame.py:1200)"
    raw = "\n".join(
        [
            f"main (x.py:1);{loop};{summary} 2",  # the package's own frame, innermost: counted for its file
            f"main (x.py:1);{loop};{summary};{seam};step (torch/optim/sgd.py:9) 6",  # torch's, innermost
            f"main (x.py:1);{loop};{seam};{compiling};{summary} 5",  # compiling: not a steady sample
            f"main (x.py:1);{loop};backward (x.py:2);compile_fx (torch/_inductor/compile_fx.py:9) 4",  # a lazy backward
            f"main (x.py:1);{summary} 7",  # outside the training loop
            "<module> (site-packages/lightning/pytorch/loops/training_epoch_loop.py:1) 3",  # its import: not the loop
            f"main (x.py:1);{loop};{seam} 2",
        ]
    )
    assert host_cost.sampled_shares(raw) == {"steps": 10.0, "summary": 0.2, "_run": 0.2}
    sampled = {"`use_compile=True`": {"steps": 1000.0, "summary": 0.02, "_run": 0.005}}
    sampled["`use_compile`, every own key off"] = {"steps": 900.0, "_run": 0.01}
    text = host_cost.markdown({**report, "p10_us": p10, "calls": calls, "paired_us": paired, "sampled": sampled})
    assert "| `summary.py` | 2.00% | 0.00% |\n| `_run.py` | 0.50% | 1.00% |" in text
    assert "The keys' own share, guards included: 1.50% of a step, +13 µs at the table's" in text
    assert "1.6% of what Lightning's loop adds to the plain eager loop." in text


def test_guard_check_table_from_known_numbers():
    """What ``in_parts`` adds to the guard check per module it compiles: every ``Linear``, against every key off."""
    guard_check = benchmark_script("guard_check")
    names = list(guard_check.PATHS)
    data = guard_check.new_report("guard_check", [], checks=9)
    one, ten = (2.0, 2.0, 3.0, 3.2), (5.0, 5.1, 7.3, 7.5)
    data["guard_us"] = {"1": dict(zip(names, one, strict=True)), "10": dict(zip(names, ten, strict=True))}
    text = guard_check.markdown(data)
    assert "| 1 | 2 | 2.00 | 2.00 | 3.00 | 3.20 | +0.50 |" in text
    assert "| 10 | 11 | 5.00 | 5.10 | 7.30 | 7.50 | +0.20 |" in text
    assert names[1] == "`use_compile`, every own key off"
    assert names[2] == "`use_compile`, only `in_parts` on"


@pytest.mark.slow
def test_gpu_probe_runs_the_session_designs_on_cpu_with_the_same_loss(tmp_path):
    """The probe ``gpu_session.sh`` runs, on CPU with ``aot_eager``: the regional design trains to the whole's loss."""
    spec = importlib.util.spec_from_file_location("regions_gpu_probe", PROBE)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    args = SimpleNamespace(device="cpu", backend="aot_eager", layers=2, steps=2)
    rows = {v: probe.run(v, args, tmp_path / "profile") for v in ("whole", "regions+rest+step")}
    losses = {v: float(row.strip(" |").split("|")[-1]) for v, row in rows.items()}
    assert losses["regions+rest+step"] == pytest.approx(losses["whole"], rel=1e-5)
    assert {p.name for p in (tmp_path / "profile").iterdir()} >= {"whole.txt", "regions+rest+step.json"}


def named_commands():
    """Every ``python benchmarks/...`` or ``python docs/repros/...`` command in the docs and the GPU session."""
    texts = [p.read_text() for p in (ROOT / "README.md", *ROOT.glob("docs/**/*.md"))]
    commands = [c for text in texts for c in re.findall(r"`(python (?:benchmarks|docs/repros)/[^`]+)`", text)]
    session = GPU_SESSION.read_text().replace("\\\n", " ").replace('"$NOTE"', "note")
    commands += [line.split(None, 3)[3] for line in session.splitlines() if line.startswith("part ")]
    return [c for c in commands if c.startswith("python ") and " -c " not in c and " -m " not in c]


def test_every_command_the_docs_and_the_gpu_session_name_exists_with_its_options():
    """The measured figures stay reproducible by the commands next to them; ``gpu_session.sh`` waits for a GPU."""
    subprocess.run(["bash", "-n", str(GPU_SESSION)], check=True)
    commands = named_commands()
    assert any("gpu_session" not in c and "bench.py --mode cpu" in c for c in commands), commands
    assert sum("docs/repros/regions_gpu_probe.py" in c for c in commands) >= 3, commands  # the docs' two, the session's
    for command in commands:
        script, *arguments = shlex.split(command)[1:]
        assert (ROOT / script).is_file(), command
        given = {argument.split("=")[0] for argument in arguments if argument.startswith("--")}
        assert given <= options_of(ROOT / script) | {"--help"}, command
        values = dict(itertools.pairwise(arguments))
        if "--variants" in values:  # each a design of the probe, with an optional /MODE
            designs = constant(PROBE, "DESIGNS")
            assert all(v.partition("/")[0] in designs for v in values["--variants"].split(",")), command
        for option, names in (("--paths", "PATHS"), ("--strategies", "STRATEGIES")):
            if option in values:
                assert set(values[option].split(",")) <= set(constant(ROOT / script, names)), command


def test_after_the_wrap_counts_ddp_code_that_runs_as_python_even_where_dynamo_compiles_around_it():
    """``after_the_wrap.py`` counts DDP's own frames with a profile function, which Dynamo cannot fold away.

    The bug it replaced: a counting wrapper patched onto DDP's class, which checked ``is_compiling()``. Called from
    DDP's eager forward, the wrapper was compiled as a frame of its own and its check folded, so it counted 0 while
    ``_pre_forward`` ran as Python at every step, and the docs said DDP's pre- and post-forward were traced.

    """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    python_frames = benchmark_script("after_the_wrap").python_frames

    def inner(x):
        return x * 2

    def outer(x):
        y = inner(x) + 1
        torch._dynamo.graph_break()
        return y * 3

    compiled = torch.compile(outer, backend="eager")
    compiled(torch.ones(2))
    with python_frames({inner.__code__: "inner", outer.__code__: "outer"}) as calls:
        for _ in range(3):
            compiled(torch.ones(2))
    assert calls == {"inner": 0, "outer": 0}  # traced (around a graph break too): not counted

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(torch.nn.Linear(4, 1))
        ddp.compile(backend="eager")  # the wrapper itself, as the Trainer compiles it after the wrap
        codes = {DistributedDataParallel._pre_forward.__code__: "_pre_forward"}
        ddp(torch.ones(2, 4)).sum().backward()
        with python_frames(codes) as calls:
            for _ in range(3):
                ddp(torch.ones(2, 4)).sum().backward()
    finally:
        dist.destroy_process_group()
        torch._dynamo.reset()
    assert calls == {"_pre_forward": 3}  # torch keeps DDP's own forward out of the graph (`_inside_ddp_forward`)
