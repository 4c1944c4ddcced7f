#!/bin/bash
# Lightning's lint and mypy on the files each master rung adds or changes, with Lightning's own pyproject.toml:
# the core (0001 to the seam, 0007) one on another, then each fork rung alone on the seam. Prints one line per rung
# ("clean", or the findings), then mypy's errors that stock master does not have.
#
#   LINT_BIN=DIR  a bin/ with ruff 0.15.9, codespell 2.4.2, docformatter 1.7.7, sphinx-lint 1.0.2, mypy 1.20.0 and the
#                 stubs of Lightning's requirements/typing.txt (Lightning's CI versions)
#   MYPY_PYTHON=PY  the python whose site-packages mypy reads (torch 2.9.1: .nox/lightning_ci-torch-2-9-1/bin/python)
#   tools/lightning_lint.sh LIGHTNING_MASTER_DIR      # an extracted master tree (the archive in ../shared/lightning-tests,
#                                                     # which has no tests/tests_fabric: those changes are left out)
set -u
BASE=${1:?an extracted Lightning master tree}
L=${LINT_BIN:?set LINT_BIN to a bin folder with the lint tools of Lightning CI}
PYX=${MYPY_PYTHON:-}
TOOLS=$(cd "$(dirname "$0")" && pwd)
P=$(dirname "$TOOLS")/patches/lightning-master
SEAM=0007  # the last patch of the core: the fork rungs each apply on it alone
WORK=$(mktemp -d)
cp -r "$BASE" "$WORK/tree" && cd "$WORK/tree" && git init -q && git add -A && git -c user.email=x@y -c user.name=x commit -qm base
absent() { python3 "$TOOLS/lightning_ci.py" excludes "$1"; }  # `--exclude` for each test file a patch changes, absent here
lint() {
  local name=$1 from=$2 changed py rst out=""
  changed=$(git diff --name-only --diff-filter=AM "$from" HEAD)
  py=$(echo "$changed" | grep '\.py$' || true)
  rst=$(echo "$changed" | grep '\.rst$' || true)
  if [ -n "$py" ]; then
    out+=$("$L/ruff" check -q $py 2>&1)
    out+=$("$L/ruff" format --check -q $py 2>&1)
    out+=$("$L/docformatter" --check --config pyproject.toml $py 2>&1)
  fi
  [ -n "$changed" ] && out+=$("$L/codespell" $changed 2>&1)
  [ -n "$rst" ] && out+=$("$L/sphinx-lint" $rst 2>&1 | grep -v "^No problems found")
  if [ -z "$out" ]; then echo "$name: lint clean ($(echo "$changed" | wc -l) files)"; else echo "$name:"; echo "$out"; fi
  if [ -n "$PYX" ]; then
    "$L/mypy" --python-executable "$PYX" --cache-dir "$WORK/mypy-cache" 2>&1 | grep ": error:" | sed 's/:[0-9]*: /: /' | sort > "$WORK/mypy-$name.txt"
    [ "$name" = stock ] || { echo "$name: mypy, new against stock: $(comm -13 "$WORK/mypy-stock.txt" "$WORK/mypy-$name.txt" | wc -l)"; comm -13 "$WORK/mypy-stock.txt" "$WORK/mypy-$name.txt"; }
  fi
}
[ -n "$PYX" ] && lint stock HEAD >/dev/null
for p in "$P"/00[0-9][0-9]*.patch; do
  [ "$(basename "$p" | cut -c1-4)" \> "$SEAM" ] && break
  prev=$(git rev-parse HEAD); git -c user.email=x@y -c user.name=x am -q $(absent "$p") "$p" || { echo "FAILED to apply $p"; exit 1; }
  lint "$(basename "$p" | cut -c1-4)" "$prev"
done
CORE=$(git rev-parse HEAD)
for p in "$P"/00[0-9][0-9]*.patch; do
  n=$(basename "$p" | cut -c1-4); [ "$n" \> "$SEAM" ] || continue
  git checkout -q "$CORE"
  git -c user.email=x@y -c user.name=x am -q $(absent "$p") "$p" || { echo "$n: does not apply on $SEAM"; git am --abort; continue; }
  lint "$n" "$CORE"
done
rm -rf "$WORK"
