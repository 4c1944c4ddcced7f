"""A batch of a tensor subclass, as image libraries pass torchvision's ``tv_tensors.Image``: two faults of torch's.

    python docs/repros/tensor_subclass_batches.py

1. A ``shape`` property that reads ``super().shape`` (as ``tv_tensors`` do): Dynamo cannot trace it, finds "no exception
   handler at the top-level compiled function" ("Observed exception") and skips the whole frame, which then runs
   eagerly (torch 2.13.0 and 2.15.0).
2. ``aot_eager`` on the subclass: the first call fails with ``TypeError: Multiple dispatch failed for
   'torch._ops.aten.convolution.default'; all __torch_dispatch__ handlers returned NotImplemented``, from AOTAutograd's
   ``_AnalyzeCustomOpInputOutputMode`` (torch 2.13.0; 2.15.0 runs it; inductor runs it on both).

No Lightning involved. Exit status 1 while either is there.
"""

import sys

import torch
from torch import nn
from torch._dynamo.utils import get_compilation_metrics


class Image(torch.Tensor):
    """A tensor subclass whose ``shape`` reads ``super().shape``."""

    @property
    def shape(self):  # noqa: D102
        return super().shape


conv = nn.Conv2d(3, 4, 3)
batch = torch.randn(2, 3, 8, 8).as_subclass(Image)


def reads_shape(x):
    """Dynamo skips it: `x.shape` reads `super().shape`."""
    return conv(x).sum() / x.shape[0]


def convolves(x):
    """aot_eager fails on the subclass here."""
    return conv(x).sum()


faults = 0
torch.compile(reads_shape, backend="eager")(batch)
skipped = [(m.co_name, (m.fail_reason or "").splitlines()[0]) for m in get_compilation_metrics() if m.fail_type]
print(f"torch {torch.__version__}")
print(f"1. frames Dynamo skipped: {skipped or 'none'}")
faults += bool(skipped)
try:
    torch.testing.assert_close(torch.compile(convolves, backend="aot_eager")(batch), convolves(batch))
    print("2. aot_eager on the subclass: same as eager")
except TypeError as error:
    print(f"2. aot_eager on the subclass: TypeError: {str(error).splitlines()[0]}")
    faults += 1
sys.exit(1 if faults else 0)
