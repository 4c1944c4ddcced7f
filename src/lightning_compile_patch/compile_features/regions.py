"""Regional compilation: compile each repeated block on its own, and the rest of the step around them.

A model of ``N`` identical blocks compiles one block's graph once and runs it ``N`` times, so the cold start stops
growing with the depth of the model::

    training_step ── compiled: the loss, logging, the rest of the step
      model.forward ── plain Python: its loop over the blocks cannot be compiled around them
        embeddings ─── a region of its own
        block 0 ──┐
        block 1 ──┼─── regions sharing one compiled graph (or one each, if they differ in a per-layer constant)
        block N ──┘
        norm, head ─── regions of their own

Each region is compiled in place, through its ``forward``: the module keeps its type and state-dict keys, and its
hooks (``fully_shard``'s) still run around the compiled code. The step calls each region as an opaque function, so
that the step's graph does not trace into the blocks again. One mechanism on every torch: ``nested_compile_region``
gets the blocks' gradients wrong with inductor on torch 2.13 and 2.14 (docs/repros/nested_compile_region_gradients.py).

"""

import enum
import types
from collections.abc import Mapping
from typing import Any, Callable, Optional, Union

import torch
from torch import nn

import lightning.pytorch as pl
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from lightning_compile_patch.compile_features import _CompileFeature, _CompileOptions
from lightning_compile_patch.compile_features import _private_names as private_names
from lightning_compile_patch.compile_features._run import _CompileRun

_Spec = Union[str, tuple[Union[type, str], ...]]


def _parse_regions(regions: Any) -> Optional[_Spec]:
    """Validates a ``regions`` value: ``"auto"``, a module class, or a tuple or list of classes and class names."""
    if regions is None or regions == "auto":
        return regions
    entries = (regions,) if isinstance(regions, (type, str)) else regions
    if not isinstance(entries, (list, tuple)) or not entries:
        raise TypeError(
            f"`Trainer(use_compile={{'regions': {regions!r}}})` must be 'auto', an `nn.Module` subclass, or a non-empty"
            " list of subclasses or class names, such as `{'regions': ['Block']}`."
        )
    for item in entries:
        module_class = isinstance(item, type) and issubclass(item, nn.Module)
        if not (item.isidentifier() if isinstance(item, str) else module_class):
            raise TypeError(
                f"`Trainer(use_compile={{'regions': ...}})` got {item!r}; each entry must be an `nn.Module` subclass or"
                " the name of one, such as 'Block'."
            )
    return tuple(entries)


def _find_regions(module: nn.Module, regions: _Spec) -> dict[str, nn.Module]:
    """The blocks to compile, by name, in one walk: ``"auto"``'s are the blocks of every container of two or more
    modules of one class (the blocks inside, where those are lists, which are never called); otherwise, the instances
    of a class in ``regions`` or named there (subclasses included).

    When matches nest, the outermost wins. Nothing matching raises a ``ValueError`` that lists the repeated blocks.

    """
    repeated: dict[str, nn.Module] = {}  # "auto"'s blocks, and the candidates an error names
    matched: dict[str, nn.Module] = {}
    for name, sub in module.named_modules():
        if isinstance(sub, (nn.ModuleList, nn.Sequential)) and not any(name.startswith(f"{b}.") for b in repeated):
            children = dict(sub.named_children())
            kinds = {type(child) for child in children.values()}
            lists = len(kinds) == 1 and issubclass(next(iter(kinds)), (nn.ModuleList, nn.ModuleDict))
            if len(children) > 1 and len(kinds) == 1 and not lists:
                repeated.update({f"{name}.{key}" if name else key: child for key, child in children.items()})
        if not isinstance(regions, str) and name and not any(name.startswith(f"{m}.") for m in matched):
            names = {cls.__name__ for cls in type(sub).__mro__}
            if any(isinstance(sub, r) if isinstance(r, type) else r in names for r in regions):
                matched[name] = sub
    found = repeated if isinstance(regions, str) else matched  # "auto"
    if found:
        return found
    candidates = sorted({type(block).__name__ for block in repeated.values()})
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
    """What runs between the blocks (embeddings, final norm, head), by name, to compile as regions of their own: the
    ``forward`` that loops over the blocks cannot be compiled around them (Dynamo does not resume a graph inside a
    loop).

    They are the largest submodules with parameters that neither are, hold nor sit in a block, under a module that owns
    blocks (a block container's nearest ancestor that is not a container).

    """

    def within(name: str, ancestor: str) -> bool:
        return name == ancestor or name.startswith(f"{ancestor}.")

    owners = set()
    for block in blocks:
        owner = block.rpartition(".")[0]
        while owner and isinstance(module.get_submodule(owner), (nn.ModuleList, nn.ModuleDict, nn.Sequential)):
            owner = owner.rpartition(".")[0]
        owners.add(owner)
    rest: dict[str, nn.Module] = {}
    for name, submodule in module.named_modules():
        if not name or any(within(name, block) or within(block, name) for block in blocks):
            continue  # a block, inside one, or holding one
        if not any(owner == "" or within(name, owner) for owner in owners):
            continue  # not part of the model the blocks belong to (metrics, a loss module of the LightningModule)
        if any(within(name, chosen) for chosen in rest) or next(submodule.parameters(), None) is None:
            continue
        rest[name] = submodule
    return rest


def _compile_regions(
    regions: dict[str, nn.Module], compile_kwargs: Mapping[str, Any], shared: bool, replace: Callable = setattr
) -> None:
    """Compiles each region in place, as a call that the compiled step around it does not trace into: ``replace``
    (``setattr`` by default; the run's records it, for the undo) sets it.

    ``shared``: identical blocks, which share one compiled graph.

    """
    # static shapes unless `dynamic` is given, as in torchtitan: a new input shape compiles the shared block once more,
    # not once per block
    kwargs = {"dynamic": False, **compile_kwargs}
    for region in regions.values():
        # `parallelize_module`'s hooks on the module redistribute DTensors: compile them with it, as `nn.Module.compile`
        # does. An output partial before its output hook (a vocabulary-parallel embedding's `_MaskPartial`) cannot
        # cross a graph's boundary ("Mixing fake modes NYI", torch 2.13).
        hooked = private_names.tensor_parallel_hooks(region)
        if hooked:
            name, call = private_names.COMPILED_CALL, private_names.module_call(region)
        else:
            name, call = "forward", region.forward
        # Dynamo keeps compiled entries, and counts them against its recompile limit, per code object: shared blocks
        # use their `forward`'s. Others get a code object each, or blocks that differ in a per-layer constant would
        # recompile one entry until the limit left the deeper ones eager, and two embeddings would share
        # `nn.Embedding.forward`'s. Identical graphs still share inductor's caches.
        traced = call if shared and not hooked else _region_call(call, own_code=not shared)
        replace(region, name, _region_boundary(torch.compile(traced, **kwargs), call))


def _region_boundary(compiled: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """Runs a region's compiled code; when the step around it is traced, the call stays opaque (a graph break)."""

    @torch.compiler.disable
    def compiled_region(*args: Any, **kwargs: Any) -> Any:  # the run summary counts breaks at this name as expected
        return compiled(*args, **kwargs)

    compiled_region.__wrapped__ = original  # for signature inspection
    return compiled_region


def _region_call(call: Callable[..., Any], own_code: bool) -> Callable[..., Any]:
    """Calls ``call`` from a frame of this file, which Dynamo traces: ``torch.compile(module._call_impl)`` would start
    in ``torch.nn``, which it does not, and compile the hooks and ``forward`` apart.

    With ``own_code``, from a copy of its code, equal but distinct: Dynamo keeps entries on the code object, on every
    torch (torch 2.13's ``isolate_recompiles`` did the same, and is not needed).

    """

    def region(*args: Any, **kwargs: Any) -> Any:
        return call(*args, **kwargs)

    if not own_code:
        return region
    return types.FunctionType(region.__code__.replace(), region.__globals__, "region", None, region.__closure__)


class _Regions(_CompileFeature):
    """Compiles each repeated block on its own, then the rest of the step around them."""

    keys = {"regions": "compile each repeated block on its own: 'auto', a class, classes or class names"}

    def __init__(self, options: _CompileOptions) -> None:
        self.regions = _parse_regions(options.keys.get("regions"))

    def on_run_start(self, run: _CompileRun, model: "pl.LightningModule") -> None:
        if self.regions is not None and not is_overridden("configure_model", model):
            _find_regions(model, self.regions)  # fail now, before the data is prepared

    def setup(self, run: _CompileRun) -> Mapping[str, Any]:
        if self.regions is None:
            return {}
        module = run.trainer.lightning_module
        blocks = _find_regions(module, self.regions)
        # the plain attributes whose values differ from block to block, such as HF's `layer_idx`: Dynamo specializes
        # compiled code on numbers, strings, `None`, tuples and enums, so such blocks cannot share a graph (each would
        # recompile it until the recompile limit left the deeper blocks eager). An attribute `forward` does not read (a
        # helper may) costs a compile per block, never an eager block. `training` is the loops' own.
        values: dict[str, set[str]] = {}
        for block in blocks.values():
            for prefix, sub in block.named_modules():
                for key, value in vars(sub).items():
                    if key != "training" and isinstance(value, (bool, int, float, str, type(None), tuple, enum.Enum)):
                        values.setdefault(f"{prefix}.{key}" if prefix else key, set()).add(repr(value))
        constants = sorted(name for name, seen in values.items() if len(seen) > 1)
        kwargs = run.run_kwargs or {}
        _compile_regions(blocks, kwargs, shared=not constants, replace=run.replace)
        _compile_regions(_rest_of_model(module, blocks), kwargs, shared=False, replace=run.replace)
        how = "compiled one by one" if constants else "sharing one compiled graph"
        note = f"regions: {len(blocks)} blocks {how}"  # for the run's summary
        run.note(lambda: note)
        why = f", since they differ in {', '.join(f'`{c}`' for c in constants[:3])}" if constants else ""
        names = "`, `".join(dict.fromkeys(type(block).__name__ for block in blocks.values()))
        rank_zero_info(f"`use_compile`: regions: {len(blocks)} blocks of `{names}`, {how}{why}.")
        if (run.given or {}).get("fullgraph") is True:
            rank_zero_info(
                "`use_compile`: regions: `fullgraph=True` applies to each region; the step is compiled with"
                " `fullgraph=False`, since it calls each region as an opaque function."
            )
        return {"fullgraph": False}  # the step calls each region as an opaque function


FEATURE = _Regions
