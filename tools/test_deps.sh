#!/usr/bin/env bash
# What only the test suite and the bench need, beside what tools/setup.sh
# installs for the product (the demo does not wait for these): the Debian
# packages below (BPF toolchain, peers, a browser, Prometheus, ...), Google's pprof and speedscope,
# whose own readers read gfxclient's profile files (tools/profile_viewers.sh),
# Slurm and munge (tests/kernel/test_slurm_job.py's cluster, tools/slurm_lab.sh),
# and PyTorch's CPU build, whose training loop tests/kernel/test_torch_profile.py
# profiles. Run by tools/test.sh after tools/setup.sh; idempotent.
#
# GFXBPF_DEBS_ONLY=1 installs the Debian packages only (bench/run's peers).
# GFXBPF_NO_TORCH=1 installs no PyTorch: the Debian 13 leg of CI
# (tools/debian13.sh), whose Python 3.13 has no CPU build of torch on the
# registries this project installs from (PyPI's is the CUDA build, about
# 3 GB with its libraries); that leg leaves test_torch_profile.py out.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GFXBPF_VENV:-/opt/gfxbpf/venv}

PACKAGES=(
    clang llvm libbpf-dev bpftool   # build and check the BPF objects (tools/build_bpf.py --check)
    bpftrace linux-perf   # the peers of the bench and of the profile tests
    libbpf-tools   # conformance corpus: BPF objects embedded in Debian's built tools; offcputime
    tmux   # terminal tests (gfxclient watch's screen)
    systemd   # systemd-analyze (unit checks), systemd-socket-activate (activation test)
    chromium   # headless browser: the flame-graph SVG is tested in a real one
    prometheus   # a real Prometheus server (and promtool) for the exporter's tests
    systemtap-sdt-dev   # <sys/sdt.h>: the USDT probe test program
    openssl   # the certificates deploy/README.md makes (tests/unit/test_tls_docs.py)
    xz-utils gzip   # real stripped Debian programs the unwinder tests profile
    debootstrap   # the kernel tests' Debian 13 userland (tools/debian13_rootfs.sh)
    make   # tools/python_freethreaded.sh builds a free-threaded CPython
    qemu-system-x86   # boots Debian's own kernels (tools/stock_kernels.py)
)
. tools/apt_wait.sh
apt_install_missing test_deps "${PACKAGES[@]}"
# tools/slurm_lab.sh: the job tests' one-machine cluster (iproute2: its --two-nodes
# veth pair). GFXBPF_NO_SLURM=1 (the Debian 13 leg, which leaves those tests
# out): their packages' scripts would start a munged in that userland that
# outlives the run.
[ "${GFXBPF_NO_SLURM:-0}" = 1 ] || apt_install_missing test_deps slurm-wlm slurm-client munge iproute2
[ "${GFXBPF_DEBS_ONLY:-0}" = 1 ] && exit 0   # bench/run: its peers, not the viewers nor torch
apt_install_missing test_deps golang-go golang-github-google-pprof-dev   # pprof, for:
tools/profile_viewers.sh
# A free-threaded CPython (3.13t) for tests/kernel/test_python_builds.py: Debian
# packages none, so it is built from Debian 13's python3.13 source, once, into
# /var/cache/gfxbpf (a few minutes; the Debian 13 leg shares that cache).
tools/python_freethreaded.sh >/dev/null

# torch 2.13.0: on this project's machines pip finds its CPU build (a 190 MB
# wheel, about 850 MB in the venv with its dependencies).
TORCH=2.13.0
if [ "${GFXBPF_NO_TORCH:-0}" != 1 ]; then
    have=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)
    if [ "${have%%+*}" != "$TORCH" ]; then
        echo "test_deps: installing torch $TORCH into $VENV"
        "$VENV/bin/pip" install -q "torch==$TORCH"
        chmod -R a+rX "$VENV"
    fi
fi
