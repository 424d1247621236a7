#!/usr/bin/env bash
# What only the test suite needs, beside what tools/setup.sh installs for the
# product (the demo does not wait for these): Google's pprof and speedscope,
# whose own readers read gfxclient's profile files (tools/profile_viewers.sh),
# Slurm and munge (tests/kernel/test_slurm_job.py's cluster, tools/slurm_lab.sh),
# and PyTorch's CPU build, whose training loop tests/kernel/test_torch_profile.py
# profiles. Run by tools/test.sh after tools/setup.sh; idempotent.
#
# GFXBPF_NO_TORCH=1 installs no PyTorch: the Debian 13 leg of CI
# (tools/debian13.sh), whose Python 3.13 has no CPU build of torch on the
# registries this project installs from (PyPI's is the CUDA build, about
# 3 GB with its libraries); that leg leaves test_torch_profile.py out.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GFXBPF_VENV:-/opt/gfxbpf/venv}

PACKAGES=(golang-go golang-github-google-pprof-dev)   # pprof, built by profile_viewers.sh
# tools/slurm_lab.sh: the job tests' one-machine cluster (iproute2: its --two-nodes
# veth pair). GFXBPF_NO_SLURM=1
# (the Debian 13 leg, which leaves those tests out): their packages' scripts
# would start a munged in that userland that outlives the run.
[ "${GFXBPF_NO_SLURM:-0}" = 1 ] || PACKAGES+=(slurm-wlm slurm-client munge iproute2)
missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "test_deps: installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    . tools/apt_wait.sh
    apt_get_waiting update -q
    apt_get_waiting install -y -q --no-install-recommends "${missing[@]}"
fi
tools/profile_viewers.sh

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
