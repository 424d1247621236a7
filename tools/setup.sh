#!/usr/bin/env bash
# Install everything gfxbpf needs on a fresh Debian machine (run as root).
# Idempotent: a second run only checks. Used by tools/test.sh, tools/demo.sh and .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${GFXBPF_VENV:-/opt/gfxbpf/venv}
DEB_PACKAGES=(
    clang llvm libbpf-dev bpftool   # build and check the BPF objects
    libcap-dev python3-dev python3-venv gcc   # python-prctl builds against libcap
    bpftrace tmux procps util-linux   # peers for benchmarks, terminal tests, setpriv
    systemd   # systemd-analyze (unit checks), systemd-socket-activate (activation test)
    linux-perf   # perf record: the profiler the profile benchmark compares against
    chromium   # headless browser: the flame-graph SVG is tested in a real one
    prometheus   # a real Prometheus server (and promtool) for the exporter's tests
    libbpf-tools   # conformance corpus: BPF objects embedded in Debian's built tools
    systemtap-sdt-dev   # <sys/sdt.h>: the USDT probe test program
    openssl   # the certificates deploy/README.md makes (tests/unit/test_tls_docs.py)
    libc6-dbg   # names glibc's static frames (__libc_start_call_main, start_thread) in profiles
    binutils   # c++filt: readable C++ frames in profiles; objcopy: debug-file tests
    xz-utils gzip   # real stripped Debian programs the unwinder tests profile
    debootstrap   # the kernel tests' Debian 13 userland (tools/debian13_rootfs.sh)
)

missing=()
for p in "${DEB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "setup: installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    . tools/apt_wait.sh
    apt_get_waiting update -q
    apt_get_waiting install -y -q --no-install-recommends "${missing[@]}"
fi

# A venv built on Debian's python under /opt, readable by every user: the
# tests run the broker and clients as non-root users, who cannot read /root.
if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV"
    mkdir -p "$(dirname "$VENV")"
    /usr/bin/python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
fi
# The CUPTI injection library, once per CUDA major (gpu/cupti/build.sh; wheels from PyPI).
gpu/cupti/build.sh --out "$(dirname "$VENV")/cupti" --python "$VENV/bin/python"
chmod -R a+rX "$(dirname "$VENV")/cupti"
if [ "${GFXBPF_SKIP_INSTALL:-0}" = 1 ] && "$VENV/bin/python" -c "import gfxbpf.broker.main" 2>/dev/null; then
    exit 0  # already installed by the caller (tests/kernel/test_demo.py)
fi
echo "setup: installing gfxbpf into $VENV"
# GFXBPF_EDITABLE=1: developers' machines, where the tree is readable by all.
if [ "${GFXBPF_EDITABLE:-0}" = 1 ]; then
    "$VENV/bin/pip" install -q -e ".[broker,client,dev,exporter]"
else
    "$VENV/bin/pip" install -q ".[broker,client,dev,exporter]"
fi
chmod -R a+rX "$(dirname "$VENV")"
