"""An Enum used as a dict key gets no guard: the compiled code of one value runs for another (torch 2.13, CPU).

    python docs/repros/enum_dict_key_guard.py [--backend eager|aot_eager|inductor]

Each function returns a name picked by an Enum: from a dict literal keyed by the Enum, a module-level dict,
``dict.get``, and, for comparison, an ``if`` on the Enum and a dict keyed by ints. Each is compiled, called with the
first member and then with the second. With an Enum as the dict key, the second call returns the first call's name: no
guard is put on the key, so the first compiled code runs again. The ``if`` and the int key recompile and give the right
name. How ``use_compile`` keys compiled steps on the Trainer's stage instead: ``compile_features/stage_guards.py``.
"""

import argparse
import enum

import torch


class Stage(enum.Enum):
    """Two stages, as Lightning's ``RunningStage`` (a ``str`` Enum there; a plain Enum fails the same way)."""

    SANITY = "sanity"
    VAL = "val"


NAMES = {Stage.SANITY: "sanity_loss", Stage.VAL: "val_loss"}


def dict_literal(stage: Stage, x: torch.Tensor) -> tuple[torch.Tensor, str]:
    """The name from a dict literal keyed by the Enum."""
    return x + 1, {Stage.SANITY: "sanity_loss", Stage.VAL: "val_loss"}[stage]


def global_dict(stage: Stage, x: torch.Tensor) -> tuple[torch.Tensor, str]:
    """The name from a module-level dict."""
    return x + 1, NAMES[stage]


def dict_get(stage: Stage, x: torch.Tensor) -> tuple[torch.Tensor, str]:
    """The name from ``dict.get``."""
    return x + 1, NAMES.get(stage, "none")


def if_on_the_enum(stage: Stage, x: torch.Tensor) -> tuple[torch.Tensor, str]:
    """The name from an ``if`` on the Enum."""
    return x + 1, "sanity_loss" if stage is Stage.SANITY else "val_loss"


def int_key(stage: int, x: torch.Tensor) -> tuple[torch.Tensor, str]:
    """The name from a dict keyed by ints."""
    return x + 1, {0: "sanity_loss", 1: "val_loss"}[stage]


def main() -> None:
    """Runs each function with both keys and prints what it returned."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="eager")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, backend {args.backend}")
    x = torch.ones(2)
    for fn in (dict_literal, global_dict, dict_get, if_on_the_enum, int_key):
        first, second = (0, 1) if fn is int_key else (Stage.SANITY, Stage.VAL)
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend=args.backend)
        compiled(first, x)
        got, expected = compiled(second, x)[1], fn(second, x)[1]
        print(f"{fn.__name__:>15}: {got!r:14} eager {expected!r:12} {'ok' if got == expected else 'WRONG'}")


if __name__ == "__main__":
    main()
