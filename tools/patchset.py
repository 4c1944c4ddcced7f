"""Generates the upstream ladders in ``patches/`` from the package's own code, and checks them for drift.

    python tools/patchset.py write --base-name 2.6.6 --base BASE   # regenerate patches/lightning-2.6.6/
    python tools/patchset.py write --base-name master --base REPO  # regenerate patches/lightning-master/
    python tools/patchset.py check [--base-name NAME --base PATH]  # fail if patches/ differs from a regeneration

What each patch contains:

* new source files: the package's Lightning-side modules (``upstream_modules.UPSTREAM_MODULES``), with imports
  renamed to Lightning's paths and Lightning's license header: the connector in three rungs (0005 and 0006 from
  ``tools/upstream/rungs/``, 0007 the package's, with the seam's modules), one feature module per later patch
  (``fallback`` comes with ``compile_errors``);
* new test files, verbatim from ``tools/upstream/tests``, and tests added to Lightning's own test files (a fix's),
  from modules there that run on their own;
* edits of Lightning's own files (``tools/upstream/series.py``), applied to the base; a function that the package
  fixes (``lightning_fixes``) replaces Lightning's.

Without a base (CI has no checkout of Lightning's docs and tests), ``check`` compares everything it can regenerate
exactly (headers, every new file) and, for each edited file, that the lines the patch adds are exactly the ones the
edits add (and removes the ones a text replacement removes). With a base, it compares every byte.

"""

import argparse
import ast
import difflib
import hashlib
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from upstream import package_module  # noqa: E402
from upstream.series import BASES, CORE_STACK, AddTests, InsertAfter, Patch, Replace, ReplaceDef, series  # noqa: E402

upstream_modules = package_module("upstream_modules")
UPSTREAM_MODULES = upstream_modules.UPSTREAM_MODULES

PATCHES_DIR = ROOT / "patches"
PACKAGE_DIR = ROOT / "src" / "lightning_compile_patch"
UPSTREAM_TESTS = ROOT / "tools" / "upstream" / "tests"
RUNGS = ROOT / "tools" / "upstream" / "rungs"
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


def series_dir(base_name: str) -> Path:
    """Where the ladder for ``base_name`` lives."""
    return PATCHES_DIR / f"lightning-{base_name}"


def upstream_path(module: str) -> str:
    """Where a package module lives in Lightning's tree."""
    path = "src/" + UPSTREAM_MODULES[module].replace(".", "/")
    return f"{path}/__init__.py" if upstream_modules.module_path(module).name == "__init__.py" else f"{path}.py"


def source_file(module: str, rung: str = "") -> Path:
    """The file of a package module as the patch of ``rung`` adds it: the rung's own, or else the package's."""
    package_file = upstream_modules.module_path(module)
    earlier = RUNGS / rung / package_file.relative_to(PACKAGE_DIR) if rung else None
    return earlier if earlier is not None and earlier.exists() else package_file


def render_module(module: str, rung: str = "") -> str:
    """A package module as Lightning code, as the patch of ``rung`` adds it (``Patch.rung``)."""
    source = source_file(module, rung).read_text()
    if not source:
        return source  # an empty package `__init__.py`, as Lightning's are
    renames = {f"lightning_compile_patch.{name}": target for name, target in UPSTREAM_MODULES.items()}
    return LICENSE_HEADER + wrap_long_imports(sort_lightning_imports(upstream_modules.rename_imports(source, renames)))


def wrap_long_imports(source: str, width: int = 120) -> str:
    """Splits a ``from ... import`` line that the renaming made longer than ``width``, one name a line, as ruff does."""
    lines = source.splitlines(keepends=True)
    for node in reversed(ast.parse(source).body):
        line = lines[node.lineno - 1]
        if isinstance(node, ast.ImportFrom) and node.lineno == node.end_lineno and len(line.rstrip("\n")) > width:
            head = line[: line.index(" import ") + len(" import ")]
            names = "".join(f"    {ast.unparse(alias)},\n" for alias in node.names)
            lines[node.lineno - 1] = f"{head}(\n{names})\n"
    return "".join(lines)


def sort_lightning_imports(source: str) -> str:
    """Sorts each run of ``from lightning.... import`` statements by module again, as Lightning's isort does.

    The renaming moves a name across others: ``lightning_compile_patch.compile_connector`` sorts after
    ``lightning.pytorch.utilities``, ``lightning.pytorch.trainer.connectors.compile_connector`` before it.

    """
    lines = source.splitlines(keepends=True)
    runs: list[list[ast.ImportFrom]] = []
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("lightning.")):
            runs.append([])
        elif runs and runs[-1] and runs[-1][-1].end_lineno == node.lineno - 1:
            runs[-1].append(node)
        else:
            runs.append([node])
    for run in reversed([run for run in runs if len(run) > 1]):
        statements = sorted(run, key=lambda node: str(node.module))
        first, last = run[0].lineno - 1, run[-1].end_lineno
        lines[first:last] = ["".join(lines[node.lineno - 1 : node.end_lineno]) for node in statements]
    return "".join(lines)


def _def_span(tree: ast.Module, name: str, cls: str | None) -> tuple[int, int]:
    """The first and last line (1-based) of the function ``name`` (a method of ``cls``), decorators included."""
    scope: list[ast.stmt] = tree.body
    if cls is not None:
        scope = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    node = next(n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name)
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    assert node.end_lineno is not None
    return first, node.end_lineno


def fixed_source(edit: ReplaceDef, rung: str = "") -> str:
    """The fixed version of a Lightning function: the rung's own (``Patch.rung``), or else the package's."""
    sources = [
        path.read_text()
        for path in dict.fromkeys((source_file("lightning_fixes", rung), PACKAGE_DIR / "lightning_fixes.py"))
    ]
    defs = []
    for name in (edit.name, *edit.then):
        source = next(source for source in sources if _defines(ast.parse(source), name, edit.cls))
        first, last = _def_span(ast.parse(source), name, edit.cls)
        defs.append("".join(source.splitlines(keepends=True)[first - 1 : last]))
    return "\n\n".join(defs)


def _defines(tree: ast.Module, name: str, cls: str | None) -> bool:
    """Whether ``tree`` defines the function ``name`` (a method of ``cls``, if given)."""
    scope = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls] if cls else [tree]
    return any(isinstance(n, ast.FunctionDef) and n.name == name for owner in scope for n in owner.body)


Edit = Replace | InsertAfter | ReplaceDef | AddTests


def _imported(tree: ast.Module) -> set[tuple[str | None, str, str | None]]:
    """What a module imports at its top level: (module of a ``from`` import, name, alias)."""
    return {
        (node.module if isinstance(node, ast.ImportFrom) else None, alias.name, alias.asname)
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }


def add_tests(content: str, edit: AddTests) -> str:
    """``content``, a test file of Lightning's, with the tests of ``edit.source`` after the function ``edit.after``."""
    tree = ast.parse(content)
    lines = content.splitlines(keepends=True)
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == edit.after]
    if len(found) != 1:
        raise ValueError(f"{edit.path}: expected one test function {edit.after!r}, found {len(found)}")
    imported = _imported(tree)
    module_of = {module for module, _, _ in imported if module}
    top = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    added = {n.name for n in ast.parse(edit.body()).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    if top & added:
        raise ValueError(f"{edit.path} already defines {sorted(top & added)}, which {edit.source} adds")
    end = found[0].end_lineno or 0
    lines[end:end] = ["\n", "\n", *edit.body().splitlines(keepends=True)]  # the file's blank lines follow it
    for node in reversed(edit.imports()):
        if _imported(ast.Module(body=[node], type_ignores=[])) <= imported:
            continue
        if not isinstance(node, ast.ImportFrom) or node.module in module_of:
            raise ValueError(
                f"{edit.source} imports {ast.unparse(node)!r}, which {edit.path} lacks: import it there as {edit.path}"
                " does, or add its import to the file with an edit of its own"
            )
        # a `from` import of a new module: in order among the file's `from` imports of the same package
        package = (node.module or "").split(".")[0]
        kin = [n for n in tree.body if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == package]
        if not kin:
            raise ValueError(f"{edit.path} imports nothing from {package}: add {ast.unparse(node)!r} with an edit")
        later = [n.lineno - 1 for n in kin if (n.module or "") > (node.module or "")]
        at = min(later) if later else max(n.end_lineno or 0 for n in kin)
        lines[at:at] = [ast.unparse(node) + "\n"]
    return "".join(lines)


def apply_edit(content: str, edit: Edit, rung: str = "") -> str:
    """``content`` with ``edit`` applied; raises if the edit's anchor is not where it should be."""
    if isinstance(edit, AddTests):
        return add_tests(content, edit)
    if isinstance(edit, ReplaceDef):
        first, last = _def_span(ast.parse(content), edit.name, edit.cls)
        lines = content.splitlines(keepends=True)
        return "".join([*lines[: first - 1], fixed_source(edit, rung), *lines[last:]])
    if isinstance(edit, InsertAfter):
        lines = content.splitlines(keepends=True)
        # in a CHANGELOG, only the unreleased section: older releases repeat some lines
        start = next((i for i, line in enumerate(lines) if line.startswith("## [unreleased]")), 0)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## [")), len(lines))
        found = [i for i in range(start, end) if lines[i].startswith(edit.prefix)]
        if len(found) != 1:
            raise ValueError(f"{edit.path}: expected one line starting with {edit.prefix!r}, found {len(found)}")
        return "".join([*lines[: found[0] + 1], edit.text, *lines[found[0] + 1 :]])
    found = content.count(edit.old)
    if found != edit.count:
        raise ValueError(f"{edit.path}: expected {edit.count} occurrence(s) of {edit.old[:80]!r}, found {found}")
    return content.replace(edit.old, edit.new)


def edit_line_changes(edit: Edit, rung: str = "") -> tuple[list[str] | None, list[str]]:
    """The lines an edit removes (``None``: unknown without the base) and adds. Edits replace whole lines."""
    if isinstance(edit, AddTests):  # and maybe imports, which only the base tells
        return None, [*edit.body().splitlines(), *(ast.unparse(node) for node in edit.imports())]
    if isinstance(edit, ReplaceDef):
        return None, fixed_source(edit, rung).splitlines()
    if isinstance(edit, InsertAfter):
        return [], edit.text.splitlines()
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
    """Lightning's tree the ladder applies to; files it lacks read as ``None``."""

    root: Path | None

    def read(self, path: str) -> str | None:
        """The file at ``path`` in the base, or ``None``."""
        if self.root is None or not (self.root / path).exists():
            return None
        return (self.root / path).read_text()


class InstalledLightning(Base):
    """The ``src/`` of the installed ``lightning`` package, as a base (its other files read as ``None``)."""

    def __init__(self) -> None:
        import lightning

        super().__init__(Path(lightning.__file__).parents[1])

    def read(self, path: str) -> str | None:
        """The installed file for a ``src/`` path, else ``None``."""
        return super().read(path.removeprefix("src/")) if path.startswith("src/") else None


_UNKNOWN_BASE = "<the base lacks this file>"


def patch_sections(base: Base, base_name: str) -> Iterator[tuple[Patch, dict[str, str]]]:
    """For each patch of the ladder, its file sections by path.

    On ``master`` every later patch is made on the core stack alone, so that it applies there without the others; on
    ``2.6.6`` each patch is made on the one before, for a plain ``git am`` of the whole ladder.
    """
    state: dict[str, str] = {}
    core_state: dict[str, str] = {}
    core_size = len(CORE_STACK)
    for index, patch in enumerate(series(base_name)):
        if index >= core_size and base_name == "master":
            state = dict(core_state)
        sections: dict[str, str] = {}
        for module in patch.modules:
            path = upstream_path(module)
            before, state[path] = state.get(path), render_module(module, patch.rung)
            sections[path] = file_diff(path, before, state[path])
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
                    after = apply_edit(after, edit, patch.rung)
            sections[path] = file_diff(path, before, after)
            state[path] = after
        if index == core_size - 1:
            core_state = dict(state)
        yield patch, sections


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


def generate(base: Base, base_name: str) -> dict[str, str]:
    """Every patch file of the ladder, by file name; raises if a section needs a base file that is missing."""
    out = {}
    total = len(series(base_name))
    for number, (patch, sections) in enumerate(patch_sections(base, base_name), start=1):
        missing = [path for path, section in sections.items() if section is _UNKNOWN_BASE]
        if missing:
            raise SystemExit(f"the base at {base.root} lacks {', '.join(missing)}: see tools/lightning_base.py")
        out[patch_filename(number, patch)] = render_patch(number, total, patch, sections)
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


def check(base: Base, base_name: str) -> list[str]:
    """The differences between ``patches/lightning-<base_name>/`` and the regeneration; empty when there is none."""
    problems = []
    folder = series_dir(base_name)
    committed = {p.name: p.read_text() for p in sorted(folder.glob("*.patch"))}
    ladder = series(base_name)
    expected_names = [patch_filename(n, p) for n, p in enumerate(ladder, start=1)]
    if list(committed) != expected_names:
        return [f"{folder.name} holds {list(committed)}, the ladder is {expected_names}"]
    for number, (patch, sections) in enumerate(patch_sections(base, base_name), start=1):
        name = f"{folder.name}/{patch_filename(number, patch)}"
        head, committed_sections = split_sections(committed[patch_filename(number, patch)])
        if sorted(committed_sections) != sorted(sections):
            problems.append(f"{name}: touches {sorted(committed_sections)}, expected {sorted(sections)}")
            continue
        if not head.endswith(f"Subject: [PATCH {number}/{len(ladder)}] {patch.subject}\n\n{patch.body}\n---"):
            problems.append(f"{name}: the subject or message differs from tools/upstream/series.py")
        for path, section in sections.items():
            if section is _UNKNOWN_BASE:
                problems += _check_edited_lines(name, path, committed_sections[path], patch)
            elif committed_sections[path] != section:
                problems.append(f"{name}: {path} differs from the regenerated file")
    return problems


def _check_edited_lines(name: str, path: str, section: str, patch: Patch) -> list[str]:
    """Without the base file: the section must add exactly the lines the edits add, and remove the known ones."""
    removed: list[str] = []
    added: list[str] = []
    whole_defs = False
    for edit in patch.edits:
        if edit.path == path:
            r, a = edit_line_changes(edit, patch.rung)
            whole_defs |= r is None
            removed += r or []
            added += a
    lines = [line for hunk in section.split("\n@@")[1:] for line in hunk.splitlines()[1:]]
    got_removed = [line[1:] for line in lines if line.startswith("-")]
    got_added = [line[1:] for line in lines if line.startswith("+")]

    def net(added: list[str], removed: list[str]) -> Counter:  # how a diff pairs lines varies; the net change does not
        return Counter(filter(None, added)) - Counter(filter(None, removed))

    if whole_defs:
        # a function replaced whole (`ReplaceDef`) removes lines only the base knows, and keeps the ones it shares
        ok = set(net(got_added, got_removed)) <= set(added) and set(net(removed, [])) <= set(got_removed)
    else:
        ok = net(got_added, got_removed) == net(added, removed) and net(got_removed, got_added) == net(removed, added)
    if not ok:
        return [f"{name}: {path} does not make exactly the edits in tools/upstream/series.py"]
    return []


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["write", "check"])
    parser.add_argument("--base-name", choices=BASES, help="which ladder (default for check: both)")
    parser.add_argument("--base", type=Path, help="Lightning's tree the ladder applies to")
    args = parser.parse_args(argv)
    if args.command == "write":
        if args.base is None or args.base_name is None:
            parser.error("write needs --base-name and --base: the edits of Lightning's files are made on the base")
        folder = series_dir(args.base_name)
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*.patch"):
            old.unlink()
        for name, text in generate(Base(args.base), args.base_name).items():
            (folder / name).write_text(text)
            print(f"wrote {folder.relative_to(ROOT)}/{name}")
        return 0
    names = [args.base_name] if args.base_name else list(BASES)
    problems = [p for name in names for p in check(Base(args.base), name)]
    for problem in problems:
        print(f"drift: {problem}", file=sys.stderr)
    if not problems:
        what = "every byte" if args.base else "without a base: new files and edits"
        print(f"patches/ matches the package for {', '.join(names)} ({what})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
