"""Generates the upstream patch series in ``patches/`` from the package's own code, and checks it for drift.

    python tools/patchset.py write --base BASE     # regenerate patches/ (BASE: see tools/lightning_base.py)
    python tools/patchset.py check [--base BASE]   # fail if patches/ differs from what regeneration gives

What each patch contains:

* new source files: the package's Lightning-side modules (``flavours.UPSTREAM_MODULES``), with the features of the
  patches so far switched on (lines tagged ``# patch: <feature>`` are kept only from that feature's patch on), imports
  renamed to Lightning's paths, and Lightning's license header;
* new test files, verbatim from ``tools/upstream/tests``;
* edits of Lightning's own files (``tools/upstream/series.py``), applied to the base.

Without a base (CI has no checkout of Lightning's docs and tests), ``check`` compares everything it can regenerate
exactly (headers, every new file) and, for each edited file, that the lines the patch removes and adds are exactly the
ones the edits remove and add. With a base, it compares every byte.

"""

import argparse
import difflib
import hashlib
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from upstream import package_module  # noqa: E402
from upstream.series import SERIES, Patch, Replace  # noqa: E402

UPSTREAM_MODULES = package_module("flavours").UPSTREAM_MODULES
rename_imports = package_module("flavours").rename_imports

PATCHES_DIR = ROOT / "patches"
PACKAGE_DIR = ROOT / "src" / "lightning_compile_patch"
UPSTREAM_TESTS = ROOT / "tools" / "upstream" / "tests"
AUTHOR = "lightning-compile-patch <lightning-compile-patch@users.noreply.github.com>"
DATE = "Mon, 30 Nov 2026 00:00:00 +0000"
GIT_VERSION = "2.39.5"
LICENSE_HEADER = """\
# Copyright The Lightning AI team.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""
_TAG = re.compile(r"\s+# patch: (\w+)$")


def upstream_path(module: str) -> str:
    """Where a package module lives in Lightning's tree."""
    return "src/" + UPSTREAM_MODULES[module].replace(".", "/") + ".py"


def render_module(module: str, features: set[str]) -> str:
    """A package module as Lightning code, with only ``features`` switched on."""
    lines = (PACKAGE_DIR / f"{module}.py").read_text().splitlines()
    tags = [_TAG.search(line) for line in lines]
    dropped = [bool(tag) and tag.group(1) not in features for tag in tags]

    def neighbour_dropped(index: int, step: int) -> bool:
        index += step
        while 0 <= index < len(lines) and not lines[index].strip():
            index += step
        return 0 <= index < len(lines) and dropped[index]

    kept = []
    for index, (line, tag) in enumerate(zip(lines, tags, strict=True)):
        if dropped[index]:
            continue
        if not line.strip() and neighbour_dropped(index, -1) and neighbour_dropped(index, 1):
            continue  # a blank line inside a feature that is off
        kept.append(line[: tag.start()] if tag else line)
    renames = {f"lightning_compile_patch.{name}": target for name, target in UPSTREAM_MODULES.items()}
    return LICENSE_HEADER + rename_imports("\n".join(kept) + "\n", renames)


def features_up_to(index: int) -> set[str]:
    """The features switched on once the patches up to ``index`` are applied."""
    return {patch.feature for patch in SERIES[: index + 1] if patch.feature}


def apply_edit(content: str, edit: Replace) -> str:
    """``content`` with ``edit`` applied; raises if ``edit.old`` does not occur exactly ``edit.count`` times."""
    found = content.count(edit.old)
    if found != edit.count:
        raise ValueError(f"{edit.path}: expected {edit.count} occurrence(s) of {edit.old[:80]!r}, found {found}")
    return content.replace(edit.old, edit.new)


def edit_line_changes(edit: Replace) -> tuple[list[str], list[str]]:
    """The lines an edit removes and adds, each list repeated ``edit.count`` times. Edits replace whole lines."""
    removed, added = [], []
    for line in difflib.ndiff(edit.old.splitlines(), edit.new.splitlines()):
        if line.startswith("- "):
            removed.append(line[2:])
        elif line.startswith("+ "):
            added.append(line[2:])
    return removed * edit.count, added * edit.count


def blob_id(content: str | None) -> str:
    """The git blob id of ``content`` (zeros for an absent file)."""
    if content is None:
        return "0" * 40
    data = content.encode()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def file_diff(path: str, before: str | None, after: str) -> str:
    """One file's section of a patch, as ``git format-patch --full-index`` writes it."""
    old_lines = before.splitlines(keepends=True) if before is not None else []
    hunks = difflib.unified_diff(old_lines, after.splitlines(keepends=True), n=3)
    body = "".join(line for line in hunks if not line.startswith(("---", "+++")))
    header = f"diff --git a/{path} b/{path}\n"
    if before is None:
        header += f"new file mode 100644\nindex {blob_id(None)}..{blob_id(after)}\n--- /dev/null\n+++ b/{path}\n"
    else:
        header += f"index {blob_id(before)}..{blob_id(after)} 100644\n--- a/{path}\n+++ b/{path}\n"
    return header + body


@dataclass
class Base:
    """Lightning's tree the series applies to; files it lacks read as ``None``."""

    root: Path | None

    def read(self, path: str) -> str | None:
        """The file at ``path`` in the base, or ``None``."""
        if self.root is None or not (self.root / path).exists():
            return None
        return (self.root / path).read_text()


def patch_sections(base: Base) -> Iterator[tuple[Patch, dict[str, str]]]:
    """For each patch, its file sections by path; an edited file the base lacks gets a placeholder section."""
    state: dict[str, str | None] = {}
    for index, patch in enumerate(SERIES):
        features = features_up_to(index)
        sections: dict[str, str] = {}
        new_files = {upstream_path(module): render_module(module, features) for module in UPSTREAM_MODULES}
        for path, content in new_files.items():
            before = state.get(path)
            introduced = path in {upstream_path(module) for module in patch.modules}
            if introduced or (before is not None and before != content):
                sections[path] = file_diff(path, before, content)
                state[path] = content
        for test in patch.tests:
            path = f"tests/{test}"
            sections[path] = file_diff(path, None, (UPSTREAM_TESTS / test).read_text())
        for path in dict.fromkeys(edit.path for edit in patch.edits):
            before = state[path] if path in state else base.read(path)
            if before is None:
                sections[path] = _UNKNOWN_BASE
                continue
            after = before
            for edit in patch.edits:
                if edit.path == path:
                    after = apply_edit(after, edit)
            sections[path] = file_diff(path, before, after)
            state[path] = after
        yield patch, sections


_UNKNOWN_BASE = "<the base lacks this file>"


def render_patch(number: int, total: int, patch: Patch, sections: dict[str, str]) -> str:
    """One patch file, in ``git format-patch`` form."""
    diff = "".join(sections[path] for path in sorted(sections))
    commit = hashlib.sha1(f"{patch.subject}\n{diff}".encode()).hexdigest()
    return (
        f"From {commit} Mon Sep 17 00:00:00 2001\n"
        f"From: {AUTHOR}\n"
        f"Date: {DATE}\n"
        f"Subject: [PATCH {number}/{total}] {patch.subject}\n\n"
        f"{patch.body}\n---\n{diff}-- \n{GIT_VERSION}\n\n"
    )


def patch_filename(number: int, patch: Patch) -> str:
    """The file name ``git format-patch`` would give the patch."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", patch.subject).strip("-")[:52].rstrip("-")
    return f"{number:04d}-{slug}.patch"


def generate(base: Base) -> dict[str, str]:
    """Every patch file of the series, by file name; raises if a section needs a base file that is missing."""
    out = {}
    for number, (patch, sections) in enumerate(patch_sections(base), start=1):
        missing = [path for path, section in sections.items() if section is _UNKNOWN_BASE]
        if missing:
            raise SystemExit(f"the base at {base.root} lacks {', '.join(missing)}: see tools/lightning_base.py")
        out[patch_filename(number, patch)] = render_patch(number, len(SERIES), patch, sections)
    return out


def split_sections(patch_text: str) -> tuple[str, dict[str, str]]:
    """A patch file's header and its file sections by path."""
    head, _, rest = patch_text.partition("\ndiff --git ")
    rest, _, _ = ("diff --git " + rest).rpartition("-- \n")
    sections = {}
    for chunk in re.split(r"(?m)^(?=diff --git )", rest):
        if chunk:
            path = chunk.split()[2][2:]
            sections[path] = chunk
    return head, sections


def check(base: Base) -> list[str]:
    """The differences between ``patches/`` and the regeneration; empty when there is no drift."""
    problems = []
    committed = {p.name: p.read_text() for p in sorted(PATCHES_DIR.glob("*.patch"))}
    expected_names = [patch_filename(n, p) for n, p in enumerate(SERIES, start=1)]
    if list(committed) != expected_names:
        problems.append(f"patches/ holds {list(committed)}, the series is {expected_names}")
        return problems
    for number, (patch, sections) in enumerate(patch_sections(base), start=1):
        name = patch_filename(number, patch)
        head, committed_sections = split_sections(committed[name])
        if sorted(committed_sections) != sorted(sections):
            problems.append(f"{name}: touches {sorted(committed_sections)}, expected {sorted(sections)}")
            continue
        if not head.endswith(f"Subject: [PATCH {number}/{len(SERIES)}] {patch.subject}\n\n{patch.body}\n---"):
            problems.append(f"{name}: the subject or message differs from tools/upstream/series.py")
        for path, section in sections.items():
            if section is _UNKNOWN_BASE:
                problems += _check_edited_lines(name, path, committed_sections[path], patch)
            elif committed_sections[path] != section:
                problems.append(f"{name}: {path} differs from the regenerated file")
    return problems


def _check_edited_lines(name: str, path: str, section: str, patch: Patch) -> list[str]:
    """Without the base file: the section must remove and add exactly the lines the edits remove and add."""
    removed, added = [], []
    for edit in patch.edits:
        if edit.path == path:
            r, a = edit_line_changes(edit)
            removed += r
            added += a
    lines = section.split("\n@@", 1)[1].splitlines()[1:] if "\n@@" in section else []
    got_removed = [line[1:] for line in lines if line.startswith("-")]
    got_added = [line[1:] for line in lines if line.startswith("+")]

    def same(got: list[str], expected: list[str]) -> bool:  # blank lines may pair up differently in a whole file
        return sorted(filter(None, got)) == sorted(filter(None, expected))

    if not (same(got_removed, removed) and same(got_added, added)):
        return [f"{name}: {path} does not make exactly the edits in tools/upstream/series.py"]
    return []


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["write", "check"])
    parser.add_argument("--base", type=Path, help="Lightning 2.6.6 tree the series applies to")
    args = parser.parse_args(argv)
    base = Base(args.base)
    if args.command == "write":
        if args.base is None:
            parser.error("write needs --base: the edits of Lightning's files are made on it")
        for old in PATCHES_DIR.glob("*.patch"):
            old.unlink()
        PATCHES_DIR.mkdir(exist_ok=True)
        for name, text in generate(base).items():
            (PATCHES_DIR / name).write_text(text)
            print(f"wrote patches/{name}")
        return 0
    problems = check(base)
    for problem in problems:
        print(f"drift: {problem}", file=sys.stderr)
    if not problems:
        print(f"patches/ matches the package ({'every byte' if args.base else 'without a base: new files and edits'})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
