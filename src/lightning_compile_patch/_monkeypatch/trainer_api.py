"""The ``use_compile`` argument as it appears in ``Trainer.__init__``: its annotation, default and docstring entry.

The monkeypatch adds these to the patched signature and docstring (LightningCLI reads both), and the patch-set
generator writes the same text into Lightning's ``trainer.py``.

"""

import inspect
from typing import Any, Callable, Optional, Union

NAME = "use_compile"
ANNOTATION = Optional[Union[bool, dict[str, Any]]]
#: The annotation as written in ``trainer.py``.
ANNOTATION_SOURCE = "Optional[Union[bool, dict[str, Any]]]"
DEFAULT = None

#: The ``Args:`` entry, without indentation. Each line is indented by the docstring's own argument indent.
DOC = """\
use_compile: Compile the model with ``torch.compile`` after the strategy has set it up (wrapped it
    in DDP or FSDP), in every stage (fit, validate, test, predict), before any hook runs a step.
    ``True`` uses the defaults of ``torch.compile``; a dict passes its keys to ``torch.compile``
    (``backend``, ``mode``, ``fullgraph``, ``dynamic``, ``options``, ...); a model compiled by hand
    is refused, unless with the same arguments. With ``None`` or ``False`` the Trainer compiles
    nothing of its own: a model compiled with ``torch.compile`` runs compiled.
    Default: ``None``."""


def signature_with_use_compile(signature: inspect.Signature) -> inspect.Signature:
    """``signature`` with ``use_compile`` appended as the last keyword-only parameter."""
    parameter = inspect.Parameter(NAME, inspect.Parameter.KEYWORD_ONLY, default=DEFAULT, annotation=ANNOTATION)
    return signature.replace(parameters=[*signature.parameters.values(), parameter])


def docstring_with_use_compile(docstring: str) -> str:
    """``docstring`` with the ``use_compile`` entry added as the last argument of its ``Args:`` section."""
    lines = docstring.splitlines()
    args_at = next(i for i, line in enumerate(lines) if line.strip() == "Args:")
    indent = " " * (len(lines[args_at]) - len(lines[args_at].lstrip()) + 4)
    end = next(
        (i for i in range(args_at + 1, len(lines)) if lines[i].strip() and not lines[i].startswith(indent)), len(lines)
    )
    while not lines[end - 1].strip():
        end -= 1
    entry = ["", *(indent + line if line else "" for line in DOC.splitlines())]
    return "\n".join([*lines[:end], *entry, *lines[end:]])


def has_use_compile(init: Callable[..., Any]) -> bool:
    """Whether ``init`` (a ``Trainer.__init__``) already takes ``use_compile``."""
    return NAME in inspect.signature(init).parameters
