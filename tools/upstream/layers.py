r"""The layers of a package module, as the upstream ladder takes them: each patch adds the lines of its own tags.

A module marks the lines of a layer with a tag (``use_compile``, ``features``); untagged lines are the first layer.

* ``code  # [ladder TAGS]``: a line of those layers;
* ``# [ladder TAGS]`` on a line of its own opens a block of them, which ``# [/ladder]`` closes;
* ``# [ladder TAGS] code``: a line that only earlier layers have (its tags start with ``!``), as a comment, so that the
  package, which runs every layer, skips it.

``TAGS`` are names that must all be in (or, with ``!``, out of) the layers applied. Consecutive ``from M import``
lines of one module, which a layer may split, are merged again, sorted as isort does.

    >>> render("import os  # [ladder features]\nx = 1\n# [ladder !features] y = 2\n", {"features"})
    'import os\nx = 1\n'
    >>> render("import os  # [ladder features]\nx = 1\n# [ladder !features] y = 2\n", set())
    'x = 1\ny = 2\n'

"""

import re

_TAG = re.compile(r"^(?P<indent>\s*)(?P<code>.*?)\s*# \[ladder (?P<tags>[!\w ]+)\](?P<rest>.*)$")
_CLOSE = re.compile(r"^\s*# \[/ladder\]\s*$")
_NOQA = re.compile(r"\s*# noqa: I001\b.*$")
_FROM = re.compile(r"^from (?P<module>[\w.]+) import (?P<names>[\w, ]+)$")


def holds(tags: str, layers: set[str]) -> bool:
    """Whether every tag of ``tags`` holds for ``layers``: ``name`` is in them, ``!name`` is not."""
    return all((tag[1:] not in layers) if tag.startswith("!") else (tag in layers) for tag in tags.split())


def render(source: str, layers: set[str]) -> str:
    """``source`` with the lines of ``layers`` (and of the first layer), without the tags."""
    out: list[str] = []
    blocks: list[bool] = []
    for line in source.splitlines(keepends=True):
        if _CLOSE.match(line):
            blocks.pop()
            continue
        match = _TAG.match(line.rstrip("\n"))
        if match and not match["code"] and not match["rest"].strip():  # a block opens
            blocks.append(holds(match["tags"], layers))
            continue
        if not all(blocks):
            continue
        if match is None:
            out.append(_NOQA.sub("", line.rstrip("\n")) + "\n")
        elif not match["code"]:  # an earlier layer's line, as a comment
            if holds(match["tags"], layers):
                code = re.sub(r"\s+# noqa: E501$", "", match["rest"][1:].rstrip())  # long only as a comment
                out.append(match["indent"] + code + "\n")
        elif holds(match["tags"], layers):
            out.append(match["indent"] + _NOQA.sub("", match["code"]) + "\n")
    if blocks:
        raise ValueError("a `# [ladder ...]` block is not closed")
    return _blank_lines(_merge_from_imports("".join(out)))


def _isort_key(name: str) -> tuple[int, str]:
    """Isort's order of names within an import: constants, then classes, then the rest."""
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


def _merge_from_imports(source: str) -> str:
    lines = source.splitlines(keepends=True)
    merged: list[str] = []
    for line in lines:
        this = _FROM.match(line.rstrip("\n"))
        last = _FROM.match(merged[-1].rstrip("\n")) if merged else None
        # an `import x as y` stays on a line of its own, as isort leaves it
        aliased = any(" as " in match["names"] for match in (this, last) if match)
        if this and last and this["module"] == last["module"] and not aliased:
            names = {n.strip() for n in f"{last['names']},{this['names']}".split(",") if n.strip()}
            merged[-1] = f"from {this['module']} import {', '.join(sorted(names, key=_isort_key))}\n"
        else:
            merged.append(line)
    return "".join(merged)


def _blank_lines(source: str) -> str:
    """At most two blank lines before a top-level line and one before an indented one, as the formatter leaves them;
    none after a line that opens a block, and none at the end.
    """
    out: list[str] = []
    blanks = 0
    for line in source.splitlines(keepends=True):
        if not line.strip():
            blanks += 1
            continue
        if out:
            indented = line[:1].isspace()
            most = 1 if indented else 2
            before = out[-1].lstrip()
            opener = out[-1].rstrip().endswith(":") and not before.startswith("#")
            if opener and indented:
                blanks = 0
            elif line.lstrip().startswith(("def ", "class ", "@")) and not before.startswith(("@", "#")):
                blanks = most  # a definition after a removed one keeps the space between them
            out += ["\n"] * min(blanks, most)
        blanks = 0
        out.append(line)
    return "".join(out)
