"""The upstream patch series: what each patch adds to, and changes in, Lightning's tree.

New source files are not listed here: they are the package's Lightning-side modules (``UPSTREAM_MODULES``), rendered
for the features each patch has reached. What is listed are the edits of Lightning's own files (each an exact text
replacement, so that a change in Lightning is noticed rather than patched around), and the upstream-only files
(Lightning-style tests, docs text).

"""

from dataclasses import dataclass, field
from pathlib import Path

from upstream import package_module

HERE = Path(__file__).parent
trainer_api = package_module("trainer_api")
TRAINER = "src/lightning/pytorch/trainer/trainer.py"
CHANGELOG = "src/lightning/pytorch/CHANGELOG.md"
COMPILE_DOCS = "docs/source-pytorch/advanced/compile.rst"
COMPILE_TESTS = "tests/tests_pytorch/utilities/test_compile.py"


@dataclass(frozen=True)
class Replace:
    """Replace ``old`` with ``new`` in ``path``; ``old`` must occur exactly ``count`` times."""

    path: str
    old: str
    new: str
    count: int = 1

    def __post_init__(self) -> None:
        if not (self.old.endswith("\n") and self.new.endswith("\n")):
            raise ValueError(f"an edit of {self.path} must replace whole lines: {self.old[:60]!r}")


@dataclass(frozen=True)
class Patch:
    """One commit of the series."""

    subject: str
    body: str
    #: The ``# patch: <feature>`` tag this patch switches on in the Lightning-side modules (None: the untagged code).
    feature: str | None
    #: Package modules this patch adds to Lightning's tree.
    modules: tuple[str, ...]
    #: Upstream test files this patch adds, relative to ``tools/upstream/tests``.
    tests: tuple[str, ...] = ()
    edits: tuple[Replace, ...] = field(default_factory=tuple)


def _indent(text: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line if line else "" for line in text.splitlines())


def _changelog(entry: str) -> Replace:
    """Adds ``entry`` as the first line under ``### Added`` of the unreleased section."""
    return Replace(
        CHANGELOG,
        "## [unreleased] - YYYY-MM-DD\n\n### Added\n\n",
        f"## [unreleased] - YYYY-MM-DD\n\n### Added\n\n{entry}\n\n",
    )


_AVOID_GRAPH_BREAKS = "----\n\n******************\nAvoid graph breaks\n******************\n"
_UNWRAP_OLD = "model = _maybe_unwrap_optimized(model)"
_UNWRAP_NEW = "model = _maybe_unwrap_optimized(self._compile_connector.unwrap(model))"

USE_COMPILE = Patch(
    subject="Add `Trainer(use_compile=...)` to compile the model after the strategy wraps it",
    body="""\
The Trainer compiles a `torch.compile`-d LightningModule's step methods before the strategy wraps
it, so DDP's own pre- and post-forward run outside the compiled code, and the docs say the Trainer
does not reapply `torch.compile` over DDP/FSDP (#20242).

`Trainer(use_compile=True | dict)` compiles, in place, what the strategy calls, after
`strategy.setup`, in every stage: the DDP/FSDP wrapper while fitting (every step goes through its
forward), the `*_step` methods otherwise. In-place compilation keeps the wrapper's type, so the
`isinstance(model, DistributedDataParallel)` checks hold, and keeps the state-dict keys. Everything
is undone in `_teardown`.

With the default `use_compile=None`, a compiled model passed to `fit` is unwrapped and compiled again
with the same arguments after the wrap, as Fabric's `_reapply_compile` does (as suggested when #20269
was closed). `use_compile=False` keeps the previous behavior.

`self.log` calls made while a step is traced are recorded and replayed right after the compiled step,
so logging no longer breaks the graph. The value is validated in `Trainer.__init__`.""",
    feature=None,
    modules=("config", "log_boundary", "report", "connector"),
    tests=("tests_pytorch/trainer/test_trainer_use_compile.py",),
    edits=(
        Replace(
            TRAINER,
            "from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector\n",
            "from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector\n"
            "from lightning.pytorch.trainer.connectors.compile_connector import _CompileConnector\n",
        ),
        Replace(
            TRAINER,
            "        model_registry: Optional[str] = None,\n    ) -> None:\n",
            "        model_registry: Optional[str] = None,\n"
            f"        {trainer_api.NAME}: {trainer_api.ANNOTATION_SOURCE} = {trainer_api.DEFAULT},\n"
            "    ) -> None:\n",
        ),
        Replace(
            TRAINER,
            "            model_registry: The name of the model being uploaded to Model hub.\n\n        Raises:\n",
            "            model_registry: The name of the model being uploaded to Model hub.\n\n"
            f"{_indent(trainer_api.DOC, 12)}\n\n        Raises:\n",
        ),
        Replace(
            TRAINER,
            '        log.debug(f"{self.__class__.__name__}: Initializing trainer with parameters: {locals()}")\n',
            '        log.debug(f"{self.__class__.__name__}: Initializing trainer with parameters: {locals()}")\n'
            "        self._compile_connector = _CompileConnector(self, use_compile)\n",
        ),
        Replace(
            TRAINER,
            "            plugins=plugins,\n        )\n        self._logger_connector = _LoggerConnector(self)\n",
            "            plugins=plugins,\n        )\n        self._compile_connector.verify_strategy()\n"
            "        self._logger_connector = _LoggerConnector(self)\n",
        ),
        Replace(TRAINER, f"\n        {_UNWRAP_OLD}\n", f"\n        {_UNWRAP_NEW}\n"),
        Replace(TRAINER, f"\n            {_UNWRAP_OLD}\n", f"\n            {_UNWRAP_NEW}\n", count=3),
        Replace(
            TRAINER,
            "    ) -> Optional[Union[_EVALUATE_OUTPUT, _PREDICT_OUTPUT]]:\n"
            "        if self.state.fn == TrainerFn.FITTING:\n",
            "    ) -> Optional[Union[_EVALUATE_OUTPUT, _PREDICT_OUTPUT]]:\n"
            "        self._compile_connector.on_run_start(model)\n\n"
            "        if self.state.fn == TrainerFn.FITTING:\n",
        ),
        Replace(
            TRAINER,
            "        self._signal_connector.register_signal_handlers()\n\n",
            "        self._signal_connector.register_signal_handlers()\n\n"
            "        # compile what the strategy runs, now that it has wrapped the model\n"
            "        self._compile_connector.compile()\n\n",
        ),
        Replace(
            TRAINER,
            '        those are handled by :meth:`_call_teardown_hook`."""\n        self.strategy.teardown()\n',
            '        those are handled by :meth:`_call_teardown_hook`."""\n'
            "        self._compile_connector.teardown()\n        self.strategy.teardown()\n",
        ),
        _changelog(
            "- Added `Trainer(use_compile=...)`, which compiles the model after the strategy has wrapped it, in every"
            " stage; a compiled model passed to `fit` is now compiled again after the wrap with the same arguments"
            " ([#20242](https://github.com/Lightning-AI/pytorch-lightning/issues/20242))"
        ),
        Replace(
            COMPILE_DOCS, _AVOID_GRAPH_BREAKS, (HERE / "docs" / "use_compile.rst").read_text() + _AVOID_GRAPH_BREAKS
        ),
        Replace(
            COMPILE_DOCS,
            "* The Trainer currently does not reapply ``torch.compile`` over"
            " :class:`~lightning.pytorch.strategies.DDPStrategy` and"
            " :class:`~lightning.pytorch.strategies.FSDPStrategy`, meaning distributed operations can't benefit from"
            " speed ups at the moment.\n"
            "  This limitation can be avoided by using"
            " :class:`~lightning.pytorch.strategies.model_parallel.ModelParallelStrategy`, as described in"
            " `Apply torch.compile in configure_model`_ above.\n",
            "* Without ``use_compile``, the Trainer compiles the model's methods before the strategy wraps it, so"
            " the operations of :class:`~lightning.pytorch.strategies.DDPStrategy` and"
            " :class:`~lightning.pytorch.strategies.FSDPStrategy` stay outside the compiled code.\n"
            "  Pass ``use_compile`` (see `Compile after the strategy wraps the model`_ above), or use"
            " :class:`~lightning.pytorch.strategies.model_parallel.ModelParallelStrategy`, as described in"
            " `Apply torch.compile in configure_model`_ above.\n",
        ),
        Replace(
            COMPILE_DOCS,
            "* In some cases, using ``self.log()`` in your LightningModule will cause compilation errors.\n"
            "  Until addressed, you can work around these issues by applying ``torch.compile`` to the submodule(s) of"
            " your LightningModule rather than to the entire LightningModule at once.\n",
            "* In some cases, using ``self.log()`` in a compiled LightningModule will cause compilation errors.\n"
            "  With ``use_compile``, logging is replayed outside the compiled graph. Otherwise, you can work around"
            " these issues by applying ``torch.compile`` to the submodule(s) of your LightningModule rather than to"
            " the entire LightningModule at once.\n",
        ),
        Replace(
            COMPILE_TESTS,
            '    trainer.fit(compiled_model)\n    assert trainer.model._compiler_ctx["compiler"] == "dynamo"\n',
            "    trainer.fit(compiled_model)\n"
            "    # unwrapped, to be compiled again after the strategy wraps it (`use_compile=None`)\n"
            "    assert trainer.model._compiler_ctx is None\n",
            count=2,
        ),
        Replace(
            COMPILE_TESTS,
            '    with pytest.raises(RuntimeError, match="Using a compiled model is incompatible with the current'
            ' strategy.*"):\n',
            '    with pytest.raises(ValueError, match="does not support the strategy `DeepSpeedStrategy`"):\n',
        ),
    ),
)

REGIONS = Patch(
    subject="Add regional compilation to `Trainer(use_compile=...)`",
    body="""\
`use_compile={"regions": "auto" | classes | class names}` compiles each repeated block of the model
on its own, in place, after the strategy has wrapped the model, and compiles the rest of the step
around them as before. Identical blocks share one compiled graph, so the cold start no longer grows
with the depth of the model (torchtitan's per-block compile, pytorch/torchtitan#61).

"auto" picks the children of every `ModuleList`/`Sequential` whose children share one class; when
matches nest, the outermost wins; a value that matches nothing fails before training with the list
of repeated blocks the model has. Blocks compile with static shapes unless `dynamic` is given: a
partial last batch recompiles the shared graph once, not each block.""",
    feature="regions",
    modules=("regions",),
    tests=("tests_pytorch/utilities/test_compile_regions.py",),
    edits=(
        _changelog(
            '- Added `Trainer(use_compile={"regions": ...})` to compile each repeated block of a model on its own,'
            " which shortens the first step of deep models"
            " ([#20242](https://github.com/Lightning-AI/pytorch-lightning/issues/20242))"
        ),
        Replace(
            COMPILE_DOCS,
            _AVOID_GRAPH_BREAKS,
            (HERE / "docs" / "regions.rst").read_text() + _AVOID_GRAPH_BREAKS,
        ),
    ),
)

CACHE = Patch(
    subject="Add a warm-start compile cache to `Trainer(use_compile=...)`",
    body="""\
`use_compile={"cache": DIR | True}` loads, before the first compiled step, the artifacts that
`torch.compiler.save_cache_artifacts` saved at the end of the previous run of the same configuration
on the same rank, and saves them again at the end of the run. The configuration (model class,
strategy, world size, precision, device, versions, compile arguments) selects the folder; inductor's
on-disk cache for it lives there too, which keeps the compiled C++ kernels on CPU.

A file that cannot be read, or that was written for another configuration, is ignored with a warning
and the run compiles cold; writing the file never fails the run.""",
    feature="cache",
    modules=("cache",),
    tests=("tests_pytorch/utilities/test_compile_cache.py",),
    edits=(
        _changelog(
            '- Added `Trainer(use_compile={"cache": ...})`, a compile cache that lets the next run of the same'
            " configuration start warm ([#20242](https://github.com/Lightning-AI/pytorch-lightning/issues/20242))"
        ),
        Replace(COMPILE_DOCS, _AVOID_GRAPH_BREAKS, (HERE / "docs" / "cache.rst").read_text() + _AVOID_GRAPH_BREAKS),
    ),
)

SERIES: tuple[Patch, ...] = (USE_COMPILE, REGIONS, CACHE)
