"""Regional compilation: compile each repeated block on its own, and the rest of the step around them.

A model of ``N`` identical blocks compiles one block's graph once and runs it ``N`` times, instead of tracing and
compiling ``N`` copies inside one big graph, so the cold start stops growing with the depth of the model::

    training_step ── compiled: the loss, logging, the rest of the step
      model.forward ── plain Python: its loop over the blocks cannot be compiled around them
        embeddings ─── a region of its own
        block 0 ──┐
        block 1 ──┼─── regions sharing one compiled graph (or one each, if they differ in a per-layer constant)
        block N ──┘
        norm, head ─── regions of their own

That is the opaque-region design, used on every torch. Where torch's ``nested_compile_region`` is known to be right
(see ``_NESTED_REGIONS_CORRECT``) and the run asks for one graph (``fullgraph=True``), the blocks are nested regions
inside the step's single graph instead.

Each region is compiled in place, through its ``forward``: the module keeps its type and state-dict keys, and hooks
registered on it (``fully_shard`` for instance) still run around the compiled code. The step calls each region as an
opaque function, so that its own compiled graph does not trace into the blocks again.

"""

import enum
import inspect
import types
from collections.abc import Mapping
from typing import Any, Callable, Union

import torch
from torch import nn

import lightning.pytorch as pl
from lightning.pytorch.strategies import SingleDeviceStrategy
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from lightning_compile_patch.connector import _CompileConnector, _CompileFeature, _CompileOptions

#: Whether ``torch.compile`` can keep a call's compiled entries apart from other calls of the same code (torch 2.13+).
_TORCH_ISOLATES_RECOMPILES = "isolate_recompiles" in inspect.signature(torch.compile).parameters


def _parse_regions(regions: Any) -> Union[str, tuple[Union[type, str], ...]]:
    """Validates a ``regions`` value: ``"auto"``, a module class, or a tuple or list of classes and class names."""
    if regions == "auto":
        return "auto"
    if isinstance(regions, (type, str)):
        regions = (regions,)
    if not isinstance(regions, (list, tuple)) or not regions:
        raise TypeError(
            f"`Trainer(use_compile={{'regions': {regions!r}}})` must be 'auto', an `nn.Module` subclass, or a non-empty"
            " list of subclasses or class names, such as `{'regions': ['Block']}`."
        )
    for item in regions:
        if isinstance(item, type) and issubclass(item, nn.Module):
            continue
        if isinstance(item, str) and item.isidentifier():
            continue
        raise TypeError(
            f"`Trainer(use_compile={{'regions': ...}})` got {item!r}; each entry must be an `nn.Module` subclass or the"
            " name of one, such as 'Block'."
        )
    return tuple(regions)


def _repeated_blocks(module: nn.Module) -> dict[str, nn.Module]:
    """The blocks of every container that holds two or more modules of one class, outermost first, by name."""
    found: dict[str, nn.Module] = {}
    for name, container in module.named_modules():
        if not isinstance(container, (nn.ModuleList, nn.Sequential)) or any(name.startswith(f"{k}.") for k in found):
            continue
        children = list(container.named_children())
        if len(children) > 1 and len({type(child) for _, child in children}) == 1:
            for child_name, child in children:
                found[f"{name}.{child_name}" if name else child_name] = child
    return found


def _matches(block: nn.Module, spec: tuple[Union[type, str], ...]) -> bool:
    """Whether ``block`` is an instance of a class in ``spec``, or of a class named there (subclasses included)."""
    names = {cls.__name__ for cls in type(block).__mro__}
    return any(isinstance(block, item) if isinstance(item, type) else item in names for item in spec)


def _find_regions(module: nn.Module, regions: Union[str, tuple[Union[type, str], ...]]) -> dict[str, nn.Module]:
    """The modules to compile one by one, by name. When matches nest, the outermost wins.

    Raises:
        ValueError: If nothing matches; the message lists the repeated blocks the model has.

    """
    if isinstance(regions, str):  # "auto"
        found = _repeated_blocks(module)
    else:
        found = {}
        for name, submodule in module.named_modules():
            inside_match = any(name.startswith(f"{outer}.") for outer in found)
            if name and not inside_match and _matches(submodule, regions):
                found[name] = submodule
    if found:
        return found
    candidates = sorted({type(block).__name__ for block in _repeated_blocks(module).values()})
    hint = (
        f" It has these repeated blocks: {', '.join(candidates)}; pass one of them, or 'auto'."
        if candidates
        else " It has no container of repeated blocks either, so regional compilation has nothing to gain: leave"
        " 'regions' out to compile the whole step."
    )
    wanted = "'auto'" if regions == "auto" else ", ".join(getattr(r, "__name__", str(r)) for r in regions)
    raise ValueError(
        f"`Trainer(use_compile={{'regions': ...}})`: no module of `{type(module).__name__}` matches {wanted}.{hint}"
    )


def _rest_of_model(module: nn.Module, blocks: dict[str, nn.Module]) -> dict[str, nn.Module]:
    """The parts of the model that run between the blocks, by name, to compile as regions of their own.

    The model's ``forward`` that loops over the blocks cannot be compiled around them (Dynamo does not resume a graph
    inside a loop), so what it calls besides the blocks (embeddings, final norm, head) would run eagerly. These are
    the largest submodules with parameters that neither are, hold nor sit inside a block, found under the module that
    owns the blocks (the nearest ancestor of a block container that is not itself a container).

    """
    owners = {_owner(module, name) for name in blocks}
    rest: dict[str, nn.Module] = {}
    for name, submodule in module.named_modules():
        if not name or any(_within(name, block) or _within(block, name) for block in blocks):
            continue  # a block, inside one, or holding one
        if not any(owner == "" or _within(name, owner) for owner in owners):
            continue  # not part of the model the blocks belong to (metrics, a loss module of the LightningModule)
        if any(_within(name, chosen) for chosen in rest) or next(submodule.parameters(), None) is None:
            continue
        rest[name] = submodule
    return rest


def _class_names(modules: dict[str, nn.Module]) -> str:
    return "`, `".join(dict.fromkeys(type(m).__name__ for m in modules.values()))


def _within(name: str, ancestor: str) -> bool:
    """Whether the module called ``name`` is ``ancestor`` or inside it."""
    return name == ancestor or name.startswith(f"{ancestor}.")


def _owner(module: nn.Module, block: str) -> str:
    """The name of the module whose ``forward`` calls the block: its first ancestor that is not a container."""
    name = block.rpartition(".")[0]
    while name and isinstance(module.get_submodule(name), (nn.ModuleList, nn.ModuleDict, nn.Sequential)):
        name = name.rpartition(".")[0]
    return name


#: The attribute values Dynamo specializes compiled code on: numbers, strings, ``None``, tuples and enums.
_CONSTANTS = (bool, int, float, str, type(None), tuple, enum.Enum)


def _per_layer_constants(blocks: dict[str, nn.Module]) -> list[str]:
    """The plain attributes whose values differ from block to block, such as HF's ``layer_idx``.

    Dynamo specializes compiled code on such values. Blocks that differ in one cannot share a compiled graph: each would
    recompile it, until Dynamo's recompile limit leaves the deeper blocks to run eagerly. Whether ``forward`` reads the
    attribute is not checked (it may read it in a helper), so an unread one costs a compile per block, never an eager
    block. ``training`` is left out: Lightning's loops set it for the whole model.

    """
    values: dict[str, set[str]] = {}
    for block in blocks.values():
        for prefix, module in block.named_modules():
            for key, value in vars(module).items():
                if key != "training" and isinstance(value, _CONSTANTS):
                    values.setdefault(f"{prefix}.{key}" if prefix else key, set()).add(repr(value))
    return sorted(name for name, seen in values.items() if len(seen) > 1)


def _region_compile_kwargs(compile_kwargs: dict[str, Any], shared: bool) -> dict[str, Any]:
    """The ``torch.compile`` arguments for a region: the run's, with static shapes unless ``dynamic`` was given.

    Static shapes are the default for regions, as in torchtitan: a new input shape (the last, partial batch) compiles
    a block once more, and that entry serves every block, since they share their code; nothing recompiles per block.
    Regions that do not share one graph (``shared=False``: the rest of the model, or blocks that differ in a per-layer
    constant) keep their compiled entries apart, so that they do not add up to Dynamo's recompile limit together.

    """
    kwargs = {"dynamic": False, **compile_kwargs}
    if shared or not _TORCH_ISOLATES_RECOMPILES:
        return kwargs
    return {**kwargs, "isolate_recompiles": True}


def _own_code(forward: Callable[..., Any]) -> Callable[..., Any]:
    """Calls ``forward`` from a frame whose code object belongs to this region alone (for torch < 2.13).

    Dynamo keeps compiled entries, and counts them against its recompile limit, per code object. Without
    ``isolate_recompiles``, two embeddings around the blocks would share one budget, and so would every ``torch.nn``
    module: ``torch.compile`` runs those from one shared wrapper frame (``wrap_inline``).

    """

    def region(*args: Any, **kwargs: Any) -> Any:
        return forward(*args, **kwargs)

    code = region.__code__.replace()  # an equal but distinct code object: Dynamo's entries live on the object
    return types.FunctionType(code, region.__globals__, region.__name__, None, region.__closure__)


def _compile_regions(
    regions: dict[str, nn.Module], compile_kwargs: Mapping[str, Any], shared: bool, replace: Callable = setattr
) -> None:
    """Compiles each region in place, as a call the surrounding compiled step does not trace into.

    ``replace(module, name, value)`` sets the compiled call on each region (the connector's records it, for the undo).

    ``shared``: the regions are identical blocks, which share one compiled graph. Otherwise each region keeps its
    compiled entries apart; identical graphs among them still reuse inductor's compiled code through its caches.

    """
    kwargs = _region_compile_kwargs(dict(compile_kwargs), shared)
    own_code = not shared and not _TORCH_ISOLATES_RECOMPILES

    def compiled(region: nn.Module) -> Callable[..., Any]:
        forward = _own_code(region.forward) if own_code else region.forward
        return _region_boundary(torch.compile(forward, **kwargs), region.forward)

    def compiled_call(region: nn.Module) -> Callable[..., Any]:
        call = _own_code(_module_call(region)) if own_code else _module_call(region)
        return _region_boundary(torch.compile(call, **kwargs), region._call_impl)

    for region in regions.values():
        if _has_tensor_parallel_hooks(region):
            replace(region, "_compiled_call_impl", compiled_call(region))
        else:
            replace(region, "forward", compiled(region))


def _has_tensor_parallel_hooks(module: nn.Module) -> bool:
    """Whether ``parallelize_module`` (``distribute_module``) put its input and output hooks on ``module`` itself.

    Those hooks redistribute the module's DTensor inputs and outputs. A region made of the module's ``forward`` alone
    would leave them outside its graph, and an output that is only partial there crosses the graph's boundary: a
    vocabulary-parallel embedding (``RowwiseParallel`` on ``nn.Embedding``) returns a ``_MaskPartial`` DTensor whose
    mask the output hook releases, and compiling its ``forward`` alone fails ("Mixing fake modes NYI", torch 2.13).
    Such a module is compiled with its hooks, as ``nn.Module.compile`` does.

    """
    return bool(getattr(module, "_distribute_module_applied", False))


def _module_call(module: nn.Module) -> Callable[..., Any]:
    """The module's call, hooks and ``forward``, from a frame of this file that Dynamo traces.

    ``torch.compile(module._call_impl)`` would start from a frame of ``torch.nn``, which Dynamo does not trace: it
    would compile each hook and the ``forward`` on its own, and the hooks' redistributions would cross graphs again.

    """

    def region(*args: Any, **kwargs: Any) -> Any:
        return module._call_impl(*args, **kwargs)

    return region


#: Whether ``torch.compiler.nested_compile_region`` computes correct gradients with inductor, by torch version.
#: Measured with ``docs/repros/nested_compile_region_gradients.py``, and held on every torch CI runs by
#: ``tests/test_regions.py::test_the_nested_region_table_is_right_about_this_torch``. Versions not listed were not
#: measured, and use opaque regions, as do versions without the API (before 2.9).
_NESTED_REGIONS_CORRECT = {"2.9": True, "2.13": False, "2.14": False}


def _torch_minor() -> str:
    """The version of the installed torch as major.minor, such as "2.13"."""
    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def _nested_regions_correct() -> bool:
    """Whether this torch has ``nested_compile_region`` and computes correct gradients with it."""
    return hasattr(torch.compiler, "nested_compile_region") and _NESTED_REGIONS_CORRECT.get(_torch_minor(), False)


#: The backends that compile nested regions: they trace with fake tensors (``backend="eager"`` cannot run them).
_NESTED_REGION_BACKENDS = ("inductor", "aot_eager")


def _nested_regions_apply(trainer: "pl.Trainer", given: Mapping[str, Any], blocks: dict[str, nn.Module]) -> bool:
    """Whether the blocks are nested in the step's one graph instead of opaque regions: only as measured.

    That is where torch gets nested regions right, with ``fullgraph=True`` (a graph break inside a nested region is a
    hard error, where an opaque region would split its graph), on one device in full precision with the default mode
    of ``inductor`` or ``aot_eager``, and for blocks without a ``forward`` of their own instance (a hook's wrapper).
    DDP's graph splitting, FSDP's per-module hooks, autocast and other modes were not measured with nested regions.

    """
    return (
        _nested_regions_correct()
        and given.get("fullgraph") is True
        and (given.get("backend") or "inductor") in _NESTED_REGION_BACKENDS
        and given.get("mode") is None
        and isinstance(trainer.strategy, SingleDeviceStrategy)
        and str(trainer.precision) in ("32-true", "32")
        and not any("forward" in block.__dict__ for block in blocks.values())
    )


def _nest_regions(connector: _CompileConnector, blocks: dict[str, nn.Module]) -> None:
    """Makes each block's ``forward`` a nested compile region, one per class, bound to each block.

    The step is then compiled whole, as one graph: Dynamo traces each block's call and keeps one subgraph for the calls
    that trace to the same graph, which AOTAutograd and inductor then compile once.

    """
    nested: dict[type, Callable[..., Any]] = {}
    for block in blocks.values():
        if type(block) not in nested:
            nested[type(block)] = torch.compiler.nested_compile_region(type(block).forward)
        connector.replace(block, "forward", types.MethodType(nested[type(block)], block))


def _region_boundary(compiled: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """Runs a block's compiled code; when the step around it is traced, the call stays opaque (its own region)."""

    @torch.compiler.disable
    def compiled_region(*args: Any, **kwargs: Any) -> Any:
        return compiled(*args, **kwargs)

    compiled_region.__wrapped__ = original  # for signature inspection
    return compiled_region


class _Regions(_CompileFeature):
    """Compiles each repeated block on its own, then the rest of the step around them."""

    keys = {"regions": "compile each repeated block on its own: 'auto', a class, classes or class names"}

    def __init__(self, options: _CompileOptions) -> None:
        regions = options.keys.get("regions")
        self.regions = _parse_regions(regions) if regions is not None else None

    def on_run_start(self, connector: _CompileConnector, model: "pl.LightningModule") -> None:
        self.summary_note = None
        if self.regions is not None and not is_overridden("configure_model", model):
            _find_regions(model, self.regions)  # fail now, before the data is prepared

    def setup(self, connector: _CompileConnector) -> Mapping[str, Any]:
        module = connector.trainer.lightning_module
        if self.regions is None:
            return {}
        blocks = _find_regions(module, self.regions)
        constants = _per_layer_constants(blocks)
        step_only: dict[str, Any] = {}
        if not constants and _nested_regions_apply(connector.trainer, connector.given or {}, blocks):
            _nest_regions(connector, blocks)
            how = "nested in the step's one graph"
        else:
            kwargs = connector.run_kwargs or {}
            _compile_regions(blocks, kwargs, shared=not constants, replace=connector.replace)
            _compile_regions(_rest_of_model(module, blocks), kwargs, shared=False, replace=connector.replace)
            step_only["fullgraph"] = False  # the step calls each region as an opaque function
            how = "compiled one by one" if constants else "sharing one compiled graph"
        self.summary_note = f"regions: {len(blocks)} blocks {how}"
        why = f", since they differ in {', '.join(f'`{c}`' for c in constants[:3])}" if constants else ""
        rank_zero_info(f"`use_compile`: regions: {len(blocks)} blocks of `{_class_names(blocks)}`, {how}{why}.")
        return step_only


FEATURE = _Regions
