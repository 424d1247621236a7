#!/usr/bin/env bash
# Lint and type-check with the venv's tools: ruff on the whole tree, mypy on
# every package, generated stubs excepted (see [tool.mypy] in pyproject.toml).
# tools/test.sh runs this before the tests, so CI fails when either regresses.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${GFXBPF_VENV:-/opt/gfxbpf/venv}

"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .

# mypy cannot follow setuptools' package-dir mapping (bpf/ is gfxbpf.bpf), not
# even through an editable install, so it checks a tree of links that spells
# the installed names; paths in its messages are mapped back to the repository.
TREE=$(mktemp -d)
trap 'rm -rf "$TREE"' EXIT
mkdir "$TREE/gfxbpf"
for pkg in tomlcheck elf bpf catalog proto broker client exporter; do
    ln -s "$ROOT/$pkg" "$TREE/gfxbpf/$pkg"
done
(cd "$TREE" && MYPYPATH="$TREE" "$VENV/bin/mypy" --config-file "$ROOT/pyproject.toml" \
    -p gfxbpf.tomlcheck -p gfxbpf.elf -p gfxbpf.bpf -p gfxbpf.catalog -p gfxbpf.proto -p gfxbpf.broker -p gfxbpf.client -p gfxbpf.exporter) |
    sed -e 's#^gfxbpf/\(tomlcheck\|elf\|bpf\|catalog\|proto\|broker\|client\|exporter\)/#\1/#'
