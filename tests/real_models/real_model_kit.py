"""What the real-model tests share: a counting ``aot_eager`` backend, a per-step probe, and the reference runs.

* :class:`CountingAotEager` compiles like ``aot_eager`` and records, for every call of a compiled graph, which
  parameters of the model went into it. A step "ran compiled" when every trainable parameter reached compiled code in
  that step: a block that Dynamo runs eagerly (after the recompile limit, say) leaves its parameters out.
* :func:`plain_compile` compiles the model's forward and loss with plain ``torch.compile(backend="aot_eager")``,
  outside Lightning: the graph breaks the model has on its own, and which parameters plain compile puts into compiled
  graphs (a model whose plain compile breaks around a submodule leaves that submodule eager).
* :func:`eager_losses` runs the same Trainer without ``use_compile``: the reference losses, step by step.
"""

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch._dynamo
from torch import nn
from torch._dynamo.backends.debugging import aot_eager
from torch._dynamo.utils import counters, get_compilation_metrics
from torch._guards import CompileContext

from helpers import DDP_BREAKS, QUIET
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything

#: What the regions feature names its opaque region calls; the step breaks its graph there on purpose.
REGION_BOUNDARY = "compiled_region"

_LEDGERS: dict[str, "_Ledger"] = {}


@dataclass
class _Ledger:
    """Per compile id: how often its graphs ran, and the ids of the parameters each call received."""

    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    params_seen: set[int] = field(default_factory=set)


class CountingAotEager:
    """``aot_eager``, counting the calls of each compiled graph and the parameters passed into them.

    The ledger lives in a module-level table under ``name``: Lightning and torch may copy the backend object, and
    every copy must count into the same place.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.__name__ = "counting_aot_eager"  # how the run summary names the backend
        _LEDGERS[name] = _Ledger()

    @property
    def ledger(self) -> _Ledger:
        return _LEDGERS[self.name]

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Callable[..., Any]:
        ledger = _LEDGERS[self.name]
        compile_id = str(CompileContext.current_compile_id())
        inner = aot_eager(gm, example_inputs, **kwargs)

        def run(*args: Any) -> Any:  # Dynamo calls what a backend returns with the graph's inputs, unboxed
            ledger.calls[compile_id] += 1
            ledger.params_seen.update(id(a) for a in args if isinstance(a, nn.Parameter))
            return inner(*args)

        return run


def code_of_compile_ids() -> dict[str, str]:
    """``"co_name (file:line)"`` of the frame each compile id compiled, from Dynamo's compilation metrics."""
    return {
        str(m.compile_id): f"{m.co_name} ({(m.co_filename or '').rsplit('/', 1)[-1]}:{m.co_firstlineno})"
        for m in get_compilation_metrics()
        if m.co_name is not None  # backward graphs are recorded under their forward's id, without a frame
    }


class StepProbe(Callback):
    """Per training step: the loss, how many compiled-graph calls ran, and which trainable parameters missed them."""

    def __init__(self, backend: CountingAotEager | None = None) -> None:
        self.backend = backend
        self.losses: list[float] = []
        self.graph_calls: list[dict[str, int]] = []
        self.uncompiled_params: list[list[str]] = []
        self._before: dict[str, int] = {}

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self.backend is not None:
            self._before = dict(self.backend.ledger.calls)
            self.backend.ledger.params_seen.clear()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(float(loss.detach()))
        if self.backend is None:
            return
        ledger = self.backend.ledger
        self.graph_calls.append(
            {cid: n - self._before.get(cid, 0) for cid, n in ledger.calls.items() if n != self._before.get(cid, 0)}
        )
        self.uncompiled_params.append(
            [name for name, p in pl_module.named_parameters() if p.requires_grad and id(p) not in ledger.params_seen]
        )

    def calls_by_code(self, step: int) -> dict[str, int]:
        """The compiled-graph calls of one step, summed per compiled frame (function, file and line)."""
        codes = code_of_compile_ids()
        out: dict[str, int] = defaultdict(int)
        for cid, n in self.graph_calls[step].items():
            out[codes.get(cid, cid)] += n
        return dict(out)


def fresh_dynamo() -> None:
    torch._dynamo.reset()
    counters.clear()
    torch._dynamo.utils.clear_compilation_metrics()


@dataclass
class PlainCompile:
    """What plain ``torch.compile`` of a model's forward and loss does: its graph breaks, the parameters it compiles."""

    breaks: set[str]
    compiled_params: set[str]
    all_params: set[str]


def plain_compile(make_module: Callable[[], LightningModule], forward_and_loss: Callable, batch: Any) -> PlainCompile:
    """``torch.compile(forward_and_loss, backend=<counting aot_eager>)``, forward and backward, twice, no Lightning.

    Dynamo's state is reset before and after, so the caller's counts are not touched.
    """
    fresh_dynamo()
    try:
        seed_everything(0, verbose=False)
        module = make_module()
        module.train()
        backend = CountingAotEager("plain")
        compiled = torch.compile(lambda b: forward_and_loss(module, b), backend=backend)
        for _ in range(2):  # the second call catches breaks that only a recompile shows (lazily built state)
            backend.ledger.params_seen.clear()
            compiled(batch).backward()
        params = {name: p for name, p in module.named_parameters() if p.requires_grad}
        return PlainCompile(
            breaks=set(counters["graph_break"]),
            compiled_params={name for name, p in params.items() if id(p) in backend.ledger.params_seen},
            all_params=set(params),
        )
    finally:
        fresh_dynamo()


def unexpected_breaks(breaks: set[str], plain: set[str]) -> set[str]:
    """The breaks of a Trainer run that neither plain compile has, nor DDP's own code, nor the region boundaries."""
    return {
        reason
        for reason in breaks
        if reason not in plain and not any(marker in reason for marker in (*DDP_BREAKS, REGION_BOUNDARY))
    }


def dynamo_recompile_limit_hits() -> int:
    """How many compiles Dynamo gave up at its recompile limit since the metrics were cleared, from its own records.

    Unlike the run summary's count, which reads Dynamo's warning through logging, this does not depend on how the
    ``torch._dynamo`` loggers are set up (``TORCH_LOGS=-all`` silences the warning). torch 2.6 records the failure
    as ``RecompileLimitExceeded: cache_size_limit reached``, torch 2.13 as ``Unsupported: Dynamo recompile limit
    exceeded``.
    """
    return sum(
        1
        for m in get_compilation_metrics()
        if m.fail_type == "RecompileLimitExceeded" or "recompile limit exceeded" in (m.fail_reason or "")
    )


def trainer_options(strategy: str, steps: int) -> dict[str, Any]:
    return {**QUIET, "strategy": strategy, "max_steps": steps, "limit_val_batches": 0, "num_sanity_val_steps": 0}


def fit(make_module: Callable[[], LightningModule], strategy: str, steps: int, use_compile: Any, probe: StepProbe):
    """Seeds, builds the module and fits it for ``steps`` steps; returns the Trainer."""
    seed_everything(0, verbose=False)
    module = make_module()
    trainer = Trainer(use_compile=use_compile, callbacks=[probe], **trainer_options(strategy, steps))
    trainer.fit(module)
    return trainer


def eager_losses(make_module: Callable[[], LightningModule], strategy: str, steps: int) -> list[float]:
    """The losses of the same run without compiling anything."""
    probe = StepProbe()
    fit(make_module, strategy, steps, None, probe)
    return probe.losses
