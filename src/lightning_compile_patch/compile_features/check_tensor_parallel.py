"""Tensor parallelism under ``use_compile``: warn on a torch it was not tested on, refuse what is known to fail.

With its key set, it checks every compiled run, with ``regions`` or without, and imports no other feature: its patch
applies on the core alone (its test trains with ``regions`` too, so runs with the regions patch).

"""

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from lightning_compile_patch.compile_features import _CompileFeature, _CompileOptions, _flag
from lightning_compile_patch.compile_features import _private_names as private_names
from lightning_compile_patch.compile_features._run import _CompileRun

#: The torch versions (major.minor) that tensor parallelism under ``use_compile`` was tested on, on CPU with gloo
#: (``tests/test_tensor_parallel.py``); on others it warns. Add one when that test passed on it.
_TENSOR_PARALLEL_TESTED_ON = ("2.13",)


def _torch_minor() -> str:
    """The version of the installed torch as major.minor, such as "2.13"."""
    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def _check_tensor_parallel(module: nn.Module) -> None:
    """Refuses what is known to fail with tensor parallelism, and warns on a torch it was not tested on.

    Under FSDP2, Dynamo does not trace the sharded modules' hooks (they are compiler-disabled), so whole-model
    compilation falls back to compiling each module call on its own, and a module's tensor-parallel hooks apart from its
    ``forward``. A vocabulary-parallel embedding (``RowwiseParallel`` on ``nn.Embedding``) returns a ``_MaskPartial``
    DTensor whose mask only its output hook releases; across two graphs that fails to compile ("Mixing fake modes
    NYI", torch 2.13). Regions compile such a module with its hooks, in one graph: that is what to use instead, and what
    passes.

    """
    # `parallelize_module` (`distribute_module`) marks each module it put its hooks on
    parallel = [name for name, sub in module.named_modules() if private_names.tensor_parallel_hooks(sub)]
    if not parallel:
        return
    if _torch_minor() not in _TENSOR_PARALLEL_TESTED_ON:
        rank_zero_warn(
            f"`use_compile` with tensor parallelism (`parallelize_module` on `{parallel[0]}`, ...) was tested on torch"
            f" {', '.join(_TENSOR_PARALLEL_TESTED_ON)} only; this is torch {torch.__version__}. Compare a few steps"
            " with an eager run before relying on it."
        )
    if not any(_is_fully_sharded(sub) for sub in module.modules()):
        return
    split = (name for name in parallel if _vocabulary_parallel(module.get_submodule(name)))
    embedding = next((name for name in split if not _compiled_with_its_hooks(module, name)), None)
    if embedding is not None:
        raise ValueError(
            f"`Trainer(use_compile=...)` cannot compile this model whole: `{embedding}` is a vocabulary-parallel"
            " embedding (`RowwiseParallel` on `nn.Embedding`) in a model sharded with `fully_shard`. Dynamo does not"
            " trace FSDP2's hooks, so it compiles each module call on its own, the embedding's tensor-parallel hooks"
            " apart from its `forward`, and the partial output of the embedding cannot cross that graph boundary"
            " (torch fails with 'Mixing fake modes NYI'). Pass `use_compile={'regions': 'auto'}`, which compiles the"
            " embedding with its hooks in one graph, or shard the embedding another way."
        )


def _compiled_with_its_hooks(module: nn.Module, name: str) -> bool:
    """Whether the submodule ``name``, or one that holds it, is compiled in place (a region), its hooks with it."""
    parts = name.split(".")
    holders = (module.get_submodule(".".join(parts[:depth])) for depth in range(len(parts) + 1))
    return any(private_names.compiled_call(holder) is not None for holder in holders)


def _is_fully_sharded(module: nn.Module) -> bool:
    """Whether ``fully_shard`` (FSDP2) was applied to ``module``."""
    return any(cls.__name__ == "FSDPModule" for cls in type(module).__mro__)


def _vocabulary_parallel(module: nn.Module) -> bool:
    """Whether ``module`` is an embedding whose table is split by rows (the vocabulary) over the tensor-parallel mesh.

    Under FSDP2 on a 2-D mesh the tensor-parallel placement is the last one (FSDP2 puts its own first).

    """
    from torch.distributed.tensor import DTensor, Shard

    weight = getattr(module, "weight", None)
    return (
        isinstance(module, nn.Embedding)
        and isinstance(weight, DTensor)
        and isinstance(weight.placements[-1], Shard)
        and weight.placements[-1].dim == 0
    )


class _CheckTensorParallel(_CompileFeature):
    """Checks a model made tensor-parallel (in ``configure_model``) once the strategy has set it up."""

    keys = {"check_tensor_parallel": "True: refuse before the first step what tensor parallelism cannot compile whole"}

    def __init__(self, options: _CompileOptions) -> None:
        _flag(options, "check_tensor_parallel")

    def setup(self, run: _CompileRun) -> Mapping[str, Any]:
        _check_tensor_parallel(run.trainer.lightning_module)  # after `regions` has compiled its blocks, if set
        return {}


FEATURE = _CheckTensorParallel
