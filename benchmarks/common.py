"""What the benchmark scripts share: the run description, fresh processes, machine facts, and the report files.

Every measured configuration runs in a fresh Python process (``benchmarks/worker.py``), so that its first step pays
the whole compile and nothing of an earlier configuration (Dynamo's caches, inductor's in-memory caches, a process
group) is still around. Each process gets a new, empty ``TORCHINDUCTOR_CACHE_DIR``: the parent's value never reaches
it, so a warm cache on the machine cannot make a cold start look fast.

This module imports neither torch nor Lightning at the top, so that ``--dry-run`` prints its plan at once.

"""

import dataclasses
import importlib
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
DOCS_DIR = ROOT / "docs"
RESULTS_DIR = DOCS_DIR / "benchmarks"
INDEX = DOCS_DIR / "benchmarks.md"
WORKER = BENCH_DIR / "worker.py"

#: Environment variables that point torch's compilers at an on-disk cache. A fresh process gets none of the parent's.
CACHE_ENV = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
#: Markers of expected graph breaks (in DDP's own code, at region boundaries): the package's own list.
EXPECTED_BREAKS = importlib.import_module("lightning_compile_patch.report")._EXPECTED_BREAKS


@dataclass
class RunSpec:
    """One configuration to measure, in one fresh process. It travels to the worker as a JSON file."""

    #: The label in the tables ("eager", "whole", ...).
    name: str
    #: ``"lightning"`` (a ``Trainer.fit``), ``"plain_loop"`` (no Lightning) or ``"allreduce"`` (gloo, 2 ranks).
    kind: str = "lightning"
    #: Keyword arguments of ``GPTConfig``.
    model: dict[str, Any] = field(default_factory=dict)
    lr: float = 3e-3
    steps: int = 30
    #: Steps left out of the steady median (compiling, recompiling, allocator warm-up).
    warmup: int = 5
    accelerator: str = "cpu"
    devices: int = 1
    #: The Trainer's ``strategy``; ``None`` for the plain loop.
    strategy: Optional[str] = "auto"
    #: Lightning's precision; the plain loop maps ``"bf16-mixed"`` to ``torch.autocast(dtype=torch.bfloat16)``.
    precision: str = "32-true"
    #: ``Trainer(use_compile=...)``.
    use_compile: Any = None
    #: Pass ``torch.compile(model, backend=compile_backend)`` to ``fit`` (Lightning's own path).
    compile_input: bool = False
    #: The backend of the compiles this script makes itself (stock input, plain loop).
    compile_backend: str = "inductor"
    #: ``False``: the module logs its loss in ``on_train_batch_end`` instead of inside ``training_step``.
    log_in_step: bool = True
    #: ``torch.set_num_threads`` in each rank; ``None`` keeps torch's default.
    threads: Optional[int] = None
    #: ``DDPStrategy(bucket_cap_mb=...)``; ``None`` keeps DDP's default (25 MB).
    bucket_cap_mb: Optional[float] = None
    #: ``torch.set_float32_matmul_precision``; ``None`` leaves it.
    matmul_precision: Optional[str] = None
    #: Train this many steps more after the timed ones, counting the Python function calls made in each (the host's
    #: work, on rank 0's main thread); they are left out of every time.
    count_python_calls: int = 0
    #: For ``kind="allreduce"``: the number of float32 elements to all-reduce, and how often.
    numel: int = 0
    repeats: int = 20

    @property
    def samples(self) -> int:
        """Exactly one epoch of ``steps`` full batches per rank: no epoch boundary, no partial last batch."""
        return self.model.get("batch_size", 8) * (self.steps + self.count_python_calls) * self.devices

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "RunSpec":
        return cls(**json.loads(text))


def fresh_env(
    inductor_dir: Optional[Path], extra: Optional[dict[str, str]] = None, *, allow_files: bool = False
) -> dict[str, str]:
    """The parent's environment without its compiler caches; ``inductor_dir`` becomes the new, empty one.

    ``allow_files``: the directory was warmed by ``warm_toolchain`` on purpose. With ``inductor_dir=None`` no cache
    directory is set at all, which is what ``use_compile={"cache": DIR}`` needs to point inductor at ``DIR`` itself.
    ``src/`` goes on ``PYTHONPATH``, so that the package imports without being installed (as on a machine that only
    has torch and Lightning).
    """
    env = {key: value for key, value in os.environ.items() if key not in CACHE_ENV}
    if inductor_dir is not None:
        inductor_dir.mkdir(parents=True, exist_ok=True)
        if not allow_files and any(inductor_dir.iterdir()):
            raise RuntimeError(f"{inductor_dir} is meant to be a fresh, empty inductor cache, but it holds files")
        env["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_dir)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


#: Compiles a small function unrelated to any benchmark model, forward and backward, with inductor.
_TOOLCHAIN_WARMUP = """
import torch
x = torch.randn(8, 8, requires_grad=True)
torch.compile(lambda t: (t.sin() * 3.0 + 1.0).relu().sum())(x).backward()
"""


def warm_toolchain(inductor_dir: Path) -> float:
    """Fills a new inductor cache with what any first compile on this machine leaves there; returns the seconds.

    A fresh, empty cache makes the first compile of a process pay a one-time cost per cache directory (on a CPU,
    C++ headers compiled ahead, ISA probes: several seconds) that does not depend on the model. A run that starts
    from a cache warmed this way holds none of the model's graphs, so its first step is still a cold compile of the
    model, without that one-time cost.
    """
    env = fresh_env(inductor_dir)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", _TOOLCHAIN_WARMUP], env=env, check=True, capture_output=True, text=True)
    return time.perf_counter() - started


def run_fresh(
    spec: RunSpec,
    workdir: Path,
    *,
    fresh_inductor_cache: bool = True,
    warm_toolchain_first: bool = False,
    timeout_s: float = 3600,
    quiet: bool = True,
) -> dict[str, Any]:
    """Runs ``spec`` in a new Python process and returns what it measured.

    Args:
        spec: The configuration.
        workdir: A directory of this run's own; the process runs in it and leaves its log, spec and cache there.
        fresh_inductor_cache: ``True``: a new, empty ``TORCHINDUCTOR_CACHE_DIR`` under ``workdir``. ``False``: none
            set (the parent's is removed all the same).
        warm_toolchain_first: With a fresh cache, run ``warm_toolchain`` on it before the run (its seconds go into
            ``toolchain_warmup_s``), so that the first step measures the model's own cold compile.
        timeout_s: The process is killed after this long, and the run counts as failed.
        quiet: Keep the process's output in its log file only; otherwise it is also echoed.

    Returns:
        The worker's result, with ``status`` ``"ok"`` or ``"error"`` (and then ``error``, the reason), and
        ``process_wall_s``, the seconds the process took from start to exit, imports included.

    """
    workdir.mkdir(parents=True, exist_ok=True)
    spec_file = workdir / "spec.json"
    result_file = workdir / "result.json"
    log_file = workdir / "log.txt"
    spec_file.write_text(spec.to_json())
    result_file.unlink(missing_ok=True)
    # Lightning's DDP sets torch's threads to cores / processes unless OMP_NUM_THREADS is set: set it to ours
    threads = {"OMP_NUM_THREADS": str(spec.threads)} if spec.threads else {}
    inductor_dir = workdir / "inductor" if fresh_inductor_cache else None
    warmup_s = warm_toolchain(inductor_dir) if inductor_dir is not None and warm_toolchain_first else None
    env = fresh_env(inductor_dir, threads, allow_files=warmup_s is not None)
    command = [sys.executable, str(WORKER), str(spec_file), str(result_file)]
    started = time.perf_counter()
    with open(log_file, "w") as log:
        try:
            process = subprocess.run(
                command, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, check=False
            )
            returncode: Optional[int] = process.returncode
        except subprocess.TimeoutExpired:
            returncode = None
    wall = time.perf_counter() - started
    log_text = log_file.read_text(errors="replace")
    if not quiet:
        print(log_text, end="", flush=True)
    result: dict[str, Any] = json.loads(result_file.read_text()) if result_file.exists() else {}
    result.setdefault("name", spec.name)
    result["process_wall_s"] = wall
    if warmup_s is not None:
        result["toolchain_warmup_s"] = warmup_s
    if returncode != 0 or result.get("status") != "ok":
        result["status"] = "error"
        if returncode is None:
            result["error"] = f"timed out after {timeout_s:.0f} s"
        result.setdefault("error", f"exit code {returncode}: {_tail(log_text)}")
    return result


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on: processor, cores, load, accelerator, and the software versions."""
    import torch

    import lightning

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_average_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    return info


def describe_machine(info: dict[str, Any]) -> str:
    """One line for the reports."""
    load = info.get("load_average_at_start")
    load_text = f", load average {load[0]:.2f} at start" if load else ""
    device = f"{info['gpu']} (CUDA {info['cuda']}), " if info.get("gpu") else ""
    return (
        f"{device}{info['cpu']}, {info['usable_cores']} usable cores{load_text}; {info['platform']}; Python"
        f" {info['python']}, torch {info['torch']}, lightning {info['lightning']}"
    )


def command_line(argv: Optional[Sequence[str]] = None) -> str:
    """The command that produced a result, as it would be typed from the repository root."""
    script = Path(sys.argv[0]).resolve()
    try:
        script_text = str(script.relative_to(ROOT))
    except ValueError:
        script_text = str(script)
    args = list(sys.argv[1:] if argv is None else argv)
    return shlex.join(["python", script_text, *args])


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub Markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(value: Optional[float], spec: str = ".1f", suffix: str = "") -> str:
    """A number for a table, or an em dash for none."""
    if value is None:
        return "—"
    return f"{value:{spec}}{suffix}"


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    """``a / b``, or ``None`` if either is missing or ``b`` is zero."""
    if a is None or b is None or b == 0:
        return None
    return a / b


def report_header(title: str, data: dict[str, Any]) -> str:
    """The first lines of every report: title, the exact command, the machine and the date."""
    return (
        f"# {title}\n\n"
        f"Produced by `{data['command']}` on {describe_machine(data['machine'])}, {data['date']}.\n"
        f"Raw numbers: [{data['stem']}.json]({data['stem']}.json).\n"
    )


def write_report(out_dir: Path, stem: str, data: dict[str, Any], markdown: str) -> None:
    """Writes ``STEM.json`` (every raw number) and ``STEM.md`` (the tables) into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    (out_dir / f"{stem}.md").write_text(markdown.rstrip() + "\n")


def pyplot() -> Any:
    """``matplotlib.pyplot`` with a file-only backend, or ``None`` (with a message) if matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no chart (pip install matplotlib to get one)", flush=True)
        return None
    return plt


#: The reports ``docs/benchmarks.md`` embeds, in this order, when they exist (``summary.md`` is written by hand).
_INDEX_ORDER = ("summary", "cuda", "regions_gpu_probe", "cpu", "regions_depth", "optimize_ddp", "zero_cost", "smoke")
_INDEX_INTRO = """\
# Benchmarks

What `Trainer(use_compile=...)` costs and gains, measured by the scripts in `benchmarks/` (benchmarks measure, they do
not assert; the tests are in `tests/`, and CI runs only smoke checks of them through `tests/test_benchmarks.py`:
`bench.py --smoke`, and `regions_gpu_probe.py` on CPU). Each measured configuration runs in a fresh Python process
with a fresh, empty inductor cache, so every "first step" is a cold compile. Every section below says the exact
command that produced it and the machine it ran on; the raw numbers (and more columns) are in the JSON file next to
each table in `docs/benchmarks/`. This page is regenerated by every script that writes into `docs/benchmarks/`.

| script in `benchmarks/` | what it measures |
|---|---|
| `bench.py --mode cpu`, `--mode cuda` | every path: eager, stock, whole, regional, warm cache, plain loop |
| `regions_depth.py` | whole against regional in the Trainer, 6/12/24 blocks: first step, steady step, host calls |
| `regions_gpu_probe.py` | regional designs against whole, plain loop on a GPU: profiles, CUDA graphs |
| `regions_alternatives.py` | regional designs, plain loop on CPU: loss and per-block gradients against eager |
| `optimize_ddp.py` | `optimize_ddp=True` against `False`, 2 ranks and 1, on CPU; a paper model of the overlap |
| `zero_cost.py` | what the patch costs with `use_compile=None`, as a ratio within one process |
| `gpu_session.sh` | every measurement still open on a GPU, as one prepared run of at most 580 s on the device machine |

How to read the numbers: the first step is the whole first optimizer step (forward, backward, optimizer), compile
included; the steady step is the median of the steps after the first few. The CPU numbers come from a shared 2-core
machine where other jobs ran at the same time (each report gives the load average at its start): treat differences of
a few percent as noise. The CPU scripts run one torch thread per process, since two threads on two busy cores made
steps wait for a descheduled thread (a 4 ms step took 370 ms). CPU numbers say nothing about GPU speed-ups.

"""


def update_index(results_dir: Path = RESULTS_DIR, index: Path = INDEX) -> Path:
    """Regenerates ``docs/benchmarks.md`` from the reports in ``results_dir``: each one embedded, charts included."""
    sections = []
    for stem in _INDEX_ORDER:
        md = results_dir / f"{stem}.md"
        if not md.exists():
            continue
        body = md.read_text()
        body = re.sub(r"^(#+) ", r"#\1 ", body, flags=re.MULTILINE)  # one level down
        prefix = os.path.relpath(results_dir, index.parent).replace(os.sep, "/")
        body = re.sub(r"\]\((?!https?:|/|#)([^)]+)\)", rf"]({prefix}/\1)", body)  # links relative to the index
        sections.append(body.strip())
    if not sections:
        sections.append("No results yet: run `python benchmarks/bench.py --mode cpu`.")
    index.write_text(_INDEX_INTRO + "\n\n".join(sections) + "\n")
    return index
