"""What the compiler did during one run, told through Lightning's logging.

* While compiling: one rank-zero line when the first compiled step of a kind (training, evaluation) starts, and one
  when it has finished, with the seconds. Without them a cold compile looks like a run that hangs at step 0.
* A warning as soon as any frame hits Dynamo's recompile limit, after which Dynamo runs it uncompiled.
* Every step the strategy runs, counted by kind as compiled, compiled in parts, or eager. A step is compiled when a
  graph of its own compiled code ran during it: the backend is wrapped so that each graph, when it runs, tells whether
  it was called from the step's compiled code. A step whose own code ran eagerly is compiled in parts when a graph of
  what it calls ran (a module compiled on its own, ``in_parts.py``), and eager when none did. Steps after a fallback
  still count, as eager.
* Each eager step, and each step compiled in parts, gets the cause of its own frame, told in one warning per cause
  with the fix: a fallback,
  ``torch.compiler.disable``, the recompile limit (only where that frame hit it), a frame Dynamo skipped, with
  Dynamo's own reason from its compilation metrics (a graph break inside a loop skips the whole frame),
  ``suppress_errors``.
* At the end: one summary line with graphs, recompiles, graph breaks, compiled and eager steps, and compile seconds.

"""

import logging
import time
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any, Callable, Optional, cast

import torch

from lightning.pytorch.trainer.states import TrainerStatus
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from lightning_compile_patch.compile_features import _CompileFeature, _CompileOptions, _flag
from lightning_compile_patch.compile_features import _private_names as private_names
from lightning_compile_patch.compile_features._run import _CompileRun

#: The clocks, bound here: a test (or a user's callback) that patches `time.perf_counter` gets no calls from the run.
_clock = time.perf_counter
_wall_ns = time.time_ns
#: Graph breaks that are expected: torch's own (DDP's, FSDP's), and each compiled region, which the step calls as an
#: opaque function.
_EXPECTED_BREAKS = {**private_names.TORCH_BREAKS, "compiled_region": "regions"}
_WHERE = {
    "DDP": "in DDP's own code",
    "regions": "at region boundaries",
    "FSDP": "in FSDP's hooks, which leave the sharded module's own forward uncompiled",
}
_LIMIT_NAME = private_names.RECOMPILE_LIMIT


@dataclass
class _CompileSummary:
    """The counts for one run."""

    stage: str
    graphs: int = 0
    recompiles: int = 0
    graph_breaks: int = 0
    expected_breaks: int = 0
    #: Where the expected breaks are: "DDP", "regions", "FSDP".
    expected_in: set[str] = field(default_factory=set)
    compile_seconds: float = 0.0
    recompile_limit_hits: list[str] = field(default_factory=list)
    #: Steps that ran their own compiled code, and steps that ran none, by kind ("training", "evaluation").
    compiled_steps: dict[str, int] = field(default_factory=dict)
    eager_steps: dict[str, int] = field(default_factory=dict)
    #: Why the eager steps ran eager: the number of steps for each cause.
    eager_causes: dict[str, int] = field(default_factory=dict)
    #: Steps whose own code ran eagerly while graphs of what they call ran, by kind, and why their own code did.
    parts_steps: dict[str, int] = field(default_factory=dict)
    parts_causes: dict[str, int] = field(default_factory=dict)
    #: Whether the run went on uncompiled after a compile error (``fallback="eager"``).
    fell_back: bool = False
    #: What other features say of the run (``run.note``), such as how regions were compiled.
    notes: list[str] = field(default_factory=list)

    def line(self, backend: str, strategy: str) -> str:
        """The one summary line."""
        breaks = _count(self.graph_breaks, "graph break")
        if self.expected_breaks:
            where = ", ".join(_WHERE[key] for key in sorted(self.expected_in))
            breaks += f" ({self.expected_breaks} expected: {where})"
        hits = f", {_count(len(self.recompile_limit_hits), 'recompile-limit hit')}" if self.recompile_limit_hits else ""
        steps = ", ".join(
            f"{kind} {self.compiled_steps.get(kind, 0)} compiled"
            + (f" / {self.parts_steps[kind]} in parts" if self.parts_steps.get(kind) else "")
            + f" / {self.eager_steps.get(kind, 0)} eager"
            for kind in sorted({*self.compiled_steps, *self.parts_steps, *self.eager_steps})
        )
        for label, causes in (("in parts", self.parts_causes), ("eager", self.eager_causes)):
            if causes:
                steps += f" ({label}: {', '.join(f'{n} {cause}' for cause, n in sorted(causes.items()))})"
        return (
            f"`use_compile` ({self.stage}, {strategy}, {backend}): {_count(self.graphs, 'graph')},"
            f" {_count(self.recompiles, 'recompile')}, {breaks}{hits}, steps: {steps or 'none'}"
            f"{' (then uncompiled: fallback)' if self.fell_back else ''},"
            f"{''.join(f' {note},' for note in self.notes)} {self.compile_seconds:.1f} s compiling."
        )


@dataclass(slots=True)  # one a step: slots make it quicker to make and to read
class _Step:
    """One step in progress: what kind it is, and whether a graph of its own compiled code has run during it."""

    kind: str
    #: When it started, in Dynamo's clock for compilation metrics (microseconds since the epoch).
    started_us: int = 0
    compiled: bool = False
    #: Whether a graph of what it calls (a function or module compiled on its own) ran, not of its own code.
    called_graphs: bool = False


#: The steps in progress, innermost last (a compiled run is one at a time in a process).
_STEPS: list[_Step] = []


class _CountingBackend:
    """The run's backend: each graph it compiled marks the step in progress compiled when it runs, if it is its own."""

    def __init__(self, backend: Any, mode: Optional[str], options: Optional[dict], dynamic: Optional[bool]) -> None:
        #: The backend, mode and options it stands for, as given.
        self.given = {k: v for k, v in (("backend", backend), ("mode", mode), ("options", options)) if v is not None}
        self.inner: Any = private_names.backend(backend, mode, options, dynamic)
        self.__name__ = getattr(self.inner, "compiler_name", "backend")

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list, **kwargs: Any) -> Callable:
        compiled = self.inner(gm, example_inputs, **kwargs)
        graph = private_names.undisabled(compiled)  # Dynamo disables itself around `call`: once is enough

        def call(*args: Any) -> Any:
            # whose graph this is can only be told when it runs: a graph compiled while a step ran compiled may run
            # later from a step that runs eagerly (a helper behind a graph break, once the step hit the limit). It
            # counts once it has run: a graph that raised ran nothing.
            out = graph(*args)
            if _STEPS and not _STEPS[-1].compiled:
                step = _STEPS[-1]
                if _runs_in_step_code(private_names.frame_above(1)):
                    step.compiled = True
                else:
                    step.called_graphs = True
            return out

        return private_names.run_like(call, compiled)

    def __getattr__(self, name: str) -> Any:  # `get_compiler_config`, `reset`, ... of the backend itself
        if "inner" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["inner"], name)

    def __deepcopy__(self, memo: dict) -> "_CountingBackend":
        return self  # one per configuration and process (Lightning deep-copies the `torch.compile` arguments)


#: Where the frames between a step's wrapper and its compiled code come from: torch's wrappers, and this package's
#: (the features', and the forward redirection of `lightning_fixes.py`).
_PASS_THROUGH = (str(Path(torch.__file__).parent), str(Path(__file__).parent.parent))
#: Code of Lightning's between the wrapper and the step: the forward redirection's `wrapped_forward` (see `setup`).
_PASS_THROUGH_CODES: set[CodeType] = set()
#: The code of the wrapper that `_CompileReport.timed` puts around each compiled step.
_STEP_WRAPPERS: set[CodeType] = set()


def _runs_in_step_code(frame: Optional[FrameType]) -> bool:
    """Whether a graph that runs now, called from ``frame``, runs as part of a step's own compiled code.

    It does if every frame between it and the step's wrapper runs compiled code (a graph break makes the rest of the
    step, or a function the step calls, a frame of its own) or belongs to torch or this package. It does not if the
    step itself runs eagerly (Dynamo skipped it, or it hit the recompile limit) and a function it calls runs compiled
    on its own, such as the model's ``forward``: a user's frame runs uncompiled in between.

    It runs on every compiled step, so what it found of each code is kept for the run (`_KNOWN_CODES`).

    """
    while frame is not None:
        code = frame.f_code
        known = _KNOWN_CODES.get(id(code))  # by id: hashing a code object hashes its bytecode and constants
        if known is None or known[0] is not code:
            if _contains(_STEP_WRAPPERS, code):
                known = (code, True)
            elif _passes_through(code):
                known = (code, False)
            else:
                return False  # a frame of another's (not remembered: the walk ends at it)
            _KNOWN_CODES[id(code)] = known
        if known[1]:
            return True
        frame = frame.f_back
    return False


#: The codes that `_runs_in_step_code` walked through in this run, by id: each code, and whether it is a step's
#: wrapper. Cleared as a run starts and ends: it holds Dynamo's output codes, which `torch._dynamo.reset` lets go.
_KNOWN_CODES: dict[int, tuple[CodeType, bool]] = {}


def _passes_through(code: CodeType) -> bool:
    """Whether a frame running ``code`` passes a graph's call through to the step: compiled code, torch's, ours."""
    return (
        _contains(private_names.OUTPUT_CODES, code)
        or code.co_filename.startswith(_PASS_THROUGH)
        or _contains(_PASS_THROUGH_CODES, code)
    )


def _contains(codes: Any, code: CodeType) -> bool:
    """``code in codes``, also for a code object that cannot be hashed (one whose constants hold a dict)."""
    try:
        return code in codes
    except TypeError:
        return any(item is code for item in codes)


def _nested_codes(function: Any) -> set[CodeType]:
    """The code objects of the functions defined inside ``function`` (``wrapped_forward`` in the redirection)."""
    code = getattr(getattr(function, "__func__", function), "__code__", None)
    return {const for const in (code.co_consts if code else ()) if isinstance(const, CodeType)}


_Key = tuple[str, str, int]


_NO_TENSOR_WORK = (
    "Dynamo compiled its code and found no tensor operation in it (it sets attributes, logs Python numbers), so it has"
    " no graph to run: it is none the slower for it."
)


def _step_codes(function: Any) -> tuple[list[CodeType], Optional[str]]:
    """The code of a step function and of what it wraps (a user's decorator), and why it is compiler-disabled, if so.

    ``torch.compiler.disable`` marks its wrapper (``private_names.compiler_disabled``).

    """
    codes: list[CodeType] = []
    disabled: Optional[str] = None
    for _ in range(16):  # a chain of wrappers: `functools.partial`, `functools.wraps`, a bound method, `disable`'s
        if function is None:
            break
        if disabled is None:
            disabled = private_names.compiler_disabled(function)
        code = getattr(getattr(function, "__func__", function), "__code__", None)
        if code is not None:
            codes.append(code)
        function = private_names.wrapped_function(function)
    return codes, disabled


def _skip_cause(metrics: Any, suppressed: bool) -> tuple[str, str]:
    """The cause and explanation of a step whose frame Dynamo failed to compile, from its compilation metrics.

    ``fail_reason`` is Dynamo's own message: on torch 2.8+, each graph break's type on its first line, then its
    explanation and hints; where one graph break led to another (a break in a loop skips the frame), both in order.

    """
    fail_type = str(getattr(metrics, "fail_type", "") or "")
    reason = str(getattr(metrics, "fail_reason", "") or "").strip()
    parts = [part.strip() for part in reason.split(private_names.CHAINED_BREAK) if part.strip()] or [fail_type]
    title = parts[-1].splitlines()[0].strip().rstrip(".:")
    where = _where(getattr(metrics, "co_filename", None), getattr(metrics, "co_firstlineno", None))
    name = getattr(metrics, "co_name", "the step")
    soft = "Unsupported" in fail_type or "SkipFrame" in fail_type  # a graph break, not an error
    if suppressed and not soft:
        return "suppressed error", (
            f"Dynamo failed to compile `{name}` ({where}) with `{fail_type.strip('<>')}: {title}`, and"
            " `torch._dynamo.config.suppress_errors` hid the error. Set it to `False` to see the error."
        )
    if "recompile limit" in title.lower() or "cache_size_limit" in title:  # a hit the log watch did not see
        return "recompile limit", _LIMIT_HIT
    in_loop = "loop" in title and "graph break" in title.lower()  # 2.13: "graph break in loop"; 2.6: "Skipping ..."
    label = "graph break in loop" if in_loop else title
    explanation = _explanation(parts[-1]) or title
    context = _explanation(parts[-1], "Developer debug context:")
    if context.startswith("raised exception"):  # what Dynamo saw raised: "raised exception AttributeError(...)"
        explanation = f"{explanation.rstrip('.')} ({context[:300]})"
    behind = ""
    if len(parts) > 1:  # the graph break behind it, and where it is
        filename, line = (getattr(metrics, f"fail_user_frame_{what}", None) for what in ("filename", "lineno"))
        detail = _explanation(parts[0])
        behind = f" The graph break behind it, at {_where(filename, line)}: {parts[0].splitlines()[0].strip()}"
        behind += f" ({detail.rstrip('.')})." if detail else "."
    if in_loop:
        fix = (
            " Move what breaks the graph out of the loop, or move the loop's body into a method of its own: Dynamo then"
            " compiles the body on each iteration, while the loop itself runs uncompiled."
        )
    else:
        fix = " Run with `TORCH_LOGS=graph_breaks` to see the whole reason; keep what Dynamo cannot trace out of it."
    return f"skipped: {label}", (
        f"Dynamo skipped the frame `{name}` ({where}) and runs it uncompiled: {explanation.rstrip('.')}.{behind}{fix}"
    )


def _explanation(part: str, label: str = "Explanation:") -> str:
    """The ``Explanation:`` line, or another ``label``'s, of one part of Dynamo's graph-break message (torch 2.8+)."""
    for line in part.splitlines():
        if line.strip().startswith(label):
            return line.strip()[len(label) :].strip()
    return ""


def _where(filename: Optional[str], line: Optional[int]) -> str:
    return f"{filename}:{line}" if filename else "its code"


#: The counting backends of the last configurations, newest last: Dynamo keys compiled code on the backend object, so
#: that a new one each run would compile everything again. Bounded, so that it keeps no backend of long ago alive.
_COUNTING_BACKENDS: "OrderedDict[str, _CountingBackend]" = OrderedDict()
_KEPT_BACKENDS = 8


def _counting(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], _CountingBackend]:
    """``kwargs`` with the counting backend that stands for their backend, mode and options, and that backend."""
    rest = {key: value for key, value in kwargs.items() if key not in ("backend", "mode", "options")}
    backend, mode, options = kwargs.get("backend"), kwargs.get("mode"), kwargs.get("options")
    key = repr((backend if isinstance(backend, str) else id(backend), mode, options, kwargs.get("dynamic")))
    if key not in _COUNTING_BACKENDS:
        _COUNTING_BACKENDS[key] = _CountingBackend(
            backend, mode, dict(options) if options else None, rest.get("dynamic")
        )
        while len(_COUNTING_BACKENDS) > _KEPT_BACKENDS:
            _COUNTING_BACKENDS.popitem(last=False)
    _COUNTING_BACKENDS.move_to_end(key)
    return {**rest, "backend": _COUNTING_BACKENDS[key]}, _COUNTING_BACKENDS[key]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


class _RecompileLimitWatch(logging.Filter):
    """Turns Dynamo's recompile-limit log record into a Lightning warning that says what to do."""

    def __init__(self, hits: list[str]) -> None:
        super().__init__()
        self._hits = hits
        #: The frames that hit it, as Dynamo names them: name, file, first line.
        self.keys: set[_Key] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if private_names.is_recompile_limit_hit(message):
            function = next((line.strip() for line in message.splitlines() if "function:" in line), "a function")
            self._hits.append(function)
            found = private_names.FRAME_IN_MESSAGE.search(function)
            if found:
                key = (found["name"], found["file"], int(found["line"]))
                self.keys.add(key)
            rank_zero_warn(
                f"`use_compile`: {function} hit Dynamo's recompile limit"
                f" ({_LIMIT_NAME} = {private_names.recompile_limit()}); from now on it runs uncompiled. Its"
                " inputs change in a way that invalidates the compiled code each time (shapes, Python numbers, grad"
                " mode). Run with `TORCH_LOGS=recompiles` to see why, then keep those inputs stable, pass"
                f" `use_compile={{'dynamic': True}}`, or raise `torch._dynamo.config.{_LIMIT_NAME}`."
            )
        return True


_LIMIT_HIT = "its code hit Dynamo's recompile limit (see the warning above)."
_STEP_KINDS = {"training_step": "training", "validation_step": "evaluation", "test_step": "evaluation"}
_STEP_KINDS["predict_step"] = "evaluation"


class _CompileReport:
    """Watches one run: Dynamo's counters, the first compiled steps, recompile-limit hits, and each step."""

    def __init__(self, stage: str, strategy: str, backend: str, skipped: dict[_Key, tuple[str, str]]) -> None:
        self.summary = _CompileSummary(stage)
        #: The causes already warned about: each is told once per run.
        self._warned: set[tuple[str, bool]] = set()
        #: Whether the run went on uncompiled on purpose (``fallback="eager"``): no warning of our own then.
        self.fell_back: Callable[[], bool] = lambda: False
        self.notes: Callable[[], list[str]] = list
        self._strategy = strategy
        self._backend = backend
        # the counters as the run starts: a run that fails before `start` counts nothing of earlier runs
        self._start_us = _wall_ns() // 1000
        self._graphs_before = private_names.graphs_compiled()
        self._breaks_before = private_names.graph_breaks()
        self._watch = _RecompileLimitWatch(self.summary.recompile_limit_hits)
        self._first_step: dict[bool, Optional[float]] = {}
        #: Whether the last compiled call raised: the call after it is the same step, called again by `fallback`.
        self._raised = False
        #: Why the frames of eager steps ran uncompiled, by frame, for every run of the Trainer: Dynamo keeps only its
        #: last 64 metrics, and a frame it skipped in ``fit`` stays skipped in the same Trainer's ``validate``.
        self._skipped = skipped

    def start(self, run: _CompileRun) -> None:
        """Snapshots the counters, starts watching for recompile-limit hits, and counts every step of the run."""
        self._start_us = _wall_ns() // 1000
        self._graphs_before = private_names.graphs_compiled()
        self._breaks_before = private_names.graph_breaks()
        # Dynamo reports a recompile-limit hit only through this logger, so a filter on it is the one way to tell the
        # user when it happens; the run removes it when it ends, on every path
        logger = logging.getLogger(private_names.RECOMPILE_LIMIT_LOGGER)
        logger.addFilter(self._watch)
        run.defer(logger.removeFilter, self._watch, scope="run")
        _KNOWN_CODES.clear()
        run.defer(_KNOWN_CODES.clear, scope="run")
        strategy = run.trainer.strategy
        # the strategy's step methods, for the whole run: a step still counts (as eager) once a fallback has
        # uncompiled the model, and with it the wrappers of `timed`
        for name, kind in _STEP_KINDS.items():
            run.replace(strategy, name, self.counted(getattr(strategy, name), name, kind, run), scope="run")
        redirection = private_names.forward_redirection(strategy)
        if redirection is not None:  # Lightning's own `wrapped_forward` runs between a wrapper and the step
            _PASS_THROUGH_CODES.update(_nested_codes(type(redirection).__call__))

    def counted(self, run_step: Callable, name: str, kind: str, run: _CompileRun) -> Callable:
        """Wraps one of the strategy's step methods to count each step it runs as compiled or eager."""
        compiled_steps = self.summary.compiled_steps

        def call(*args: Any, **kwargs: Any) -> Any:
            step = _Step(kind, started_us=_wall_ns() // 1000)
            _STEPS.append(step)
            try:
                out = run_step(*args, **kwargs)
            finally:
                _STEPS.remove(step)
            # a step that fell back ran eagerly, whatever graphs of its own ran before the part that failed
            if step.compiled and not run.fell_back:
                compiled_steps[kind] = compiled_steps.get(kind, 0) + 1
            else:
                self._count_uncompiled(step, run, name)
            return out

        return call

    def timed(self, compiled: Callable[..., Any]) -> Callable[..., Any]:
        """Wraps a compiled callable to announce the first compiled step of each kind, and how long it took.

        Its code marks where a step's own compiled code starts (see `_runs_in_step_code`).

        """

        def call(*args: Any, **kwargs: Any) -> Any:
            training = torch.is_grad_enabled()
            if training not in self._first_step:
                self._announce_start(training)
            elif self._first_step[training] is not None and not self._raised:
                self._announce_done(training)  # a training step ends after its backward: at the next call
            self._raised = False
            try:
                out = compiled(*args, **kwargs)
            except BaseException:
                # a first step that raised is still being compiled when `fallback`, outside, calls it again; a run
                # that it ends reports no time (`finish`)
                self._raised = True
                raise
            if not training and self._first_step.get(training) is not None:
                self._announce_done(training)
            return out

        _STEP_WRAPPERS.add(call.__code__)
        return call

    def _count_uncompiled(self, step: _Step, run: _CompileRun, name: str) -> None:
        """Counts a step whose own code ran eagerly, by its cause (a compiled step is counted where it ends)."""
        kind, summary = step.kind, self.summary
        in_parts = step.called_graphs and not run.fell_back
        steps = summary.parts_steps if in_parts else summary.eager_steps
        steps[kind] = steps.get(kind, 0) + 1
        step_function = getattr(run.trainer.lightning_module, name, None)
        cause, explanation = self._eager_cause(step_function, step.started_us)
        causes = summary.parts_causes if in_parts else summary.eager_causes
        causes[cause] = causes.get(cause, 0) + 1
        if (cause, in_parts) not in self._warned and cause != "fallback":  # `fallback` warned when it fell back
            self._warned.add((cause, in_parts))
            article = "an" if kind[0] in "aeiou" else "a"
            if in_parts:
                ran = (
                    "ran compiled in parts (its own code eagerly, the graphs of modules or functions it calls compiled)"
                )
                goes_on = "Its own code runs uncompiled where this happens"
            else:
                ran = "ran eagerly (no graph of its own or of what it calls ran)"
                goes_on = "The run goes on uncompiled where this happens"
            rank_zero_warn(
                f"`use_compile`: {article} {kind} step ({summary.stage}) {ran}: {explanation} {goes_on}; the summary at"
                " the end counts such steps by cause."
            )

    def _eager_cause(self, step_function: Any, step_started_us: int) -> tuple[str, str]:
        """Why a step ran eagerly, and what to do: the cause of this step's own frame, and an explanation.

        Where the step's own frame compiled no graph and did not fail (a step that only calls a method, whose frame
        Dynamo skipped), the cause is the first frame that failed to compile while the step ran.

        """
        if self.fell_back():
            return "fallback", "it fell back to eager after a compile error (`fallback='eager'`)."
        codes, disabled = _step_codes(step_function)
        keys = {cast(_Key, private_names.frame_key(code)) for code in codes}
        if disabled is not None:
            return "torch.compiler.disable", (
                f"the step is marked `torch.compiler.disable`{f' ({disabled})' if disabled else ''}, so Dynamo runs it,"
                " and all it calls, uncompiled. Remove the mark to compile it, or mark only the part that cannot be"
                " compiled."
            )
        if keys & self._watch.keys:
            return "recompile limit", _LIMIT_HIT
        for key in keys:  # found for an earlier step of this Trainer's runs
            if key in self._skipped:
                return self._skipped[key]
        suppressed = private_names.errors_suppressed()
        # torch 2.1 has no compilation metrics; each has the frame's name, file and line, and why it failed. Only this
        # run's: an earlier run's failure of the same code may since have been reset (the compile budget, a failed run)
        callee = None
        graphless = False
        for metrics in private_names.compiles_since(self._start_us):  # newest first
            frame = cast(_Key, private_names.frame_key(metrics))
            if not getattr(metrics, "fail_type", None):
                # converted, with no graph: the step's own code computes no tensor (it sets flags, logs numbers)
                graphless |= frame in keys and not getattr(metrics, "graph_op_count", None)
                continue
            if frame in keys:
                self._skipped[frame] = _skip_cause(metrics, suppressed)
                return self._skipped[frame]
            if private_names.started_us(metrics) >= step_started_us:
                callee = metrics  # newest first: the earliest failure while this step ran, at the end
        cause = None
        if callee is not None:
            cause = _skip_cause(callee, suppressed)
        # converted with no graph in this run, or earlier (its entries hold no graph, or none would have run)
        elif private_names.GRAPHLESS_FRAMES_TOLD and (
            graphless or any(private_names.cache_entries(code) for code in codes)
        ):
            cause = ("no tensor work", _NO_TENSOR_WORK)
        if cause is not None:
            for key in keys:
                self._skipped[key] = cause
            return cause
        if suppressed:
            return "suppressed error", (
                "Dynamo failed to compile it and `torch._dynamo.config.suppress_errors` hid the error. Set it to"
                " `False` to see the error."
            )
        return "skipped", (
            "Dynamo ran its code uncompiled, and no compile of it failed in this run: it was skipped after an error"
            " in an earlier run in this process, or marked to be skipped. Run with `TORCH_LOGS=graph_breaks,recompiles`"
            " to see why."
        )

    def _announce_start(self, training: bool) -> None:
        kind = "training" if training else "evaluation"
        rank_zero_info(
            f"`use_compile`: compiling the first {kind} step ({self.summary.stage}, {self._backend});"
            " it takes longer than the steps after it."
        )
        self._first_step[training] = _clock()

    def _announce_done(self, training: bool) -> None:
        started = self._first_step[training]
        assert started is not None
        kind = "training" if training else "evaluation"
        rank_zero_info(f"`use_compile`: the first compiled {kind} step took {_clock() - started:.1f} s.")
        self._first_step[training] = None

    def finish(self, completed: bool) -> _CompileSummary:
        """Fills in the summary and logs it; ``completed``: the run ended without an error."""
        self.summary.fell_back = self.fell_back()
        self.summary.notes = self.notes()
        for training, started in self._first_step.items():
            # the step ended (a training step's backward too), and compiled
            if started is not None and completed and not self.summary.fell_back:
                self._announce_done(training)
        summary = self.summary
        summary.graphs = private_names.graphs_compiled() - self._graphs_before
        for reason, count in private_names.graph_breaks().items():
            new = count - self._breaks_before.get(reason, 0)
            summary.graph_breaks += new
            sources = {
                source for marker, source in _EXPECTED_BREAKS.items() if marker in reason or marker in reason.lower()
            }
            if sources and new:
                summary.expected_breaks += new
                summary.expected_in |= sources
        # torch 2.1 has no per-frame compilation metrics: the run then counts no recompiles and no compile time
        for metrics in private_names.compilation_metrics():
            if private_names.started_us(metrics) < self._start_us:
                continue
            summary.recompiles += bool(metrics.cache_size)
            summary.compile_seconds += metrics.entire_frame_compile_time_s or 0.0
            summary.compile_seconds += (metrics.backward_cumulative_compile_time_us or 0) / 1e6
        rank_zero_info(summary.line(self._backend, self._strategy))
        return summary


class _Summary(_CompileFeature):
    """Tells what the compiler did: the first compiled steps, recompile-limit hits, and one summary line per run."""

    keys = {"summary": "True: count the steps that ran compiled and eager, and warn of each eager step's cause"}
    order = 1  # innermost: its wrapper marks where the step's compiled code starts, a few frames above each graph

    def __init__(self, options: _CompileOptions) -> None:
        _flag(options, "summary")
        self._report: Optional[_CompileReport] = None
        self._skipped: dict[_Key, tuple[str, str]] = {}

    def compile_kwargs(self, run: _CompileRun, kwargs: Mapping[str, Any]) -> Mapping[str, Any]:
        # every compile of the run (regions, compiled autograd) runs the counting backend
        trainer = run.trainer
        assert trainer.state.fn is not None
        backend = kwargs.get("backend") or "inductor"
        backend = backend if isinstance(backend, str) else getattr(backend, "__name__", type(backend).__name__)
        counted, _ = _counting(kwargs)
        self._report = _CompileReport(trainer.state.fn.value, type(trainer.strategy).__name__, backend, self._skipped)
        self._report.fell_back = lambda: run.fell_back
        self._report.notes = lambda: [text for note in run.notes if (text := note())]
        return counted

    def setup(self, run: _CompileRun) -> Mapping[str, Any]:
        assert self._report is not None
        self._report.start(run)
        return {}

    def wrap(self, run: _CompileRun, compiled: Callable, original: Callable) -> Callable:
        assert self._report is not None
        return self._report.timed(compiled)

    def teardown(self, run: _CompileRun) -> None:
        report, self._report = self._report, None
        if report is not None:
            _LAST_SUMMARY[run.trainer] = report.finish(run.trainer.state.status != TrainerStatus.INTERRUPTED)


#: What the compiler did in each Trainer's last run that compiled, for :func:`last_summary` (it goes with the Trainer).
_LAST_SUMMARY: "weakref.WeakKeyDictionary[Any, _CompileSummary]" = weakref.WeakKeyDictionary()


def last_summary(trainer: Any) -> Optional[_CompileSummary]:
    """What the compiler did in ``trainer``'s last run that compiled anything; ``None`` before such a run."""
    return _LAST_SUMMARY.get(trainer)


FEATURE = _Summary
