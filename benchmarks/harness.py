"""The benchmark harness: fresh processes, the step timer, Dynamo's statistics and the result files.

Each configuration (a :class:`RunSpec`) runs in a fresh process, ``python benchmarks/harness.py SPEC.json
RESULT.json``, with a new, empty ``TORCHINDUCTOR_CACHE_DIR`` (never the parent's), so that its first step pays the whole
compile. Under DDP, Lightning starts the other ranks by running the same command again; rank 0 writes the result. A
step is timed from its start to the end of the optimizer step, the device synchronized at both ends; the steady step
is the median of the steps after ``warmup``. The scripts next to this file each turn such results into one table.
"""

import dataclasses
import json
import os
import platform
import re
import resource
import shlex
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

#: What this process was given, read before importing Lightning or Dynamo sets a default: a fresh directory, or nothing.
INDUCTOR_DIR_AT_START = os.environ.get("TORCHINDUCTOR_CACHE_DIR")

from torch._dynamo.backends.distributed import DDPOptimizer  # noqa: E402

import lightning  # noqa: E402
import lightning_compile_patch  # noqa: E402  (patches the Trainer: `use_compile`)
from lightning.pytorch import Callback, Trainer  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy  # noqa: E402
from lightning.pytorch.utilities.compile import from_compiled  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))  # the demo's GPT, outside the wheel
from gpt import GPT, GPTConfig, GPTModule, LogOutsideStepGPT, NextTokenData, parameter_count  # noqa: E402

from lightning_compile_patch.compile_features.summary import _EXPECTED_BREAKS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "docs" / "benchmarks"
INDEX = ROOT / "docs" / "benchmarks.md"
#: Environment variables that point torch's compilers at an on-disk cache: a fresh process gets none of the parent's.
CACHE_ENV = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
#: Compiles a small function unrelated to any model: what any first compile leaves in a new inductor cache.
TOOLCHAIN_WARMUP = "import torch; torch.compile(lambda t: t.sin().sum())(torch.randn(8, requires_grad=True)).backward()"
#: A Trainer that shows, logs and saves nothing, and never validates.
QUIET = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False}
QUIET.update(limit_val_batches=0, num_sanity_val_steps=0)


@dataclass
class RunSpec:
    """One configuration, measured in one fresh process."""

    name: str
    #: ``"lightning"`` (``Trainer.fit``), ``"hf_llama"`` (``Trainer.fit`` of a ``transformers`` Llama),
    #: ``"plain_loop"`` (no Lightning) or ``"allreduce"`` (gloo, 2 processes).
    kind: str = "lightning"
    model: dict[str, Any] = field(default_factory=dict)  # GPTConfig's keyword arguments; LlamaConfig's for hf_llama
    steps: int = 30
    warmup: int = 5  # steps left out of the steady median
    accelerator: str = "cpu"
    devices: int = 1
    strategy: Optional[str] = "auto"
    precision: str = "32-true"
    use_compile: Any = None
    compile_input: bool = False  # fit(from_compiled(torch.compile(model))): Lightning's own path
    compile_backend: str = "inductor"  # of the compiles made here (the stock input, the plain loop)
    log_in_step: bool = True  # False: log after the step (stock Lightning cannot compile `self.log` on torch 2.13)
    threads: Optional[int] = None  # torch threads per rank; None: torch's default
    bucket_cap_mb: Optional[float] = None  # DDPStrategy(bucket_cap_mb=...); None: DDP's 25 MB
    matmul_precision: Optional[str] = None
    count_python_calls: int = 0  # untimed steps after the timed ones, counting the host's Python calls in each
    numel: int = 0  # allreduce: float32 elements, and how many timed repeats
    repeats: int = 20


def run_fresh(
    spec: RunSpec, workdir: Path, *, inductor_cache: bool = True, warm_toolchain: bool = False, timeout_s: float = 3600
) -> dict[str, Any]:
    """Runs ``spec`` in a new process in ``workdir`` (its spec, log and cache stay there); returns what it measured.

    ``inductor_cache``: a new, empty ``TORCHINDUCTOR_CACHE_DIR``; ``False``: none (``use_compile={"cache": DIR}`` points
    inductor at ``DIR``). ``warm_toolchain``: compile an unrelated function into it first, leaving out the one-time
    cost of a first compile on this machine. ``status`` is ``"ok"`` or ``"error"`` (with ``error``, the reason).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    spec_file, result_file, log_file = workdir / "spec.json", workdir / "result.json", workdir / "log.txt"
    spec_file.write_text(json.dumps(dataclasses.asdict(spec), indent=1))
    result_file.unlink(missing_ok=True)
    env = {key: value for key, value in os.environ.items() if key not in CACHE_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    if spec.threads:  # Lightning's DDP sets torch's threads to cores / processes unless OMP_NUM_THREADS is set
        env["OMP_NUM_THREADS"] = str(spec.threads)
    result: dict[str, Any] = {"name": spec.name}
    if inductor_cache:
        (workdir / "inductor").mkdir()  # fails if it exists: a fresh cache each time
        env["TORCHINDUCTOR_CACHE_DIR"] = str(workdir / "inductor")
        if warm_toolchain:
            started = time.perf_counter()
            subprocess.run([sys.executable, "-c", TOOLCHAIN_WARMUP], env=env, check=True, capture_output=True)
            result["toolchain_warmup_s"] = time.perf_counter() - started
    command = [sys.executable, str(Path(__file__).resolve()), str(spec_file), str(result_file)]
    started = time.perf_counter()
    with open(log_file, "w") as log:
        try:
            returncode: Optional[int] = subprocess.run(
                command, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            returncode = None
    result["process_wall_s"] = time.perf_counter() - started
    result.update(json.loads(result_file.read_text()) if result_file.exists() else {})
    if returncode != 0 or result.get("status") != "ok":
        result["status"] = "error"
        tail = "\n".join(log_file.read_text(errors="replace").strip().splitlines()[-12:])
        reason = f"timed out after {timeout_s:.0f} s" if returncode is None else f"exit code {returncode}: {tail}"
        result.setdefault("error", reason)
    return result


def run_interleaved(
    data: dict[str, Any],
    configs: Sequence[str],
    world_sizes: Sequence[int],
    repeats: int,
    spec_for: Callable[[str, int], RunSpec],
    workdir: Path,
    out: Path,
    markdown: Callable[[dict[str, Any]], str],
) -> None:
    """Runs each configuration at each world size ``repeats`` times, each in a fresh process.

    The order rotates with each repeat, so that no configuration always runs first. Every run is appended to
    ``data["runs"]``; ``data["results"]["NAME@WORLD_SIZE"]`` is the :func:`combine` of its runs so far, and the report
    is written into ``out`` after each run, so that an interrupted benchmark still leaves its tables.
    """
    runs: dict[str, list[dict[str, Any]]] = {}
    for repeat in range(repeats):
        for world_size in world_sizes:
            shift = repeat % len(configs)
            for name in [*configs[shift:], *configs[:shift]]:
                spec = spec_for(name, world_size)
                key = spec.name = f"{name}@{world_size}"
                print(f"{key} (repeat {repeat + 1}/{repeats}): {spec.steps} steps per rank", flush=True)
                result = {**run_fresh(spec, workdir / f"{repeat}-{key}"), "repeat": repeat}
                print(f"    {result.get('steady_step_ms') or result.get('error', '')[:300]}", flush=True)
                data["runs"].append(result)
                runs.setdefault(key, []).append(result)
                data["results"][key] = combine(runs[key])
                write_report(out, data, markdown(data))


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One configuration over its repeats: the first good run's details, with each timing's median across runs."""
    ok = [r for r in runs if r["status"] == "ok"]
    if not ok:
        return runs[-1]
    combined = {**ok[0], "repeats_ok": len(ok), "repeats": len(runs)}
    for key in ("steady_step_ms", "steady_backward_ms", "first_step_s"):
        combined[f"{key}_runs"] = values = [r[key] for r in ok if r.get(key) is not None]
        combined[key] = statistics.median(values) if values else None
    return combined


def spread(result: dict[str, Any], key: str, spec: str, unit: str) -> str:
    """The median, and the range over repeats when there are several."""
    values = result.get(f"{key}_runs") or []
    extent = f" ({min(values):{spec}} to {max(values):{spec}})" if len(values) > 1 else ""
    return fmt(result.get(key), spec, unit) + extent


class StepTimer(Callback):
    """The step timer: a Lightning callback; a plain loop calls the same four hooks itself, with no arguments.

    Steps after the first ``timed_steps`` are not timed: each counts the host's Python function calls instead.
    """

    def __init__(self, device: torch.device, timed_steps: Optional[int] = None) -> None:
        self.sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        self.timed_steps = timed_steps
        self.steps: list[float] = []
        self.backward: list[float] = []
        self.python_calls: list[int] = []
        self.ddp_buckets: dict[str, Any] = {}
        self._calls: Optional[list[int]] = None

    def on_train_batch_start(self, *args: Any) -> None:
        self.sync()
        if self.timed_steps is not None and len(self.steps) >= self.timed_steps:
            calls = self._calls = [0]

            def count(frame: Any, event: str, arg: Any) -> None:
                calls[0] += event == "call"

            sys.setprofile(count)
        self._start = time.perf_counter()

    def on_before_backward(self, *args: Any) -> None:
        self.sync()
        self._backward_start = time.perf_counter()

    def on_after_backward(self, *args: Any) -> None:
        self.sync()
        self.backward.append(time.perf_counter() - self._backward_start)

    def on_train_batch_end(self, *args: Any) -> None:
        self.sync()
        elapsed = time.perf_counter() - self._start
        if self._calls is None:
            self.steps.append(elapsed)
            return
        sys.setprofile(None)
        self.python_calls.append(self._calls[0])
        self._calls = None
        self.backward.pop()  # a counted step is not a timed one

    def on_train_end(self, trainer: Trainer, *args: Any) -> None:
        """DDP's reducer buckets (rebuilt in the first iteration), while the strategy still holds DDP."""
        try:  # a private API: record why it is missing
            buckets = trainer.strategy.model.reducer._get_zeros_like_grad_buckets()
            self.ddp_buckets = {"bucket_bytes": [bucket.buffer().numel() * 4 for bucket in buckets]}
        except (AttributeError, RuntimeError) as error:
            self.ddp_buckets = {"bucket_bytes_error": repr(error)}

    def stats(self, warmup: int, tokens_per_step: int) -> dict[str, Any]:
        """First step, steady median, throughput, backward; and the Python calls per counted step."""
        steady, steady_backward = self.steps[warmup:] or self.steps[-1:], self.backward[warmup:] or self.backward[-1:]
        steady_s = statistics.median(steady) if steady else None
        return {
            "first_step_s": self.steps[0] if self.steps else None,
            "steady_step_ms": 1000 * steady_s if steady_s else None,
            "tokens_per_s": tokens_per_step / steady_s if steady_s else None,
            "steady_backward_ms": 1000 * statistics.median(steady_backward) if steady_backward else None,
            "step_times_ms": [round(1000 * s, 3) for s in self.steps],
            **({"python_calls_per_step": statistics.median(self.python_calls)} if self.python_calls else {}),
        }


def dynamo_stats() -> dict[str, Any]:
    """What Dynamo did in this process: graphs, recompiles, graph breaks (expected ones apart), compile times."""
    from torch._dynamo.utils import counters, get_compilation_metrics

    breaks = dict(counters["graph_break"])
    expected = {reason: n for reason, n in breaks.items() if any(m in reason for m in _EXPECTED_BREAKS)}
    other = {reason[:400]: n for reason, n in breaks.items() if reason not in expected}
    metrics = list(get_compilation_metrics())
    return {
        "graphs": counters["stats"]["unique_graphs"],
        "recompiles": sum(1 for m in metrics if (m.cache_size or 0) > 0),
        "graph_breaks_intentional": sum(expected.values()),
        "graph_breaks_other": sum(other.values()),
        "graph_break_reasons_other": other,
        "frames_compiled": len(metrics),
        # the forward compile of each frame that made a graph; the backward compiles later, in the first backward
        "frame_forward_compile_s": [
            [m.co_name, m.entire_frame_compile_time_s] for m in metrics if m.backend_compile_time_s
        ],
    }


def _peak_memory_mib(device: torch.device) -> float:
    """CUDA: the allocator's peak; CPU: the process's peak resident set (Linux reports KiB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_lightning(spec: RunSpec, device: torch.device) -> Optional[dict[str, Any]]:
    """``Trainer.fit`` of the demo GPT as ``spec`` says; rank 0's measurements, ``None`` on other ranks."""
    torch.manual_seed(0)
    steps = spec.steps + spec.count_python_calls
    config = GPTConfig(**{**spec.model, "samples": spec.model.get("batch_size", 8) * steps * spec.devices})
    module = (GPTModule if spec.log_in_step else LogOutsideStepGPT)(config, lr=3e-3)
    strategy: Any = DDPStrategy(bucket_cap_mb=spec.bucket_cap_mb) if spec.bucket_cap_mb else spec.strategy
    timer = StepTimer(device, spec.steps if spec.count_python_calls else None)
    ddp_optimizer_buckets: list[int] = []  # how many pieces DDPOptimizer splits each compiled graph into
    split = DDPOptimizer.compile_fn

    def compile_fn(self: Any, gm: Any, example_inputs: Any) -> Any:
        out = split(self, gm, example_inputs)
        ddp_optimizer_buckets.append(len(getattr(self, "buckets", [])))
        return out

    DDPOptimizer.compile_fn = compile_fn
    options = dict(accelerator=spec.accelerator, devices=spec.devices, precision=spec.precision, max_steps=steps)
    trainer = Trainer(strategy=strategy, use_compile=spec.use_compile, callbacks=[timer], **options, **QUIET)
    # `from_compiled(...)`: Lightning's own path. The package, applied, compiles again only a `torch.compile` wrapper
    # passed in; this module it leaves to Lightning (stock_logging fails in `self.log` as it does without the package)
    trainer.fit(from_compiled(torch.compile(module, backend=spec.compile_backend)) if spec.compile_input else module)
    if trainer.global_rank != 0:
        return None
    summary = lightning_compile_patch.last_summary(trainer)
    loss = trainer.callback_metrics.get("train_loss")
    tokens = config.batch_size * config.block_size * trainer.world_size
    return {
        "world_size": trainer.world_size,
        "parameters": parameter_count(module),
        "final_loss": float(loss) if loss is not None else None,
        "compile_summary": vars(summary) if summary is not None else None,
        "ddp_optimizer_buckets": ddp_optimizer_buckets,
        **({"ddp_reducer_buckets": timer.ddp_buckets} if spec.strategy == "ddp" else {}),
        **timer.stats(spec.warmup, tokens),
    }


class HFLlamaModule(lightning.pytorch.LightningModule):
    """A ``transformers`` Llama as users train one: ``self.model(**batch).loss``, AdamW, random tokens."""

    def __init__(self, config: dict[str, Any], steps: int, batch_size: int = 8, **call_kwargs: Any) -> None:
        from transformers import LlamaConfig, LlamaForCausalLM

        super().__init__()
        self.model = LlamaForCausalLM(LlamaConfig(**config))
        self.call_kwargs = call_kwargs  # such as `use_cache=False`
        self.tokens = torch.randint(0, config["vocab_size"], (steps * batch_size, 64), generator=torch.Generator())
        self.batch_size = batch_size

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.model(input_ids=batch, labels=batch, **self.call_kwargs).loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.tokens, batch_size=self.batch_size)


def run_hf_llama(spec: RunSpec, device: torch.device) -> dict[str, Any]:
    """``Trainer.fit`` of a ``transformers`` Llama (``spec.model``: LlamaConfig's arguments, and ``use_cache``)."""
    torch.manual_seed(0)
    config = dict(spec.model)
    call_kwargs = {"use_cache": config.pop("use_cache")} if "use_cache" in config else {}
    steps = spec.steps + spec.count_python_calls
    module = HFLlamaModule(config, steps, **call_kwargs)
    timer = StepTimer(device, spec.steps if spec.count_python_calls else None)
    options = dict(accelerator=spec.accelerator, devices=1, precision=spec.precision, max_steps=steps)
    trainer = Trainer(use_compile=spec.use_compile, callbacks=[timer], **options, **QUIET)
    trainer.fit(module)
    summary = lightning_compile_patch.last_summary(trainer)
    return {
        "parameters": sum(p.numel() for p in module.parameters()),
        "compile_summary": vars(summary) if summary is not None else None,
        **timer.stats(spec.warmup, 8 * 64),
    }


def _next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The loss of ``GPTModule._loss``."""
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def run_plain_loop(spec: RunSpec, device: torch.device) -> dict[str, Any]:
    """The ceiling: ``torch.compile`` on the model and on the loss, the same AdamW and data, no Lightning."""
    torch.manual_seed(0)  # the same initial weights as GPTModule's
    config = GPTConfig(**{**spec.model, "samples": spec.model.get("batch_size", 8) * spec.steps})
    model = GPT(config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)  # as GPTModule's
    compiled = torch.compile(model, backend=spec.compile_backend)
    loss_fn = torch.compile(_next_token_loss, backend=spec.compile_backend)
    if spec.precision not in ("32-true", "bf16-mixed"):
        raise ValueError(f"the plain loop has no equivalent of precision={spec.precision!r}")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if spec.precision == "bf16-mixed" else nullcontext()
    timer = StepTimer(device)
    loss = torch.zeros(())
    for x, y in DataLoader(NextTokenData(config), batch_size=config.batch_size):
        x, y = x.to(device), y.to(device)
        timer.on_train_batch_start()
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = loss_fn(compiled(x), y)
        timer.on_before_backward()
        loss.backward()
        timer.on_after_backward()
        optimizer.step()
        timer.on_train_batch_end()
    stats = timer.stats(spec.warmup, config.batch_size * config.block_size)
    return {"world_size": 1, "parameters": parameter_count(model), "final_loss": float(loss), **stats}


def _allreduce_rank(rank: int, spec: RunSpec, port: int, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    tensor, times = torch.randn(spec.numel), []
    for i in range(spec.repeats + 3):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        times += [time.perf_counter() - start] if i >= 3 else []
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def run_allreduce(spec: RunSpec, device: torch.device) -> dict[str, Any]:
    """One ``all_reduce`` of ``spec.numel`` float32 values on gloo between 2 processes on this machine."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_allreduce_rank, args=(spec, port, "allreduce.json"), nprocs=2, start_method="spawn")
    times = json.loads(Path("allreduce.json").read_text())
    return {
        "megabytes": spec.numel * 4 / 1e6,
        "allreduce_ms": 1000 * statistics.median(times),
        "allreduce_min_ms": 1000 * min(times),
        "allreduce_times_ms": [round(1000 * t, 3) for t in times],
    }


def worker(spec_file: str, result_file: str) -> int:
    """The body of each fresh process: runs the spec, writes what it measured (or why it failed) as JSON."""
    spec = RunSpec(**json.loads(Path(spec_file).read_text()))
    base = {"name": spec.name, "spec": dataclasses.asdict(spec), "pid": os.getpid()}
    base["inductor_dir_at_start"] = INDUCTOR_DIR_AT_START
    if spec.threads:
        torch.set_num_threads(spec.threads)
    if spec.matmul_precision:
        torch.set_float32_matmul_precision(spec.matmul_precision)
    device = torch.device("cuda", 0) if spec.accelerator in ("cuda", "gpu") else torch.device("cpu")
    if device.type == "cuda":
        torch.empty(1, device=device)  # the allocator must exist before its peak can be reset
        torch.cuda.reset_peak_memory_stats(device)
    runs = {"lightning": run_lightning, "hf_llama": run_hf_llama, "plain_loop": run_plain_loop}
    run = {**runs, "allreduce": run_allreduce}[spec.kind]
    try:
        result = run(spec, device)
    except Exception as error:
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            failure = {"status": "error", "error": f"{type(error).__name__}: {error}"[:2000]}
            Path(result_file).write_text(json.dumps({**base, **failure, "traceback": traceback.format_exc()[-6000:]}))
        traceback.print_exc()
        return 1
    if result is None:
        return 0  # another rank of a distributed run: rank 0 reports
    if spec.kind != "allreduce":
        result.update(peak_memory_mib=_peak_memory_mib(device), **dynamo_stats())
    result = {**base, "status": "ok", "threads": torch.get_num_threads(), **result}
    Path(result_file).write_text(json.dumps(result, indent=1, default=str))
    return 0


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on: processor, cores, load, accelerator, and the software versions."""
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    names = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.MULTILINE) if cpuinfo.exists() else []
    return {
        "cpu": names[0].strip() if names else cpu,
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


def new_report(stem: str, argv: Optional[Sequence[str]], **fields: Any) -> dict[str, Any]:
    """The start of a result file: its name, the command as typed from the repository root, the machine, the date."""
    script = Path(sys.argv[0]).resolve()
    script_text = str(script.relative_to(ROOT)) if script.is_relative_to(ROOT) else str(script)
    command = shlex.join(["python", script_text, *(sys.argv[1:] if argv is None else argv)])
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return {"benchmark": stem, "stem": stem, "command": command, "machine": machine_info(), "date": date, **fields}


def report_header(title: str, data: dict[str, Any]) -> str:
    """The first lines of every report: title, the exact command, the machine and the date."""
    m = data["machine"]
    load = f", load average {m['load_average_at_start'][0]:.2f} at start" if m.get("load_average_at_start") else ""
    gpu = f"{m['gpu']} (CUDA {m['cuda']}), " if m.get("gpu") else ""
    return (
        f"# {title}\n\nProduced by `{data['command']}` on {gpu}{m['cpu']}, {m['usable_cores']} usable cores{load};"
        f" {m['platform']}; Python {m['python']}, torch {m['torch']}, lightning {m['lightning']}, {data['date']}.\n"
        f"Raw numbers: [{data['stem']}.json]({data['stem']}.json).\n"
    )


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows])


def fmt(value: Optional[float], spec: str = ".1f", suffix: str = "") -> str:
    """A number for a table, or an em dash for none."""
    return "—" if value is None else f"{value:{spec}}{suffix}"


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    """``a / b``, or ``None`` if either is missing or ``b`` is zero."""
    return None if a is None or not b else a / b


def write_report(out_dir: Path, data: dict[str, Any], markdown: str) -> None:
    """Writes ``STEM.json`` (every raw number) and ``STEM.md`` (the tables); into ``docs/``, also the index page."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{data['stem']}.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    (out_dir / f"{data['stem']}.md").write_text(markdown.rstrip() + "\n")
    if out_dir.resolve() == RESULTS_DIR.resolve():
        update_index()


#: The reports ``docs/benchmarks.md`` embeds, in this order, when they exist (``summary.md`` is written by hand).
INDEX_ORDER = ("summary", "cuda", "regions_gpu_probe", "cpu", "regions_depth", "regions_depth_torch291", "regions_hf")
INDEX_ORDER += ("optimize_ddp", "compiled_autograd")
INDEX_ORDER += ("zero_cost", "host_cost", "guard_check")
INDEX_MARK = "<!-- Everything below is generated from docs/benchmarks/*.md by benchmarks/harness.py. -->"


def update_index(results_dir: Path = RESULTS_DIR, index: Path = INDEX) -> Path:
    """Rewrites ``docs/benchmarks.md`` after its hand-written introduction: each report embedded, a level down."""
    intro, mark, _ = index.read_text().partition(INDEX_MARK)
    if not mark:
        raise RuntimeError(f"{index} lacks the line {INDEX_MARK!r} that ends its hand-written introduction")
    sections = []
    for stem in INDEX_ORDER:
        if (results_dir / f"{stem}.md").exists():
            body = re.sub(r"^(#+) ", r"#\1 ", (results_dir / f"{stem}.md").read_text(), flags=re.MULTILINE)
            prefix = os.path.relpath(results_dir, index.parent).replace(os.sep, "/")
            sections.append(re.sub(r"\]\((?!https?:|/|#)([^)]+)\)", rf"]({prefix}/\1)", body).strip())
    index.write_text(intro.rstrip() + "\n\n" + INDEX_MARK + "\n\n" + "\n\n".join(sections) + "\n")
    return index


if __name__ == "__main__":
    sys.exit(worker(*sys.argv[1:3]))
