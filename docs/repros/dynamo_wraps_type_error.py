"""A ``TypeError`` raised while Dynamo traces escapes the traced code's own ``except TypeError`` (torch 2.13, CPU).

    python docs/repros/dynamo_wraps_type_error.py [--backend eager|aot_eager|inductor]

Each function tries a call that raises ``TypeError`` and handles it with ``except TypeError``. Eager, the handler runs.
Compiled, a ``TypeError`` that Python code raises is handled the same way, but one raised by a torch op on fake tensors
(``x + "a"``) comes out as ``torch._dynamo.exc.TorchRuntimeError``, and one raised by a builtin that Dynamo evaluates
(``isinstance(x, list[int])``) as ``InternalTorchDynamoError``: neither is a ``TypeError``, so the handler in the
function, and any ``except TypeError`` around the call, is skipped. How ``use_compile`` names the error and keeps its
type: ``compile_features/compile_errors.py``.
"""

import argparse

import torch


def python_raise(x: torch.Tensor) -> torch.Tensor:
    """A ``TypeError`` of Python code (``len`` of an int), handled."""
    try:
        len(5)
    except TypeError:
        x = 2 * x
    return x + 1


def torch_op(x: torch.Tensor) -> torch.Tensor:
    """A ``TypeError`` of a torch op (a tensor plus a string), handled."""
    try:
        x = x + "a"
    except TypeError:
        x = 2 * x
    return x + 1


def builtin(x: torch.Tensor) -> torch.Tensor:
    """A ``TypeError`` of ``isinstance`` with a parameterized generic, handled."""
    try:
        isinstance(x, list[int])
    except TypeError:
        x = 2 * x
    return x + 1


def main() -> None:
    """Runs each function eagerly and compiled, and prints what each gave or raised."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="eager")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, backend {args.backend}")
    x = torch.ones(2)
    for fn in (python_raise, torch_op, builtin):
        torch._dynamo.reset()
        expected = fn(x).tolist()
        try:
            got = f"{torch.compile(fn, backend=args.backend)(x).tolist()}"
        except Exception as error:  # what escapes the handler is the finding
            got = f"{type(error).__module__}.{type(error).__name__} (a TypeError: {isinstance(error, TypeError)})"
        print(f"{fn.__name__:>12}: eager {expected}, compiled {got}")


if __name__ == "__main__":
    main()
