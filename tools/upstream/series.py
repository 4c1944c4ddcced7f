"""The upstream ladder: what each patch adds to, and changes in, Lightning's tree, for each base.

The core stack comes first: four fixes of Lightning's own compile helpers, each of which can merge alone, then the
connector in three rungs (the re-apply, ``use_compile``, the feature seam). Every later patch is one feature module
(``compile_features/<key>.py``) with its tests, docs section and CHANGELOG line, and needs only the core stack. New
source files are the package's Lightning-side modules (``upstream_modules.UPSTREAM_MODULES``); what is listed here are
the edits of Lightning's own files, each an exact text replacement, so that a change in Lightning is noticed rather than
patched around.

Two bases: ``2.6.6`` (forks of the release; each patch is made on the previous one, for a plain ``git am``) and
``master`` (the PR; each later patch is made on the core stack alone, and the edits of a shared file sit at anchors of
their own, so that ``git am -3`` takes any subset in order).

"""

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from upstream import package_module

HERE = Path(__file__).parent
trainer_api = package_module("_monkeypatch.trainer_api")
TRAINER = "src/lightning/pytorch/trainer/trainer.py"
CHANGELOG = "src/lightning/pytorch/CHANGELOG.md"
COMPILE_UTILS = "src/lightning/pytorch/utilities/compile.py"
STRATEGY = "src/lightning/pytorch/strategies/strategy.py"
FABRIC_WRAPPERS = "src/lightning/fabric/wrappers.py"
FABRIC_CHANGELOG = "src/lightning/fabric/CHANGELOG.md"
COMPILE_DOCS = "docs/source-pytorch/advanced/compile.rst"
TRAINER_DOCS = "docs/source-pytorch/common/trainer.rst"
COMPILE_TESTS = "tests/tests_pytorch/utilities/test_compile.py"
FABRIC_WRAPPER_TESTS = "tests/tests_fabric/test_wrappers.py"
BASES = ("2.6.6", "master")
#: The Lightning commit the master series is made on; ``docs/upstreaming.md`` records it too.
MASTER_COMMIT = "7f0c3436cd3f6ad3753125672024fc415cbcb414"
ISSUE = "([#20242](https://github.com/Lightning-AI/pytorch-lightning/issues/20242))"


@dataclass(frozen=True)
class Replace:
    """Replace ``old`` with ``new`` in ``path``; ``old`` must occur exactly ``count`` times."""

    path: str
    old: str
    new: str
    count: int = 1
    bases: tuple[str, ...] = BASES

    def __post_init__(self) -> None:
        if not (self.old.endswith("\n") and self.new.endswith("\n")):
            raise ValueError(f"an edit of {self.path} must replace whole lines: {self.old[:60]!r}")


@dataclass(frozen=True)
class ReplaceDef:
    """Replace the function ``name`` (a method of ``cls``, if given) in ``path`` with its fixed version.

    The fixed version is the package's ``lightning_fixes`` module's, which the package installs over Lightning's.
    """

    path: str
    name: str
    cls: Optional[str] = None
    bases: tuple[str, ...] = BASES
    #: Functions of ``lightning_fixes`` that Lightning does not have, added after this one.
    then: tuple[str, ...] = ()


@dataclass(frozen=True)
class Patch:
    """One commit of the ladder."""

    subject: str
    body: str
    #: Package modules this patch adds to Lightning's tree (keys of ``UPSTREAM_MODULES``).
    modules: tuple[str, ...]
    #: Upstream test files this patch adds, relative to ``tools/upstream/tests``.
    tests: tuple[str, ...] = ()
    edits: tuple = ()
    bases: tuple[str, ...] = BASES
    #: Where the package holds a later rung of a module this patch adds, or of a function it fixes: the folder of
    #: ``tools/upstream/rungs/`` with this patch's own version of them, plain files. Empty: the package's version.
    rung: str = ""


def _indent(text: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line if line else "" for line in text.splitlines())


def _doc(name: str) -> str:
    return (HERE / "docs" / f"{name}.rst").read_text()


def _heading(title: str) -> str:
    stars = "*" * len(title)
    return f"{stars}\n{title}\n{stars}\n"


def _section_before(title: str, doc: str) -> Replace:
    """Adds the docs section ``doc`` to ``compile.rst`` right before the section called ``title``."""
    return Replace(COMPILE_DOCS, _heading(title), _doc(doc) + "----\n\n" + _heading(title))


_UNRELEASED = "## [unreleased] - YYYY-MM-DD\n\n### Added\n\n"
#: On master, each later patch's CHANGELOG line goes after an entry of its own, so that the lines never touch.
_MASTER_ADDED = (
    "- Added `suggest_integrations` flag",
    "- Fixed ``ModelParallelStrategy`` single-file checkpointing",
    "- Fixed gradient clipping not working with fused optimizers",
    "- Added `log_key_prefix` parameter",
    "- Added support for remote storage (fsspec URLs) when saving and loading distributed checkpoints with `FSDP",
    "- Added support for remote storage (fsspec URLs) when saving and loading distributed checkpoints with `Model",
    "- Added `Trainer(use_compile=...)`, which compiles the model after the strategy has wrapped it",  # from 0001
)


#: On master, the CHANGELOG line of a later patch that fixes what a compiled model did before goes after one of these.
_MASTER_FIXED = (
    "- Fixed crash when calling ``self.log()`` inside a ``torch.compile``-wrapped",
    "- Fixed PyTorch Lightning profiler not capturing dataloader worker initialization time",
    "- Fixed non-zero process exits in `CombinedLoader.reset()`",
    "- Fixed `SIGTERMException` producing a zero exit code",
    "- fixed AccumulateGrad stream mismatch warning",
    "- Fixed `FSDPStrategy` raising `RuntimeError` under PyTorch 2.5+ when `root_device` is CPU",
    "- Fixed `LightningModule.toggle_optimizer` / `untoggle_optimizer` breaking under `torch.compile`",
    "- Fixed arbitrary code execution in `load_from_checkpoint`",
)


def _changelog_fixed(entry: str, slot: int) -> tuple["InsertAfter", ...]:
    """The ``Fixed`` line of a later patch: first under ``Fixed`` on 2.6.6, after master's entry ``slot`` on master."""
    return (
        InsertAfter(CHANGELOG, "### Fixed", f"\n{entry}\n", bases=("2.6.6",)),
        InsertAfter(CHANGELOG, _MASTER_FIXED[slot], f"\n{entry}\n", bases=("master",)),
    )


def _changelog_added(entry: str, slot: int) -> tuple[Replace, ...]:
    """The CHANGELOG line of a later patch: first under ``Added`` on 2.6.6, after master's entry ``slot`` on master."""
    return (
        Replace(CHANGELOG, _UNRELEASED, f"{_UNRELEASED}{entry}\n\n", bases=("2.6.6",)),
        InsertAfter(CHANGELOG, _MASTER_ADDED[slot], f"\n{entry}\n", bases=("master",)),
    )


@dataclass(frozen=True)
class InsertAfter:
    """Insert ``text`` (whole lines) after the one line of ``path`` that starts with ``prefix``.

    In a CHANGELOG, only the lines of the unreleased section count.
    """

    path: str
    prefix: str
    text: str
    bases: tuple[str, ...] = BASES


@dataclass(frozen=True)
class AddTests:
    """Add the tests of ``source`` to Lightning's test file ``path``, right after its test function ``after``.

    ``source`` (relative to ``tools/upstream/tests``) is a module that runs on its own there; what ``path`` gets is its
    code after its imports. Each of its imports must be one that ``path`` already has, or a ``from`` import of a module
    that ``path`` does not import from yet, which is added among ``path``'s imports, in order.
    """

    path: str
    source: str
    after: str
    bases: tuple[str, ...] = BASES

    def _tree(self) -> ast.Module:
        return ast.parse((HERE / "tests" / self.source).read_text())

    def imports(self) -> list[ast.stmt]:
        """The source's top-level imports."""
        return [node for node in self._tree().body if isinstance(node, (ast.Import, ast.ImportFrom))]

    def body(self) -> str:
        """The source's code after its last top-level import."""
        lines = (HERE / "tests" / self.source).read_text().splitlines(keepends=True)
        return "".join(lines[max(node.end_lineno or 0 for node in self.imports()) :]).lstrip("\n")

    def node_ids(self) -> list[str]:
        """The pytest node ids of the tests it adds, relative to Lightning's ``tests/``."""
        names = [n.name for n in self._tree().body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
        return [f"{self.path.removeprefix('tests/')}::{name}" for name in names]


_UNWRAP_OLD = "model = _maybe_unwrap_optimized(model)"
_UNWRAP_NEW = "model = _maybe_unwrap_optimized(self._compile_connector.unwrap(model))"
_USE_COMPILE_ARG = f"        {trainer_api.NAME}: {trainer_api.ANNOTATION_SOURCE} = {trainer_api.DEFAULT},\n"
_USE_COMPILE_DOC = f"{_indent(trainer_api.DOC, 12)}\n"
#: Lightning's own `Trainer._teardown`, which runs even when the connector's teardown raises.
_LIGHTNING_TEARDOWN = """\
        self.strategy.teardown()
        loop = self._active_loop
        # loop should never be `None` here but it can because we don't know the trainer stage with `ddp_spawn`
        if loop is not None:
            loop.teardown()
        self._logger_connector.teardown()
        self._signal_connector.teardown()
"""

_FIXED_REDIRECTION = (
    "- Fixed the LightningModule's `forward` running a step method (and DDP's gradient sync staying off under manual"
    " optimization) after a step under DDP or FSDP raised"
)
_FIXED_FROM_COMPILED = (
    "- Fixed `from_compiled` raising for a LightningModule with a step set to `None`, which prevented passing such a"
    " model compiled to the Trainer"
)
_FIXED_TO_UNCOMPILED = (
    "- Fixed `to_uncompiled` leaving bound copies of the step methods on the instance, which hid a method patched on"
    " the class later"
)

_FIXED_FABRIC_CAPTURE = (
    "- Fixed `Fabric.setup` compiling a `torch.compile`-d model again with a copy of its backend object, and"
    " `torch.compile` failing for a backend that cannot be copied once `lightning` is imported"
)

_FIXED_FABRIC_REDIRECTION = (
    "- Fixed the module's `forward` running a step (or a method marked with `mark_forward_method`) after a call of it"
    " through the wrapper (DDP, FSDP) raised"
)

FIX_FORWARD_REDIRECTION = Patch(
    subject="Fix the forward redirection leaving `forward` patched when the wrapped call raises",
    body="""\
To run a step method through the DDP/FSDP wrapper's forward, the Trainer's
`_ForwardRedirection` and Fabric's `_FabricModule._redirection_through_forward` patch the
LightningModule's `forward`, and unpatch it from inside the patched `forward`. When the
wrapper's call raises before it gets there (a forward pre-hook that raises, an error in DDP's
pre-forward, a KeyboardInterrupt), the module kept the patched `forward`: its next call, `model(x)`,
ran the step method instead and returned its output (a dict with the loss). Both now restore it in
a `finally`, while the patched `forward` is still there (a `forward` that the step sets itself
stays, as before), and the Trainer's redirection calls `on_after_outer_forward` there too: under
manual optimization DDP's turns gradient sync back on, which `on_after_inner_forward` had turned
off.

Issue text:

    `model(x)` runs `training_step` after a failed step under DDP (Trainer and Fabric)

    Under DDP or FSDP, a step is rerouted through the wrapper's forward by patching the
    LightningModule's `forward`. If the wrapper's forward raises before calling the module (a
    forward pre-hook raising once, a compile error, Ctrl-C), the patch stays: afterwards
    `model(x)` returns the step's output. Repro (Fabric, CPU): wrap a module whose wrapper raises
    once in `forward`, call `fabric_module.training_step()`, catch the error, then call
    `fabric_module(x)`: it returns what `training_step` returns.""",
    modules=(),
    edits=(
        AddTests(
            "tests/tests_pytorch/strategies/test_ddp.py",
            "tests_pytorch/strategies/test_forward_redirection.py",
            after="test_ddp_dont_configure_sync_batchnorm",
        ),
        AddTests(
            FABRIC_WRAPPER_TESTS,
            "tests_fabric/test_wrappers_forward_redirection.py",
            after="test_step_method_redirection",
        ),
        ReplaceDef(STRATEGY, "__call__", cls="_ForwardRedirection"),
        ReplaceDef(FABRIC_WRAPPERS, "_redirection_through_forward", cls="_FabricModule"),
        Replace(
            CHANGELOG,
            "### Removed\n\n-\n\n### Fixed\n\n-\n",
            f"### Removed\n\n-\n\n### Fixed\n\n{_FIXED_REDIRECTION}\n",
            bases=("2.6.6",),
        ),
        InsertAfter(CHANGELOG, _MASTER_FIXED[2], f"\n{_FIXED_REDIRECTION}\n", bases=("master",)),
        Replace(
            FABRIC_CHANGELOG,
            "### Removed\n\n-\n\n### Fixed\n\n-\n",
            f"### Removed\n\n-\n\n### Fixed\n\n{_FIXED_FABRIC_REDIRECTION}\n",
            bases=("2.6.6",),
        ),
        InsertAfter(
            FABRIC_CHANGELOG,
            "- Fixed AccumulateGrad stream mismatch warning when using DDP with Fabric",
            f"\n{_FIXED_FABRIC_REDIRECTION}\n",
            bases=("master",),
        ),
    ),
)

FIX_FROM_COMPILED = Patch(
    subject="Fix `from_compiled` raising for a LightningModule with a step set to `None`",
    body="""\
Setting a step to `None` (`model.validation_step = None`) is how a loop is turned off, and
`from_compiled` raised on it ("A callable function is expected"), so such a model could not be
passed to the Trainer compiled. It now compiles only the steps that are callable.""",
    modules=(),
    edits=(
        ReplaceDef(COMPILE_UTILS, "from_compiled"),
        *_changelog_fixed(_FIXED_FROM_COMPILED, 4),  # an entry away from the previous fix's line: each applies alone
        # after the Trainer's tests of a compiled model, apart from where the next fix adds its tests
        AddTests(
            COMPILE_TESTS,
            "tests_pytorch/utilities/test_compile_from_compiled.py",
            after="test_trainer_compiled_model_ddp",
        ),
    ),
)

FIX_TO_UNCOMPILED = Patch(
    subject="Fix `to_uncompiled` leaving the step methods behind on the instance",
    body="""\
`to_uncompiled` put each original step back as an instance attribute holding a bound method: a
reference cycle (module, bound method, module) that keeps the model alive until the cycle
collector runs, and a method patched on the class later (a test's `monkeypatch`) was ignored by
that instance. A step that is the class's own method is now removed from the instance
instead, which restores the model's own methods. (`_ForwardRedirection` leaves `forward` as an instance-bound
method in the same way; that predates this and is left for a patch of its own.)""",
    modules=(),
    edits=(
        ReplaceDef(COMPILE_UTILS, "to_uncompiled"),
        *_changelog_fixed(_FIXED_TO_UNCOMPILED, 7),
        AddTests(
            COMPILE_TESTS, "tests_pytorch/utilities/test_compile_to_uncompiled.py", after="test_compile_uncompile"
        ),
    ),
)

FIX_FABRIC_CAPTURE = Patch(
    subject="Fix `Fabric.setup` compiling a compiled model again with a copy of its backend",
    body="""\
Fabric captures the arguments of `torch.compile` so that `Fabric.setup` can compile the model
again after the strategy wraps it (`_reapply_compile`, #19280). It kept a deep copy of them,
the backend included, so the model was compiled again with a copy of the user's backend object:
a backend that counts graphs or holds state (`torch._dynamo.testing.CompileCounter`, a backend
that records graphs for a profiler) saw none of them. And since the capture replaces
`torch.compile` itself once `lightning` is imported, any `torch.compile(model, backend=...)` of a
backend that cannot be copied (one that holds a lock) failed, Fabric or not. A backend given as a
name or a plain function was never affected: `deepcopy` returns a function itself. The capture
now keeps every argument as it was passed, but for a shallow copy of the `options` dict, which
the caller may change later (its values, which inductor lets be objects, are not copied). It
also keeps them on the compiled module itself: `OptimizedModule.__setattr__` sets an attribute on
the module inside (torch 2.6 and later), so a second `torch.compile` of the same module replaced
the first one's arguments, and `Fabric.setup` compiled the first with the second's. The module
inside keeps a deep copy, as before: a copy or a pickle of the compiled module (Fabric's
`ddp_spawn` launcher) rebuilds it from the module inside, and finds them there, and the module
pickles as on master. Where the arguments cannot be copied (a backend holding a lock, which
master refused at `torch.compile`), the module inside keeps none, so it still pickles. So
`compiled._compile_kwargs = None`, which sets the module inside's, no longer hides the compiled
module's own: `test_unwrap_compiled` used it to stand for a module compiled before `lightning`
was imported, and now compiles one without the capture (`torch.compile.__wrapped__`) instead.

**Tests.** Seven in `tests_fabric/test_wrappers.py`: on master, five fail (the backend object
compiled again, a backend that cannot be copied, and the module picklable with it, the values of
`options` copied, two compiles of one module); two guard what must stay (the arguments kept as
passed, and those of a deep copy of a compiled module). With this patch,
`tests_fabric/test_wrappers.py` and `tests_fabric/test_fabric.py` pass on torch 2.13 (128 passed,
57 skipped).

Issue text:

    `Fabric.setup` compiles with a copy of my `torch.compile` backend object

    Repro (CPU): `backend = CompileCounter()`, `module = fabric.setup(torch.compile(model,
    backend=backend))`, `module(x)`: `backend.frame_count` stays 0, because Fabric compiled
    the wrapped model again with `copy.deepcopy(backend)`.""",
    modules=(),
    edits=(
        ReplaceDef(FABRIC_WRAPPERS, "_capture_compile_kwargs"),
        Replace(
            FABRIC_WRAPPER_TESTS,
            "    compiled._compile_kwargs = None\n",
            "    # compiled without the capture, as before `lightning` is imported (setting\n"
            "    # `compiled._compile_kwargs` sets the module inside's, and leaves the compiled module's own)\n",
        ),
        Replace(
            FABRIC_WRAPPER_TESTS,
            "        _unwrap_compiled(compiled)\n",
            "        _unwrap_compiled(torch.compile.__wrapped__(torch.nn.Linear(1, 1)))\n",
        ),
        AddTests(FABRIC_WRAPPER_TESTS, "tests_fabric/test_wrappers_compile_capture.py", after="test_unwrap_compiled"),
        InsertAfter(FABRIC_CHANGELOG, "### Fixed", f"\n{_FIXED_FABRIC_CAPTURE}\n", bases=("2.6.6",)),
        InsertAfter(
            FABRIC_CHANGELOG,
            "- Fixed DeepSpeed checkpoint path validation rejecting remote filesystem URIs",
            f"\n{_FIXED_FABRIC_CAPTURE}\n",
            bases=("master",),
        ),
    ),
)

_FIXED_SPAWN = (
    '- Fixed `strategy="ddp_spawn"` failing to pickle a `torch.compile`-d model ("Can\'t pickle'
    " BoringModel.forward: it's not the same object\" from PyTorch 2.6, a local object of Dynamo's before): the model"
    " is pickled plain, and each process compiles its steps with the same `torch.compile` arguments\n\n"
    "- Fixed a model passed to the Trainer compiled a second time having its compiled steps compiled over again, so"
    " that `to_uncompiled` did not give the plain model back"
)

_REAPPLY_TESTS = "tests_pytorch/trainer/test_trainer_reapply_compile.py"

REAPPLY = Patch(
    subject="Fix `ddp_spawn` with a `torch.compile`-d model and don't compile already-compiled steps again",
    body="""\
The Trainer compiles the steps of a `torch.compile`-d LightningModule (`from_compiled`) as soon
as it is passed to `fit`/`validate`/`test`/`predict`, before the strategy's launcher runs. Under
`strategy="ddp_spawn"` (any launcher that starts its processes with `spawn` or `forkserver`) the
launcher pickles the model, and a compiled step does not pickle: "Can't pickle
<function BoringModel.forward>: it's not the same object" (PyTorch 2.6 and later).

**What changes.**
- Under such a launcher, the Trainer takes the LightningModule out of its `torch.compile`
  wrapper with Fabric's `_unwrap_compiled`, which returns the arguments that Fabric's capture of
  `torch.compile` recorded. The plain model is pickled, and each process compiles its steps with
  those arguments (`from_compiled`) right after `strategy.setup`, before any hook runs a step
  (the tuner's trials run in `on_fit_start`). The model of the main process stays plain, as
  everything the processes change of the model does. The strategy check of a compiled model
  (`_verify_strategy_supports_compile`, now `_verify_strategy_can_compile` with the same message)
  runs for the unwrapped model too.
- A model whose arguments are unknown (compiled before `lightning` was imported) cannot be
  compiled in each process: under such a launcher the Trainer warns that its launch will fail to
  pickle it, and why, and otherwise runs it as before.
- Every other launcher (none, `ddp`'s subprocess launcher, `ddp_fork`, `ddp_notebook`) is
  unchanged: the steps are compiled when the model is passed in and stay compiled after the run.
- A model passed compiled a second time (`fit(torch.compile(model))` twice) had its compiled
  steps compiled over again, so `to_uncompiled` did not give the plain model back. Its earlier
  compile is now undone first, on every launcher, and its own steps are compiled.

It needs the previous patch (the fix of Fabric's capture), so that the arguments hold the user's
backend object itself, not a copy.

Not in this PR: compiling the strategy's wrapper (DDP, FSDP) after the setup, as Fabric does by
default (#19382) and as #20269 proposed. That changes what every distributed user runs, and
#20269 was closed, so it is a separate change that needs a maintainer decision first.

**Tests.** `test_trainer_reapply_compile.py`, 6 tests on CPU (2 processes where a launcher runs).
On master 4 fail: `ddp_spawn` with a compiled model (which also runs the tuner's trials,
compiled, in each process), a model passed compiled a second time (2), and the warning for
unknown arguments under `ddp_spawn`, with none on one device. Two `ddp_fork` tests pass on master
and guard what must not change: `test(model)` after `fit(torch.compile(model))` runs compiled on
each rank, and `to_uncompiled(model)` works after `fit`. The file also fails on two mutants of
this patch: no unwrap (master's placement) and the compile after the `on_fit_start` hooks.""",
    modules=("compile_connector",),
    rung="reapply",
    tests=(_REAPPLY_TESTS,),
    edits=(
        Replace(
            TRAINER,
            "from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector\n",
            "from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector\n"
            "from lightning.pytorch.trainer.connectors.compile_connector import _CompileConnector\n",
        ),
        Replace(
            TRAINER,
            "        # init connectors\n",
            "        # init connectors\n        self._compile_connector = _CompileConnector(self)\n",
        ),
        Replace(TRAINER, f"\n        {_UNWRAP_OLD}\n", f"\n        {_UNWRAP_NEW}\n"),
        Replace(TRAINER, f"\n            {_UNWRAP_OLD}\n", f"\n            {_UNWRAP_NEW}\n", count=3),
        Replace(
            TRAINER,
            "        # strategy will configure model and move it to the device\n        self.strategy.setup(self)\n\n",
            "        # strategy will configure model and move it to the device\n        self.strategy.setup(self)\n"
            "        # compile what the strategy runs, now that it has set the model up, before any hook runs a step\n"
            "        self._compile_connector.compile()\n\n",
        ),
        ReplaceDef(COMPILE_UTILS, "_verify_strategy_supports_compile", then=("_verify_strategy_can_compile",)),
        *_changelog_fixed(_FIXED_SPAWN, 1),
        _section_before("Avoid graph breaks", "reapply_compile"),
    ),
)

USE_COMPILE = Patch(
    subject="Add `Trainer(use_compile=...)` to compile any model after the strategy sets it up",
    body="""\
#20242 asks for a flag. `Trainer(use_compile=True | dict)` compiles any model's steps right after
the strategy's setup, as the previous patch does for a compiled model under `ddp_spawn`, with the
defaults of `torch.compile` or with the arguments in the dict, which `torch.compile` itself
checks when the Trainer is built (a dry call that builds the backend), so that a typo fails at
`Trainer(...)` rather than minutes into the run. `use_compile=False`, like the default `None`,
means the Trainer compiles nothing of its own: a model compiled by hand runs exactly as without
the flag. What the Trainer compiles of a model passed in plain, it undoes in `_teardown`, on
every path (after a step that raised too): the model is plain again after the run, and pickles.
A compiled model passed in without the flag stays compiled after the run, as on master; with the
flag, the Trainer compiles it with the flag's arguments, and undoes that too.

Who needs a flag rather than `fit(torch.compile(model))`: LightningCLI and YAML configs, which
build the model and cannot wrap it in `torch.compile` (#17283 got CLI workarounds), and
libraries that build their own Trainer from their user's Trainer arguments. That is the one
case that passing `torch.compile(model)` does not cover. lantiga's comment in the review of
#20269 argued against a flag there ("I don't think we need reapply_compile, we will want this
whenever we have an optimized model in input"): about a compiled model passed in, which needs
none. A model whose layers are built in `configure_model` does not need the flag
(`torch.compile` is lazy: `fit(torch.compile(model))` compiles them), nor does `validate` after
`fit` (the model's steps stay compiled).

The question for the maintainers: #15914 (`Trainer(compile=...)`) was closed for #15922 ("pass
`torch.compile(model)`"). With the previous patch merged, is a Trainer argument worth having for
configuration-driven compiles? The alternatives, without one:
- `fit(torch.compile(model))`: a config-built model cannot be wrapped without code (a custom
  `LightningCLI` subclass, a library's option);
- a `compile` hyperparameter of the LightningModule that compiles its own submodules (in
  `__init__` or `configure_model`): it works from a YAML config today, with no Trainer change.
  It is the strongest alternative: what it lacks is one switch for any model, such as a
  library's, whose code the user does not write;
- a `Callback` that compiles `trainer.strategy.model`, which a config sets through
  `trainer.callbacks`: its `setup` runs before the strategy's, and its `on_fit_start` after the
  tuner's trials (the callback connector moves `LearningRateFinder` and `BatchSizeFinder`
  first), which would run uncompiled; it would undo the compile in every stage itself. One
  shipped by Lightning (as `StochasticWeightAveraging` is) is the closest alternative to a flag,
  given a place before the tuner's callbacks.
- a `LightningCLI` option that wraps the model it builds in `torch.compile`: the Trainer
  unchanged, but libraries that build their own Trainer are not covered.
What a flag costs: a longer Trainer signature, and a dict that mirrors `torch.compile`'s
arguments, which change between torch versions (2.13 added `recompile_limit` and
`isolate_recompiles`): the dict takes what the installed torch's `torch.compile` takes.
If the answer is no, this patch stays out and the previous one stands alone.

Proposed for the review, each a small change if the maintainers prefer otherwise:
- three values: `True` or a dict (every model compiled after the setup), and `None` (default)
  or `False`, which mean the same: the Trainer compiles nothing of its own, and a model compiled
  by hand runs as without the flag. (An earlier version refused a compiled model with `False`;
  a reviewer pointed out that a YAML `use_compile: false` added to a script that passes
  `torch.compile(model)` then broke it.)
- With `True` or a dict, a model compiled by hand that the flag disagrees with (other arguments
  once `torch.compile`'s defaults are left out, with a `None` read as what it stands for:
  `backend=None` is inductor; `from_compiled`; or compiled before `lightning` was imported) is
  refused when the run starts, before anything runs, rather than one of the two compiles picked
  with a warning. The same arguments are taken: compiled once.

`use_compile` needs torch 2.6, the oldest it is tested with, and is refused at `Trainer(...)`
before that, as is a strategy that cannot run compiled (DeepSpeed).""",
    modules=("compile_connector",),
    rung="use_compile",
    tests=("tests_pytorch/trainer/test_trainer_use_compile.py",),
    edits=(
        Replace(
            TRAINER,
            "        model_registry: Optional[str] = None,\n    ) -> None:\n",
            f"        model_registry: Optional[str] = None,\n{_USE_COMPILE_ARG}    ) -> None:\n",
            bases=("2.6.6",),
        ),
        Replace(
            TRAINER,
            "        suggest_integrations: bool = True,\n    ) -> None:\n",
            f"        suggest_integrations: bool = True,\n{_USE_COMPILE_ARG}    ) -> None:\n",
            bases=("master",),
        ),
        Replace(
            TRAINER,
            "            model_registry: The name of the model being uploaded to Model hub.\n\n        Raises:\n",
            "            model_registry: The name of the model being uploaded to Model hub.\n\n"
            f"{_USE_COMPILE_DOC}\n        Raises:\n",
            bases=("2.6.6",),
        ),
        Replace(
            TRAINER,
            "            suggest_integrations: Whether to display suggestions for optional Lightning integrations.\n"
            "                Default: ``True``.\n",
            "            suggest_integrations: Whether to display suggestions for optional Lightning integrations.\n"
            f"                Default: ``True``.\n\n{_USE_COMPILE_DOC}",
            bases=("master",),
        ),
        Replace(
            TRAINER,
            "        self._compile_connector = _CompileConnector(self)\n",
            "        self._compile_connector = _CompileConnector(self, use_compile)\n",
        ),
        Replace(
            TRAINER,
            '        those are handled by :meth:`_call_teardown_hook`."""\n' + _LIGHTNING_TEARDOWN,
            '        those are handled by :meth:`_call_teardown_hook`."""\n'
            "        try:\n            self._compile_connector.teardown()\n        finally:\n"
            + _indent(_LIGHTNING_TEARDOWN, 4)
            + "\n",
        ),
        Replace(
            TRAINER,
            "            plugins=plugins,\n        )\n        self._logger_connector = _LoggerConnector(self)\n",
            "            plugins=plugins,\n        )\n        self._compile_connector.verify_strategy()\n"
            "        self._logger_connector = _LoggerConnector(self)\n",
        ),
        ReplaceDef(COMPILE_UTILS, "_verify_strategy_can_compile"),
        Replace(
            CHANGELOG,
            f"{_UNRELEASED}-\n",
            f"{_UNRELEASED}- Added `Trainer(use_compile=...)`, which compiles the model after the strategy has wrapped"
            " it, in every stage, with `torch.compile` arguments checked when the Trainer is built\n",
            bases=("2.6.6",),
        ),
        Replace(
            CHANGELOG,
            _UNRELEASED,
            f"{_UNRELEASED}- Added `Trainer(use_compile=...)`, which compiles the model after the strategy has wrapped"
            " it, in every stage, with `torch.compile` arguments checked when the Trainer is built\n\n",
            bases=("master",),
        ),
        Replace(
            TRAINER_DOCS,
            "use_distributed_sampler\n^^^^^^^^^^^^^^^^^^^^^^^\n",
            _doc("trainer_flag") + "use_distributed_sampler\n^^^^^^^^^^^^^^^^^^^^^^^\n",
        ),
        _section_before("Avoid graph breaks", "use_compile"),
    ),
)

FEATURE_SEAM = Patch(
    subject="Add a seam for compile features of `Trainer(use_compile=...)` (fork-only)",
    body="""\
Fork-only: the seam that the later patches plug their features into, kept out of the patches above.
Each module of `trainer/connectors/compile_features/` names a `_CompileFeature` as `FEATURE`; it
owns keys of the `use_compile` dict, and is built only for a Trainer whose `use_compile` sets one of
them (`_CompileConnector.defaults`, empty here, lets a distribution turn features on by default), so
a feature left unset changes nothing. Its hooks get the run (`compile_features/_run.py`), never the
connector nor another feature: the Trainer, the run's compile arguments as a frozen value (a hook
returns new ones), and the one owner of everything the run changes outside itself (an attribute, a
torch setting, an environment variable), which records each change in one of two scopes, what is
compiled and what belongs to the run, and undoes it on every path. The seam runs one way: the
connector imports `compile_features`, and no feature imports the connector. One compiled run at a
time per process: Dynamo's counters and settings are process-wide. The private torch names the
features need (Dynamo's counters, compilation metrics, per-code resets, compiled autograd's switch,
DDP's python reducer) are reached only in `compile_features/_private_names.py`, each with the torch
versions it is read on, so that a torch release that moves one changes one line. With `use_compile`
set, `ModelParallelStrategy` is accepted too (the later patches that compile under it check what
they compile); a compiled model passed in without `use_compile` is checked as before. Where DDP runs
its python reducer (`torch._dynamo.config.optimize_ddp = "python_reducer"`, which compiled autograd
needs), the seam compiles DDP's call in place instead, to train, as Fabric does, so that DDP's
forward is traced with the training step and its `_pre_forward` runs compiled; fit's evaluation runs
DDP's own call into the validation step compiled on the module. Under DDP's C++ reducer, DDP's own
code runs as Python whatever compiles it, so only the steps are compiled there, as in the previous
patches. The features' hooks run in the order of `compile_features.FEATURES`, which names the
features of the later patches; a Lightning runs those whose modules it has, so each later patch adds
its module alone. And at the end of every run that compiled, the code that runs share (torch's,
Lightning's, the model's classes') whose entries the run grew past half of Dynamo's recompile limit
is reset, so that a process that fits many models compiles every fit without
`torch.compiler.reset()`; a function the user compiled keeps its entries (a compiled torch module or
a compiled method of the model called with many shapes during the run does not: it compiles again
after it). A distribution that turns features on for a compiled model passed in without
`use_compile` (`_CompileConnector.input_defaults`, empty here) has it unwrapped under every
launcher, compiled after the setup and undone after the run, since the features act on that compile;
the Trainer then warns when the model comes back without its `torch.compile` wrapper to a later
stage, which runs uncompiled. With `input_defaults` empty, a compiled model passed in runs as with
the previous patches. This patch adds no feature.""",
    modules=("compile_features", "compile_features._private_names", "compile_features._run", "compile_connector"),
    tests=("tests_pytorch/trainer/connectors/test_compile_features.py",),
    edits=(
        Replace(
            TRAINER,
            "    ) -> Optional[Union[_EVALUATE_OUTPUT, _PREDICT_OUTPUT]]:\n"
            "        if self.state.fn == TrainerFn.FITTING:\n",
            "    ) -> Optional[Union[_EVALUATE_OUTPUT, _PREDICT_OUTPUT]]:\n"
            "        self._compile_connector.on_run_start(model)\n\n"
            "        if self.state.fn == TrainerFn.FITTING:\n",
        ),
        InsertAfter(
            COMPILE_DOCS,
            "The dict takes the arguments of ``torch.compile``",
            "\nThe features below each take a key of the dict of their own, and do nothing unless it is set.\n",
        ),
    ),
)


def _feature(
    name: str,
    subject: str,
    body: str,
    docs_before: Union[str, InsertAfter],
    entry: str,
    slot: int,
    more_tests: tuple[str, ...] = (),
    modules: tuple[str, ...] = (),
    fixed: bool = False,
    **kwargs: object,
) -> Patch:
    """A later patch: one feature module, its tests (``test_compile_<name>.py``, ``more_tests``), docs and CHANGELOG.

    ``docs_before``: the title of the section of ``compile.rst`` that its docs section goes before, or its own edit of
    ``compile.rst``. ``fixed``: its CHANGELOG line is a ``Fixed`` one, and ``slot`` an index of ``_MASTER_FIXED``.
    """
    docs = docs_before if isinstance(docs_before, InsertAfter) else _section_before(docs_before, name)
    return Patch(
        subject=subject,
        body=body,
        modules=modules or (f"compile_features.{name}",),
        tests=(f"tests_pytorch/trainer/connectors/test_compile_{name}.py", *more_tests),
        edits=(docs, *(_changelog_fixed if fixed else _changelog_added)(entry, slot)),
        **kwargs,  # type: ignore[arg-type]
    )


LOG_DEFERRAL = _feature(
    "defer_logging",
    "Keep `self.log` out of the graphs compiled by `Trainer(use_compile=...)`",
    """\
Dynamo cannot trace `self.log` on recent PyTorch, and a graph break at each call splits the step
into several graphs. While a step is traced, `self.log`/`self.log_dict` now only record their
arguments, and the records are replayed eagerly, in order, right after the compiled step returns:
one graph per step, and `fullgraph=True` works with models that log.

Not part of the master series: master has #21837, which compiler-disables `LightningModule.log`.""",
    "Avoid recompilation",
    "- Added logging under `Trainer(use_compile=...)` without graph breaks: `self.log` calls made while a step is"
    f" compiled are replayed after it {ISSUE}",
    0,
    bases=("2.6.6",),
)
RUN_SUMMARY = _feature(
    "summary",
    "Tell what `Trainer(use_compile=...)` compiled: first steps, recompile limit, summary",
    """\
A cold compile looks like a run that hangs at step 0, and a frame that hits Dynamo's recompile limit
silently runs uncompiled from then on. The run now says when the first compiled step of each kind
starts and how long it took, warns when a frame hits the recompile limit (with what to do), and logs
one summary line per run: graphs, recompiles, graph breaks and compile time.

The recompile-limit warning needs a filter on Dynamo's logger for the run (Dynamo reports the hit
only there); it is removed in the run's teardown, on every path.""",
    "Experiment with compilation options",
    f"- Added a summary of what `Trainer(use_compile=...)` compiled, and a warning at Dynamo's recompile limit {ISSUE}",
    0,
)
FALLBACK = _feature(
    "fallback",
    "Name the run in compile errors of `Trainer(use_compile=...)`, and add `fallback`",
    """\
A compile error deep inside Dynamo does not say which run it belongs to. It is now raised again with
the stage, the strategy and the `use_compile` value, after every module is uncompiled. With
`use_compile={"fallback": "eager"}` the run warns once instead and continues uncompiled.""",
    "A note about torch.compile in practice",
    f'- Added `Trainer(use_compile={{"fallback": "eager"}})` to continue uncompiled when compilation fails {ISSUE}',
    1,
    modules=("compile_features.compile_errors", "compile_features.fallback"),
)
OPTIMIZE_DDP = _feature(
    "optimize_ddp",
    "Choose DDP's graph split by world size in `Trainer(use_compile=...)`",
    """\
DDPOptimizer splits the compiled graph at DDP's buckets so that all-reduce overlaps the backward. With
one process there is nothing to overlap and the split only costs. `optimize_ddp="auto"` (the default
of the new key) splits only with more than one process; a value set by the user in
`torch._dynamo.config` is kept. `torch._dynamo.config.optimize_ddp` is process-wide: it is set before
the strategy builds DDP (DDP reads "python_reducer" in its constructor) and restored when the run
ends, on every path.""",
    "Limitations",
    f'- Added `Trainer(use_compile={{"optimize_ddp": ...}})`, which splits DDP\'s graph only with more than one process'
    f" {ISSUE}",
    2,
)
REGIONS = _feature(
    "regions",
    "Add regional compilation to `Trainer(use_compile=...)`",
    """\
`use_compile={"regions": "auto" | classes | class names}` compiles each repeated block of the model
on its own, in place, after the strategy has wrapped the model, and compiles the rest of the step
around them. Identical blocks share one compiled graph, so the cold start no longer grows with the
depth of the model (torchtitan's per-block compile, pytorch/torchtitan#61).

"auto" picks the children of every `ModuleList`/`Sequential` whose children share one class; when
matches nest, the outermost wins; a value that matches nothing fails before training with the list
of repeated blocks the model has.""",
    "Apply torch.compile in configure_model",
    '- Added `Trainer(use_compile={"regions": ...})` to compile each repeated block of a model on its own, which'
    f" shortens the first step of deep models {ISSUE}",
    3,
)
TENSOR_PARALLEL = _feature(
    "check_tensor_parallel",
    "Refuse what tensor parallelism cannot compile whole in `Trainer(use_compile=...)`",
    """\
Under FSDP2, Dynamo does not trace the sharded modules' hooks (they are compiler-disabled), so a
whole model compiles each module call on its own, and a module's tensor-parallel hooks apart from
its `forward`. A vocabulary-parallel embedding (`RowwiseParallel` on `nn.Embedding`) returns a
partial DTensor that cannot cross that graph boundary, and compilation failed deep in AOTAutograd
("Mixing fake modes NYI"). That case is now refused in the first step's setup, before any weight
changes, with an error that names `use_compile={"regions": "auto"}`: regions compile such a module
with its hooks, in one graph. Tensor parallelism under `use_compile` was tested on torch 2.13 (CPU,
gloo, on a 2x2 mesh with FSDP2); on another torch it warns.

Comes after the regions patch: the module imports nothing of it, but its test trains the 2x2 mesh
with regions too.""",
    InsertAfter(
        COMPILE_DOCS, "For a full example, see our `FP8 Distributed Transformer example", _doc("check_tensor_parallel")
    ),
    "- Fixed `Trainer(use_compile=...)` failing deep in the compiler on a whole model sharded with `fully_shard` whose"
    " embedding is vocabulary-parallel: it is refused before the first step, naming `regions` as the fix, and tensor"
    f" parallelism warns on a torch it was not tested on {ISSUE}",
    1,
    fixed=True,
)
CACHE = _feature(
    "cache",
    "Add a warm-start compile cache to `Trainer(use_compile=...)`",
    """\
`use_compile={"cache": DIR | True}` loads, before the first compiled step, the artifacts that
`torch.compiler.save_cache_artifacts` saved at the end of the previous run of the same configuration
on the same rank, and saves them again at the end of the run. The configuration (model class and
parameter shapes, strategy, world size, precision, device, versions, compile arguments) selects the
folder; inductor's on-disk cache for it lives there too (`TORCHINDUCTOR_CACHE_DIR` is set for the
run, unless the user set it, and restored on every path).""",
    "Additional Resources",
    '- Added `Trainer(use_compile={"cache": ...})`, a compile cache that lets the next run of the same configuration'
    f" start warm {ISSUE}",
    4,
)

COMPILED_AUTOGRAD = _feature(
    "compiled_autograd",
    "Add compiled autograd to `Trainer(use_compile=...)`, with DDP's python reducer",
    """\
Compiled autograd traces the backward pass when it runs and compiles it, and under DDP's python
reducer the gradient all-reduces become part of that graph. Set up by hand (as in #20242), it works
in one process only: a context manager in the parent never reaches `ddp_spawn`'s processes, and DDP
chooses its reducer once, when it is built.

`use_compile={"compiled_autograd": True | dict}` enters compiled autograd for the run in each
process, with the step's `torch.compile` arguments or its own, and leaves it on every path. Under
DDP it sets `optimize_ddp="python_reducer"` before the strategy builds DDP and checks that DDP uses
it, broadcasts the buffers before each forward as DDP does (the python reducer skips that), and when
the run ends removes the reducer's gradient hooks and restores the settings DDP changed for the
process. A conflicting `optimize_ddp`, `bucket_cap_mb_list` and strategies other than DDP and a
single device are refused when the Trainer is built.""",
    "Avoid recompilation",
    '- Added `Trainer(use_compile={"compiled_autograd": ...})` to compile the backward pass too, with DDP\'s'
    f" all-reduces inside it {ISSUE}",
    6,
)

METRICS = Patch(
    subject="Keep torchmetrics out of the graphs compiled by `Trainer(use_compile=...)`",
    body="""\
A `torchmetrics.Metric` counts its updates in a Python int (`_update_count`), which Dynamo guards
on, so a step that calls a metric recompiles at every step until it reaches the recompile limit,
and runs uncompiled from then on: a torchmetrics user got an uncompiled validation loop. For the
run, the `forward`, `update` and `compute` of each metric of the model are compiler-disabled on the
instance (a graph break at each call, one compile) and put back when the run ends.""",
    modules=("compile_features.eager_metrics",),
    tests=("tests_pytorch/trainer/connectors/test_compile_eager_metrics.py",),
    edits=(
        InsertAfter(COMPILE_DOCS, "If you still see recompilation issues after dealing", _doc("eager_metrics")),
        *_changelog_fixed(
            "- Fixed a step that calls a `torchmetrics` metric recompiling at every step under `torch.compile`, until"
            f" the recompile limit made it run uncompiled {ISSUE}",
            0,
        ),
    ),
)

LOOP_COUNTERS = Patch(
    subject="Keep `current_epoch` and `global_step` from recompiling steps compiled by `Trainer(use_compile=...)`",
    body="""\
A step that reads `self.current_epoch` or `self.global_step` (a curriculum, a KL-annealing weight)
reads an int through the module, which Dynamo guards by its value: the step compiled again at every
new epoch or step until it reached the recompile limit, and ran uncompiled from then on (from the
8th epoch for `if self.current_epoch == 0:`, from the 8th step for `self.global_step`).
`dynamic=True` does not change that, since it applies to the step's inputs. For the run, the ints
under the Trainer's loops are marked dynamic with `torch.compiler.config.dynamic_sources` (torch
2.8+), which is restored when the run ends, on every path.""",
    modules=("compile_features.dynamic_loop_counters",),
    tests=("tests_pytorch/trainer/connectors/test_compile_dynamic_loop_counters.py",),
    edits=(
        InsertAfter(
            COMPILE_DOCS, "On PyTorch 2.2 and later, ``torch.compile`` will detect", _doc("dynamic_loop_counters")
        ),
        *_changelog_fixed(
            "- Fixed a step that reads `self.current_epoch` or `self.global_step` recompiling at every epoch or step"
            f" under `Trainer(use_compile=...)`, until the recompile limit made it run uncompiled {ISSUE}",
            5,
        ),
    ),
)
COMPILE_BUDGET = Patch(
    subject="Give each Trainer's runs under `Trainer(use_compile=...)` their own recompile budget",
    body="""\
Dynamo keeps its compiled entries, its recompile count and its "skip" marks per code object for the
life of the process. In a hyperparameter sweep (one model class, a new Trainer and another width per
trial), every trial added entries to the same step methods, and under DDP to `_ForwardRedirection`,
which every model shares: from the 9th trial on one device, and the 5th under DDP, every step ran
uncompiled. When a run starts for another Trainer than the last compiled run of the process, each
code object that Dynamo first converted during a compiled run and that holds more than half of the
recompile limit in entries is now reset (`torch._C._dynamo.eval_frame.reset_code`), so this Trainer
compiles it afresh. A step keeps at most four entries in steady state, so repeated runs of one
configuration (cross-validation) keep reusing their compiled code, and the runs of one Trainer share
theirs; code compiled outside the Trainer's runs is left alone.""",
    modules=("compile_features.compile_budget",),
    tests=("tests_pytorch/trainer/connectors/test_compile_compile_budget.py",),
    edits=(
        InsertAfter(COMPILE_DOCS, "**When your training suddenly becomes slow", _doc("compile_budget")),
        *_changelog_fixed(
            "- Fixed the Trainers of a sweep in one process running uncompiled under `Trainer(use_compile=...)` once"
            f" Dynamo's recompile limit was reached by earlier Trainers {ISSUE}",
            6,
        ),
    ),
)

TRAINER_STATE = Patch(
    subject="Compile steps once per stage under `Trainer(use_compile=...)`, keyed on the Trainer's state",
    body="""\
A step that picks a value from a dict keyed by `self.trainer.state.stage` (a metric's name, as
libraries built on Lightning do) reused the sanity check's trace in every later validation
epoch: Dynamo puts no guard on an Enum used as a dict key (a torch bug, reported with a repro),
so `val_loss` was logged as `sanity_check_loss`, and `ReduceLROnPlateau`, `EarlyStopping` and
`ModelCheckpoint` on `val_loss` never saw it. With `use_compile={"stage_guards": True}`, the
Trainer's state takes a subclass of `TrainerState` per `(fn, stage)` for the run, switched when
Lightning sets either: Dynamo guards the type, so such a step compiles once per stage. The state
compares, prints and pickles as a `TrainerState`, and its class is put back after the run.""",
    modules=("compile_features.stage_guards",),
    tests=("tests_pytorch/trainer/connectors/test_compile_stage_guards.py",),
    edits=(
        InsertAfter(
            COMPILE_DOCS,
            "There are a few limitations you should be aware of when using ``torch.compile`` **in conjunction",
            _doc("stage_guards"),
        ),
        *_changelog_added(
            '- Added `Trainer(use_compile={"stage_guards": True})`, so that a compiled step that picks a value by the'
            f" Trainer's stage does not reuse another stage's trace {ISSUE}",
            5,
        ),
    ),
)
EVALUATION_NO_GRAD = Patch(
    subject="Run evaluation under `torch.no_grad` while `Trainer(use_compile=...)` compiles, on request",
    body="""\
Fit validates under `torch.no_grad`; `validate`, `test` and `predict` run under
`torch.inference_mode` by default, whose tensors carry other dispatch keys, so `validate` after
`fit` compiled the validation step a second time, and Dynamo fails on some steps under inference
mode that compile under `no_grad` (indexing with a numpy array: "Guard failed on the same frame
it was created"; a torch bug, reported with a repro). With
`use_compile={"no_grad_evaluation": True}` the three run under `torch.no_grad` for the run; the
Trainer's own `inference_mode` is put back after it.""",
    modules=("compile_features.no_grad_evaluation",),
    tests=("tests_pytorch/trainer/connectors/test_compile_no_grad_evaluation.py",),
    edits=(
        InsertAfter(
            COMPILE_DOCS,
            "  The last batch in your training loop will be smaller and trigger a recompilation.",
            _doc("no_grad_evaluation"),
        ),
        Replace(
            CHANGELOG,
            "### Changed\n\n-\n",
            '### Changed\n\n- Added `Trainer(use_compile={"no_grad_evaluation": True})` to run `validate`, `test` and'
            f" `predict` under `torch.no_grad` while the Trainer compiles {ISSUE}\n",
        ),
    ),
)

PARAM_GROUPS = _feature(
    "dynamic_lr",
    "Keep the learning rate a step reads from recompiling it under `Trainer(use_compile=...)`",
    """\
Dynamo treats an optimizer specially and guards every value of its `param_groups` (the learning
rate, Adam's betas), so a step that logs `self.optimizers().param_groups[0]["lr"]` under a
per-step scheduler recompiled at every step until the recompile limit made it run uncompiled.
With `use_compile={"dynamic_lr": True}`, while a step is traced `self.optimizers()` returns a
view of each optimizer whose `param_groups` is the optimizer's own list, which Dynamo reads as a
plain list: the learning rate costs one recompile at its first change and none after. The view
of a `LightningOptimizer` is a `LightningOptimizer` (only not an instance of the `torch.optim`
class, which is what Dynamo guards), built from the strategy's optimizers, so no hook of the
module runs that the step did not call; a module that defines `optimizers` itself keeps it.""",
    InsertAfter(COMPILE_DOCS, "Here are some common scenarios when this can happen:", _doc("dynamic_lr")),
    "- Fixed a step that reads the learning rate from `self.optimizers()` recompiling at every step under"
    f' `Trainer(use_compile={{"dynamic_lr": True}})` {ISSUE}',
    3,
    fixed=True,
)
STEP_OUTPUTS = _feature(
    "list_outputs",
    "Keep a list a step appends to from recompiling it under `Trainer(use_compile=...)`",
    """\
`self.outputs.append(loss)` in a step, read in `on_train_epoch_end` as the docs show, made
Dynamo guard on the list's length: two uncompiled steps per epoch. With
`use_compile={"list_outputs": True}`, during each compiled call a list of the module that the
step only appends to or indexes stands behind a view whose methods run eagerly on the real list.""",
    InsertAfter(COMPILE_DOCS, "- You are using dataset with different inputs or shapes", _doc("list_outputs")),
    "- Fixed a step that appends to a list of the module recompiling under"
    f' `Trainer(use_compile={{"list_outputs": True}})` {ISSUE}',
    2,
    fixed=True,
)
OPTIMIZER_STEPS = _feature(
    "eager_optimizer_steps",
    "Run manual optimization's optimizer steps outside the graph under `Trainer(use_compile=...)`",
    """\
Under manual optimization, `opt.step()` is traced inside the compiled step, so each change of
the learning rate by a scheduler recompiled the optimizer's code, the recompile limit was hit,
and the loss drifted from eager's; a GAN recompiled once per optimizer. With
`use_compile={"eager_optimizer_steps": True}`, `LightningOptimizer.step` and `zero_grad`, each
scheduler's `step` and `toggle_optimizer`/`untoggle_optimizer` run outside the graph for the
run. They are disabled on the run's own objects, never on a shared class: each
`LightningOptimizer` has a class of its own already, and each scheduler gets one for the run (a
subclass of the same name). Each calls the method it replaces, looked up when called, so a test's
mock of `torch.optim.SGD.step` still sees every call.""",
    InsertAfter(COMPILE_DOCS, "Always compare the speed and memory usage", _doc("eager_optimizer_steps")),
    "- Fixed manual optimization recompiling at each change of the learning rate under"
    f' `Trainer(use_compile={{"eager_optimizer_steps": True}})` {ISSUE}',
    7,
    fixed=True,
)

IN_PARTS = _feature(
    "in_parts",
    "Compile the modules a step calls where `Trainer(use_compile=...)` cannot compile the step whole",
    """\
Dynamo gives up on a whole frame in some steps: a graph break inside a loop (truncated BPTT as
`common/tbptt.rst` writes it, a `print` in a `for` loop) or an exception raised inside the traced
code that nothing there handles ("Observed exception", a tensor subclass whose `shape` reads
`super().shape`). It then runs the frame uncompiled, and the modules of `torch.nn` that the frame
calls too: a step that loops over chunks calling two `nn.Sequential` ran no graph at all. With
`use_compile={"in_parts": True}`, each submodule of the LightningModule that holds parameters is
compiled in place for the run, at every depth, through a function with a code object of its own
(Dynamo keeps entries and counts recompiles per code object). Where the step compiles whole, its
graph traces through them as before: the same graph, no graph break. Where it does not, each module
call runs its own graph. Under a single device and DDP; metrics, what regions compiled and a step
marked `torch.compiler.disable` are left as they are.""",
    "Avoid graph breaks",
    "- Fixed a step that PyTorch cannot compile whole running wholly uncompiled: with"
    f' `Trainer(use_compile={{"in_parts": True}})` the modules it calls run compiled {ISSUE}',
    4,
    fixed=True,
)

SERIES: tuple[Patch, ...] = (
    FIX_FORWARD_REDIRECTION,
    FIX_FROM_COMPILED,
    FIX_TO_UNCOMPILED,
    FIX_FABRIC_CAPTURE,
    REAPPLY,
    USE_COMPILE,
    FEATURE_SEAM,
    LOG_DEFERRAL,
    RUN_SUMMARY,
    FALLBACK,
    OPTIMIZE_DDP,
    REGIONS,
    TENSOR_PARALLEL,
    CACHE,
    COMPILED_AUTOGRAD,
    METRICS,
    LOOP_COUNTERS,
    COMPILE_BUDGET,
    TRAINER_STATE,
    EVALUATION_NO_GRAD,
    PARAM_GROUPS,
    STEP_OUTPUTS,
    OPTIMIZER_STEPS,
    IN_PARTS,
)


#: The patches up to and including the feature seam: every later patch applies on them alone.
CORE_STACK = SERIES[: SERIES.index(FEATURE_SEAM) + 1]


def series(base: str) -> tuple[Patch, ...]:
    """The patches of the ladder for ``base``, with only the edits meant for it."""
    return tuple(
        Patch(**{**patch.__dict__, "edits": tuple(e for e in patch.edits if base in e.bases)})
        for patch in SERIES
        if base in patch.bases
    )
