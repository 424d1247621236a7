#!/usr/bin/env bash
# Install everything gfxbpf needs on a fresh Debian machine (run as root).
# Idempotent: a second run only checks. Used by tools/test.sh, tools/demo.sh,
# bench/run and .ci/run; tools/test_deps.sh adds what only tests and bench use.
#
#   tools/setup.sh [--dev]
#
# --dev  also the test and lint tools (the package's dev extra: pytest, ruff,
#        mypy, ...): tools/test.sh passes it, and GFXBPF_EDITABLE=1 (a
#        developer's machine) implies it. The main job (tools/demo.sh) waits
#        for neither.
set -euo pipefail
cd "$(dirname "$0")/.."
DEV=${GFXBPF_EDITABLE:-0}
case "${1:-}" in
    --dev) DEV=1 ;;
    "") ;;
    -h | --help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup: unknown argument $1 (see tools/setup.sh --help)" >&2; exit 2 ;;
esac

VENV=${GFXBPF_VENV:-/opt/gfxbpf/venv}
# What the product needs, and the main job (tools/demo.sh) waits for: what
# only the tests and the bench use is in tools/test_deps.sh.
DEB_PACKAGES=(
    libcap-dev python3-dev python3-venv gcc   # python-prctl builds against libcap; the CUPTI library
    procps util-linux   # setpriv (tools/broker.sh runs the unit's command line with it), ps
    libc6-dbg   # names glibc's static frames (__libc_start_call_main, start_thread) in profiles
    binutils   # c++filt: readable C++ frames in profiles
    systemtap-sdt-dev   # <sys/sdt.h>: the CUPTI injection library's USDT probes (gpu/cupti)
)
. tools/apt_wait.sh
apt_install_missing setup "${DEB_PACKAGES[@]}"

# A venv built on Debian's python under /opt, readable by every user: the
# tests run the broker and clients as non-root users, who cannot read /root.
if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV"
    mkdir -p "$(dirname "$VENV")"
    /usr/bin/python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
fi
# The CUPTI injection library, once per CUDA major (gpu/cupti/build.sh; wheels
# from PyPI): downloaded and built while pip installs the package, both mostly
# waiting on the network.
CUPTI=$(dirname "$VENV")/cupti
gpu/cupti/build.sh --out "$CUPTI" --python "$VENV/bin/python" &
CUPTI_PID=$!
cupti_done() {
    wait "$CUPTI_PID" || { echo "setup: building the CUPTI library failed (gpu/cupti/build.sh)" >&2; exit 1; }
    chmod -R a+rX "$CUPTI"
}
if [ "${GFXBPF_SKIP_INSTALL:-0}" = 1 ] && "$VENV/bin/python" -c "import gfxbpf.broker.main" 2>/dev/null; then
    cupti_done
    exit 0  # already installed by the caller (tests/kernel/test_demo.py)
fi
EXTRAS=broker,client,exporter
[ "$DEV" = 1 ] && EXTRAS=$EXTRAS,dev
echo "setup: installing gfxbpf[$EXTRAS] into $VENV"
# GFXBPF_EDITABLE=1: developers' machines, where the tree is readable by all.
if [ "${GFXBPF_EDITABLE:-0}" = 1 ]; then
    "$VENV/bin/pip" install -q -e ".[$EXTRAS]"
else
    "$VENV/bin/pip" install -q ".[$EXTRAS]"
fi
cupti_done
chmod -R a+rX "$(dirname "$VENV")"
