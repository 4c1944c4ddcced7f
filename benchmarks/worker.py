"""The body of every benchmark process: runs one :class:`~common.RunSpec` and writes what it measured as JSON.

    python benchmarks/worker.py SPEC.json RESULT.json

The scripts start it in a fresh process per configuration (``common.run_fresh``). Under ``strategy="ddp"`` with several
devices, Lightning starts the other ranks by running this same command again; rank 0 writes the result.

What is measured, per step: from ``on_train_batch_start`` to ``on_train_batch_end`` (in the plain loop: the same span,
from zero_grad to after ``optimizer.step()``), which covers forward, loss, backward and the optimizer step; on CUDA the
device is synchronized at both ends. The first step is the cold one (it compiles); the steady step is the median of
the steps after ``warmup``.

"""

import json
import os
import resource
import statistics
import sys
import time
import traceback
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, Optional

#: What this process was given, before torch or the package could set it: a fresh directory, or nothing.
INDUCTOR_DIR_AT_START = os.environ.get("TORCHINDUCTOR_CACHE_DIR")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import Tensor  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lightning_compile_patch  # noqa: E402, F401  (patches the Trainer: `use_compile`)
from common import EXPECTED_BREAKS, RunSpec  # noqa: E402
from lightning.pytorch import Callback, LightningModule, Trainer  # noqa: E402
from lightning_compile_patch.demos.gpt import GPT, GPTConfig, GPTModule, NextTokenData, parameter_count  # noqa: E402


class LogOutsideStepGPT(GPTModule):
    """The same GPT, logging its loss in ``on_train_batch_end`` rather than inside ``training_step``.

    Stock Lightning 2.6 on torch 2.13 cannot compile a ``training_step`` that calls ``self.log`` (Dynamo fails inside
    ``LightningModule.log``), so Lightning's own compile path is measured with this module: the same model, data, loss
    and optimizer, and the same ``self.log`` call, made eagerly after the step instead of inside it.
    """

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._loss(batch)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.log("train_loss", outputs["loss"], prog_bar=True)


class StepTimer(Callback):
    """Times every training step, and the backward pass inside it; counts Python calls in the last steps, untimed."""

    def __init__(self, synchronize: Callable[[], None], timed_steps: Optional[int] = None) -> None:
        self.synchronize = synchronize
        self.timed_steps = timed_steps
        self.steps: list[float] = []
        self.backward: list[float] = []
        self.python_calls: list[int] = []
        self._calls: Optional[list[int]] = None  # this step's call count, while counting
        self.strategy_model = ""
        self.ddp_buckets: dict[str, Any] = {}

    def on_train_batch_start(self, trainer: Trainer, *args: Any) -> None:
        self.strategy_model = type(trainer.strategy.model).__name__
        self.synchronize()
        if self.timed_steps is not None and trainer.global_step >= self.timed_steps:
            calls = self._calls = [0]

            def count(frame: Any, event: str, arg: Any) -> None:
                if event == "call":
                    calls[0] += 1

            sys.setprofile(count)
        self._step_start = time.perf_counter()

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: Tensor) -> None:
        self.synchronize()
        self._backward_start = time.perf_counter()

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.synchronize()
        self.backward.append(time.perf_counter() - self._backward_start)

    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        self.synchronize()
        elapsed = time.perf_counter() - self._step_start
        if self._calls is None:
            self.steps.append(elapsed)
            return
        sys.setprofile(None)
        self.python_calls.append(self._calls[0])
        self._calls = None
        self.backward.pop()  # a counted step is not a timed one

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """DDP's own buckets (after its rebuild in the first iteration), while the strategy still holds DDP."""
        model = trainer.strategy.model
        logging_data = getattr(model, "_get_ddp_logging_data", None)
        if logging_data is None:
            return
        data = logging_data()
        self.ddp_buckets = {key: data.get(key) for key in ("bucket_cap_bytes", "has_rebuilt_buckets")}
        try:  # the reducer's buckets as they are now; the logging data keeps the ones DDP was built with
            buckets = model.reducer._get_zeros_like_grad_buckets()
            self.ddp_buckets["bucket_bytes"] = [bucket.buffer().numel() * 4 for bucket in buckets]
        except (AttributeError, RuntimeError) as error:  # a private API: record why it is missing
            self.ddp_buckets["bucket_bytes_error"] = repr(error)


def _synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _step_stats(steps: list[float], backward: list[float], spec: RunSpec, world_size: int) -> dict[str, Any]:
    """First step, steady median and throughput from the per-step times."""
    steady = steps[spec.warmup :] or steps[-1:]
    steady_s = statistics.median(steady) if steady else None
    tokens = spec.model.get("batch_size", 8) * spec.model.get("block_size", 64) * world_size
    steady_backward = backward[spec.warmup :] or backward[-1:]
    return {
        "steps_timed": len(steps),
        "first_step_s": steps[0] if steps else None,
        "steady_step_ms": 1000 * steady_s if steady_s else None,
        "steady_step_min_ms": 1000 * min(steady) if steady else None,
        "tokens_per_s": tokens / steady_s if steady_s else None,
        "first_backward_s": backward[0] if backward else None,
        "steady_backward_ms": 1000 * statistics.median(steady_backward) if steady_backward else None,
        "step_times_ms": [round(1000 * s, 3) for s in steps],
    }


def _dynamo_stats() -> dict[str, Any]:
    """What Dynamo did in this process: graphs, recompiles, and graph breaks split by whether they are meant."""
    from torch._dynamo.utils import counters, get_compilation_metrics

    breaks = dict(counters["graph_break"])
    intentional = {reason: n for reason, n in breaks.items() if any(m in reason for m in EXPECTED_BREAKS)}
    other = {reason: n for reason, n in breaks.items() if reason not in intentional}
    metrics = list(get_compilation_metrics())
    compile_s = sum(m.entire_frame_compile_time_s or 0.0 for m in metrics)
    compile_s += sum((m.backward_cumulative_compile_time_us or 0) / 1e6 for m in metrics)
    return {
        "graphs": counters["stats"]["unique_graphs"],
        "recompiles": sum(1 for m in metrics if (m.cache_size or 0) > 0),
        "graph_breaks_intentional": sum(intentional.values()),
        "graph_breaks_other": sum(other.values()),
        "graph_break_reasons_other": {reason[:400]: n for reason, n in other.items()},
        "graph_break_reasons_intentional": {reason[:200]: n for reason, n in intentional.items()},
        "frames_compiled": len(metrics),
        # the forward compile of each frame that produced a graph, in order (backward graphs compile later, in the
        # first backward, and are not in these metrics): the first pays what any first compile in a process pays
        "frame_forward_compile_s": [
            [m.co_name, m.entire_frame_compile_time_s] for m in metrics if m.backend_compile_time_s is not None
        ],
        "compile_s": compile_s,
        # cache hits and misses: a warm start shows hits and no misses
        "compiler_cache_counters": {
            f"{group}.{name}": n
            for group in ("inductor", "aot_autograd")
            for name, n in counters[group].items()
            if "cache" in name
        },
    }


def _reset_peak_memory(device: torch.device) -> None:
    """Starts CUDA's peak count now (the allocator must exist first: an allocation creates it)."""
    if device.type == "cuda":
        torch.empty(1, device=device)
        torch.cuda.reset_peak_memory_stats(device)


def _peak_memory(device: torch.device) -> dict[str, Any]:
    """CUDA: the allocator's peak; CPU: the process's peak resident set (Linux reports KiB)."""
    if device.type == "cuda":
        return {"peak_memory_mib": torch.cuda.max_memory_allocated(device) / 2**20, "peak_memory_kind": "cuda_alloc"}
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_memory_mib": rss_kib / 1024, "peak_memory_kind": "cpu_max_rss"}


def _ddp_optimizer_buckets() -> list[int]:
    """Records how many buckets DDPOptimizer splits each compiled graph into (``optimize_ddp=True``)."""
    from torch._dynamo.backends.distributed import DDPOptimizer

    seen: list[int] = []
    original = DDPOptimizer.compile_fn

    def compile_fn(self: Any, gm: Any, example_inputs: Any) -> Any:
        out = original(self, gm, example_inputs)
        seen.append(len(getattr(self, "buckets", [])))
        return out

    DDPOptimizer.compile_fn = compile_fn
    return seen


def run_lightning(spec: RunSpec) -> Optional[dict[str, Any]]:
    """``Trainer.fit`` of the demo GPT as ``spec`` says; the measurements on rank 0, ``None`` on other ranks."""
    from lightning.pytorch.strategies import DDPStrategy

    torch.manual_seed(0)
    config = GPTConfig(**{**spec.model, "samples": spec.samples})
    module = (GPTModule if spec.log_in_step else LogOutsideStepGPT)(config, lr=spec.lr)
    strategy: Any = spec.strategy
    if spec.strategy == "ddp" and spec.bucket_cap_mb is not None:
        strategy = DDPStrategy(bucket_cap_mb=spec.bucket_cap_mb)
    device = torch.device("cuda", 0) if spec.accelerator in ("cuda", "gpu") else torch.device("cpu")
    timer = StepTimer(_synchronizer(device), spec.steps if spec.count_python_calls else None)
    ddp_buckets = _ddp_optimizer_buckets()
    trainer = Trainer(
        accelerator=spec.accelerator,
        devices=spec.devices,
        strategy=strategy,
        precision=spec.precision,
        max_steps=spec.steps + spec.count_python_calls,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        use_compile=spec.use_compile,
        callbacks=[timer],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = torch.compile(module, backend=spec.compile_backend) if spec.compile_input else module
    _reset_peak_memory(device)
    started = time.perf_counter()
    trainer.fit(model)
    fit_s = time.perf_counter() - started
    if trainer.global_rank != 0:
        return None
    summary = trainer._compile_connector.last_summary
    ddp_reducer: dict[str, Any] = {}
    if spec.strategy == "ddp":
        ddp_reducer = {"ddp_bucket_cap_mb": spec.bucket_cap_mb or 25.0, "ddp_reducer_buckets": timer.ddp_buckets}
    return {
        "world_size": trainer.world_size,
        "parameters": parameter_count(module),
        "fit_s": fit_s,
        "final_loss": _final_loss(trainer),
        "strategy_model": timer.strategy_model,
        "strategy_class": type(trainer.strategy).__name__,
        "compile_summary": vars(summary) if summary is not None else None,
        "ddp_optimizer_buckets": ddp_buckets,
        **ddp_reducer,
        **_step_stats(timer.steps, timer.backward, spec, trainer.world_size),
        **_peak_memory(device),
        **({"python_calls_per_step": statistics.median(timer.python_calls)} if timer.python_calls else {}),
    }


def _final_loss(trainer: Trainer) -> Optional[float]:
    loss = trainer.callback_metrics.get("train_loss")
    return float(loss) if loss is not None else None


def _next_token_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """The loss of ``GPTModule._loss``."""
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def run_plain_loop(spec: RunSpec) -> dict[str, Any]:
    """The ceiling: a plain PyTorch loop, ``torch.compile`` on the model and on the loss, no Lightning."""
    from torch.utils.data import DataLoader

    torch.manual_seed(0)  # the same initial weights as GPTModule's
    config = GPTConfig(**{**spec.model, "samples": spec.samples})
    device = torch.device("cuda", 0) if spec.accelerator in ("cuda", "gpu") else torch.device("cpu")
    model = GPT(config).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0)  # as GPTModule's
    compiled_model = torch.compile(model, backend=spec.compile_backend)
    loss_fn = torch.compile(_next_token_loss, backend=spec.compile_backend)
    loader = DataLoader(NextTokenData(config), batch_size=config.batch_size, shuffle=False)
    if spec.precision == "bf16-mixed":
        autocast: Any = torch.autocast(device.type, dtype=torch.bfloat16)
    elif spec.precision in ("32-true", "32"):
        autocast = nullcontext()
    else:
        raise ValueError(f"the plain loop has no equivalent of precision={spec.precision!r}")
    synchronize = _synchronizer(device)
    _reset_peak_memory(device)
    steps: list[float] = []
    backward: list[float] = []
    loss = torch.zeros(())
    started = time.perf_counter()
    for x, y in loader:
        if len(steps) >= spec.steps:
            break
        x, y = x.to(device), y.to(device)
        synchronize()
        step_start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = loss_fn(compiled_model(x), y)
        synchronize()
        backward_start = time.perf_counter()
        loss.backward()
        synchronize()
        backward.append(time.perf_counter() - backward_start)
        optimizer.step()
        synchronize()
        steps.append(time.perf_counter() - step_start)
    return {
        "world_size": 1,
        "parameters": parameter_count(model),
        "fit_s": time.perf_counter() - started,
        "final_loss": float(loss),
        "strategy_model": type(compiled_model).__name__,
        "compile_summary": None,
        **_step_stats(steps, backward, spec, 1),
        **_peak_memory(device),
    }


def _allreduce_rank(rank: int, spec: RunSpec, port: int, out: str) -> None:
    """One rank of :func:`run_allreduce`."""
    import torch.distributed as dist

    if spec.threads:
        torch.set_num_threads(spec.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    tensor = torch.randn(spec.numel)
    times = []
    for i in range(spec.repeats + 3):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        if i >= 3:
            times.append(time.perf_counter() - start)
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def run_allreduce(spec: RunSpec) -> dict[str, Any]:
    """The time of one ``all_reduce`` of ``spec.numel`` float32 values on gloo between 2 processes on this machine."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = Path.cwd() / "allreduce_times.json"
    mp.start_processes(_allreduce_rank, args=(spec, port, str(out)), nprocs=2, start_method="spawn")
    times = json.loads(out.read_text())
    return {
        "numel": spec.numel,
        "megabytes": spec.numel * 4 / 1e6,
        "allreduce_ms": 1000 * statistics.median(times),
        "allreduce_min_ms": 1000 * min(times),
        "allreduce_times_ms": [round(1000 * t, 3) for t in times],
    }


RUNNERS: dict[str, Callable[[RunSpec], Optional[dict[str, Any]]]] = {
    "lightning": run_lightning,
    "plain_loop": run_plain_loop,
    "allreduce": run_allreduce,
}


def main(spec_file: str, result_file: str) -> int:
    spec = RunSpec.from_json(Path(spec_file).read_text())
    if spec.threads:
        torch.set_num_threads(spec.threads)
    if spec.matmul_precision:
        torch.set_float32_matmul_precision(spec.matmul_precision)
    base = {
        "name": spec.name,
        "spec": json.loads(spec.to_json()),
        "pid": os.getpid(),
        "inductor_dir_at_start": INDUCTOR_DIR_AT_START,
        "load_average_at_start": os.getloadavg()[0],
    }
    try:
        result = RUNNERS[spec.kind](spec)
    except Exception as error:
        rank = int(os.environ.get("LOCAL_RANK", "0"))
        if rank == 0:
            message = f"{type(error).__name__}: {error}".strip()
            Path(result_file).write_text(
                json.dumps(
                    {**base, "status": "error", "error": message[:2000], "traceback": traceback.format_exc()[-6000:]}
                )
            )
        traceback.print_exc()
        return 1
    if result is None:
        return 0  # another rank of a distributed run: rank 0 reports
    dynamo = _dynamo_stats() if spec.kind != "allreduce" else {}
    result = {**base, "status": "ok", "threads": torch.get_num_threads(), **result, **dynamo}
    Path(result_file).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
