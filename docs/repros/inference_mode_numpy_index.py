"""Under ``torch.inference_mode``, indexing a tensor with a numpy array fails inside Dynamo (torch 2.13, CPU).

    python docs/repros/inference_mode_numpy_index.py [--backend eager|aot_eager|inductor]

A function that picks columns with a module-level numpy array. Eager, under ``no_grad`` and under ``inference_mode``;
compiled, under ``no_grad`` it runs, under ``inference_mode`` Dynamo raises ``AssertionError: Guard failed on the same
frame it was created ... tensor '___from_numpy(G['COLUMNS'])' dispatch key set mismatch``. Dynamo builds the tensor of
the numpy array outside the inference mode (with ``ADInplaceOrView``) and checks it inside. Why ``use_compile`` runs
``validate``, ``test`` and ``predict`` under ``no_grad`` while compiling: docs/usage.md.
"""

import argparse

import numpy as np
import torch

COLUMNS = np.array([1, 0, 1])


def pick(x: torch.Tensor) -> torch.Tensor:
    """The columns ``COLUMNS`` of ``x``."""
    return x[:, COLUMNS]


def run(mode: str, backend: str) -> str:
    """``pick`` compiled with ``backend`` under ``mode`` (``no_grad`` or ``inference_mode``): its sum, or its error."""
    torch._dynamo.reset()
    context = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    x = torch.arange(8.0).reshape(4, 2)
    with context:
        expected = pick(x).sum().item()
        try:
            got = torch.compile(pick, backend=backend)(x).sum().item()
        except Exception as error:  # what it raises is the finding
            return f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    return f"{got} (eager {expected})"


def main() -> None:
    """Runs ``pick`` compiled under each mode and prints what it gave."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="eager")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, numpy {np.__version__}, backend {args.backend}")
    for mode in ("no_grad", "inference_mode"):
        print(f"{mode:>15}: {run(mode, args.backend)}")


if __name__ == "__main__":
    main()
