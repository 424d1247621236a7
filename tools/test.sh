#!/usr/bin/env bash
# Run the whole test suite: sets up the machine first (see tools/setup.sh).
# Kernel tests need root; with CI=true a skipped kernel test is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh --dev   # with the test and lint tools (pytest, ruff, mypy)
export GFXBPF_VENV=${GFXBPF_VENV:-/opt/gfxbpf/venv}
tools/test_deps.sh   # pprof, speedscope and torch: only the tests use them
VENV=$GFXBPF_VENV
tools/lint.sh   # ruff and mypy first: CI fails when either regresses
exec "$VENV/bin/python" -m pytest -q -rs -p no:cacheprovider tests "$@"
