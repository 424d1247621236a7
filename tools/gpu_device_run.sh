#!/usr/bin/env bash
# tools/gpu_device_run.sh: one prepared run of the GPU checks on a lent GPU
# machine that has no network (PyTorch with CUDA 13, Python 3.12, gcc, root).
#
#   tools/gpu_device_run.sh --prepare   here, with network: the wheels the
#                                       machine lacks and the CUPTI headers, in
#                                       .gpu/ (git-ignored; carry it)
#   tools/gpu_device_run.sh             there, as root from the checkout's root:
#                                       installs the wheels into /tmp/site, builds
#                                       the CUPTI injection library against the
#                                       machine's own libcupti, runs
#                                       tools/gpu_check.sh with step 6 (--inject)
#                                       and leaves everything in $OUT
#   tools/gpu_device_run.sh --parts     there: the same set-up, then only
#                                       bench/gpu_overhead_parts.py (the cost of
#                                       listening, part by part) into $OUT/parts.json;
#                                       GFX_PARTS_ONLY=a,b runs only those parts,
#                                       GFX_PARTS_MEASURE=train times training
#                                       steps instead of the launch-bound loop
#
# $OUT (default /tmp/gpu-out) gets: run.log (this script), gpu_check.log (the
# report, with step 6's JSON), gpu_check.tgz (the work folder), kernels.json,
# env.txt (driver, GPU, Python, CUPTI found). Meant to finish in about 5
# minutes: GFX_LAUNCHES (default 20000) and GFX_SKIP_PYTHON=1 shorten it;
# GFX_CHECK_TIMEOUT (default 330 s) bounds gpu_check.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
GPU=.gpu

prepare() {
    set -e
    local exclude venv
    exclude=$(git rev-parse --git-path info/exclude)
    grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
    rm -rf "$GPU" && mkdir -p "$GPU/whl" "$GPU/cupti13"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$GPU/whl" \
        "protobuf>=7.35.1,<8" "grpcio==1.85.1" "pyelftools>=0.29" "typing_extensions>=4.12"
    # python-prctl has no wheels: build it for 3.12 here (libcap-dev, Python 3.12's headers).
    PY312=python3.12  # a pyenv shim may name one it does not run: take the pyenv build then
    python3.12 -V >/dev/null 2>&1 || PY312=$(ls -d "$HOME"/.pyenv/versions/3.12*/bin/python3.12 | tail -1)
    "$PY312" -V >/dev/null 2>&1 || { echo "prepare: needs a Python 3.12 to build python-prctl"; exit 1; }
    "$PY312" -m pip wheel -q --no-deps -w "$GPU/whl" "python-prctl==1.8.1"
    venv=${GFXBPF_VENV:-/opt/gfxbpf/venv}
    "$venv/bin/python" -m pip wheel -q --no-deps -w "$GPU/whl" .
    # CUPTI 13's headers (with cuda.h and crt/), in case the machine's wheels lack some.
    if [ ! -f "$(dirname "$venv")/cupti/cu13/include/cupti.h" ]; then
        gpu/cupti/build.sh --out "$(dirname "$venv")/cupti" --python "$venv/bin/python"
    fi
    cp -r "$(dirname "$venv")/cupti/cu13/include" "$GPU/cupti13/"
    # <sys/sdt.h> (the USDT probes): the GPU image has no systemtap-sdt-dev.
    mkdir -p "$GPU/cupti13/include/sys"
    cp /usr/include/x86_64-linux-gnu/sys/sdt.h /usr/include/x86_64-linux-gnu/sys/sdt-config.h \
        "$GPU/cupti13/include/sys/"
    du -sh "$GPU"; ls "$GPU/whl"
}

if [ "${1:-}" = --prepare ]; then prepare; exit; fi
PARTS=0
[ "${1:-}" = --parts ] && { PARTS=1; shift; }
[ "${1:-}" = "" ] || { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }

OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
T0=$(date +%s)
say() { echo "== $(($(date +%s) - T0)) s: $*"; }
[ -d "$GPU/whl" ] || { echo "no $GPU/whl: run tools/gpu_device_run.sh --prepare and carry .gpu"; exit 1; }

say "Python with PyTorch"
PY=""
for p in python3 /opt/torch/.venv/bin/python /usr/bin/python3; do
    if command -v "$p" >/dev/null && "$p" -c 'import torch' 2>/dev/null; then PY=$(command -v "$p"); break; fi
done
[ -n "$PY" ] || { echo "no Python with torch found"; exit 1; }

say "wheels into /tmp/site"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$GPU"/whl/*.whl || exit 1
chmod -R a+rX /tmp/site
export PYTHONPATH=/tmp/site

say "CUPTI of the machine"
read -r CUPTI_LIB CUPTI_INC < <("$PY" - <<'EOF'
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + sys.path
libs = [p for r in roots for p in glob.glob(os.path.join(r, "nvidia", "*", "lib", "libcupti.so.13"))]
lib = os.path.dirname(os.path.realpath(libs[0])) if libs else "-"
inc = os.path.join(os.path.dirname(lib), "include")
print(lib, inc if os.path.exists(os.path.join(inc, "cupti.h")) else "-")
EOF
)
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    uname -r; "$PY" -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda)'
    echo "libcupti: $CUPTI_LIB; headers: $CUPTI_INC"
    ls -la "$CUPTI_LIB" 2>&1 | head -5
} | tee "$OUT/env.txt"
INCS=()
[ "$CUPTI_INC" != - ] && INCS+=(--include "$CUPTI_INC")
[ -d /usr/local/cuda/include ] && INCS+=(--include /usr/local/cuda/include)
INCS+=(--include "$GPU/cupti13/include")
LIBARG=()
[ "$CUPTI_LIB" != - ] && LIBARG=(--lib "$CUPTI_LIB")

say "building the injection library"
gpu/cupti/build.sh --major 13 "${INCS[@]}" "${LIBARG[@]}" --out /tmp/gfxcupti || exit 1
chmod -R a+rX /tmp/gfxcupti
INJECT=/tmp/gfxcupti/libgfxcupti-cu13.so

if [ "$PARTS" = 1 ]; then
    say "bench/gpu_overhead_parts.py"
    timeout 400 "$PY" bench/gpu_overhead_parts.py --inject "$INJECT" --python "$PY" \
        --launches "${GFX_LAUNCHES:-20000}" --only "${GFX_PARTS_ONLY:-}" \
        --measure "${GFX_PARTS_MEASURE:-loop}" \
        --out "$OUT/parts.json" > "$OUT/parts.log" 2>&1
    echo "gpu_overhead_parts.py exit $?"
    tail -40 "$OUT/parts.log"
    say "done"
    sleep 1
    exit 0
fi

say "tools/gpu_check.sh with step 6"
SKIP=()
[ "${GFX_SKIP_PYTHON:-0}" = 1 ] && SKIP=(--skip-python)
timeout "${GFX_CHECK_TIMEOUT:-330}" tools/gpu_check.sh --site /tmp/site --python "$PY" --launches "${GFX_LAUNCHES:-20000}" \
    --inject "$INJECT" --keep --out "$OUT" "${SKIP[@]}" > "$OUT/gpu_check.log" 2>&1
echo "gpu_check.sh exit $?"
cp /tmp/gfxbpf-gpu-check.*/kernels.json "$OUT/" 2>/dev/null
tail -60 "$OUT/gpu_check.log"
say "done"
sleep 1  # tee's last lines reach run.log
