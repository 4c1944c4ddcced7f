"""A property raising ``AttributeError`` falls back to ``__getattr__`` in Python, not under Dynamo (torch 2.13, CPU).

    python docs/repros/property_attribute_error_fallback.py [--backend eager|aot_eager|inductor]

Python looks an attribute up on the class first; when a data descriptor there (a property) raises ``AttributeError``,
it calls the class's ``__getattr__``. ``nn.Module.__setattr__`` registers a submodule in ``_modules`` without calling
a property's setter, so a subclass whose property ``head`` returns a missing ``self._head`` still works: the property
raises, and ``nn.Module.__getattr__("head")`` finds the submodule. pytorch-tabular's models are built this way
(``CategoryEmbeddingModel.head``). Dynamo traces the property, sees the ``AttributeError``, and stops: "Observed
exception ... Dynamo found no exception handler at the top-level compiled function". Without ``fullgraph`` it skips the
whole frame, so the step runs eagerly (``use_compile`` counts it eager with that cause). Exit status 1 while the bug is
there.
"""

import argparse
import sys

import torch
from torch import nn


class Base(nn.Module):
    """Assigns its head as a plain attribute, as pytorch-tabular's base model does."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 2)  # nn.Module.__setattr__: into `_modules`, past the subclass's property


class Model(Base):
    """Reads its head through a property over an attribute that was never set."""

    @property
    def head(self) -> nn.Module:
        """The head, as ``CategoryEmbeddingModel.head`` reads it."""
        return self._head  # AttributeError: Python then calls nn.Module.__getattr__("head")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The head's output."""
        return self.head(x)


def main() -> int:
    """Runs the model eagerly, then compiled; 1 while the compiled call fails."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="eager")
    backend = parser.parse_args().backend
    model, x = Model(), torch.randn(3, 4)
    expected = model(x)
    print(f"eager: {tuple(expected.shape)}, head is {type(model.head).__name__}")
    try:
        got = torch.compile(model, backend=backend, fullgraph=True)(x)
    except Exception as error:  # torch._dynamo.exc.Unsupported: Observed exception
        print(f"compiled ({backend}, fullgraph=True): {type(error).__name__}: {str(error).splitlines()[0]}")
        return 1
    print(f"compiled ({backend}): equal to eager: {torch.equal(got, expected)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
