#!/usr/bin/env bash
# Build gfxbpf's CUPTI injection library (inject.c) once per CUDA major version
# PyTorch uses (12 and 13), against the CUPTI headers and libcupti of PyPI's
# wheels (nvidia-cuda-cupti-cu12; nvidia-cuda-cupti for 13), with cuda.h from
# the CUDA runtime wheels and crt/host_defines.h from nvidia-cuda-crt.
#
#   gpu/cupti/build.sh [--out DIR] [--python PY]
#       DIR/cu12/, DIR/cu13/: the unpacked wheels (include/, lib/)
#       DIR/libgfxcupti-cu12.so, DIR/libgfxcupti-cu13.so: the libraries
#   gpu/cupti/build.sh --major N --include DIR [--include DIR...] [--lib DIR] --out DIR
#       one build against headers already on the host (a GPU host's CUDA
#       toolkit, or the nvidia/cu13/include of PyTorch's own wheels) and the
#       libcupti.so.N in --lib (without it: the process's own, when it loads)
#
# Run by tools/setup.sh (DIR: beside the venv). Idempotent: a library newer
# than its sources is kept.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PROGRAMS=$HERE/../../catalog/programs
OUT=/opt/gfxbpf/cupti
PY=python3
MAJOR="" LIBDIR="" INCLUDES=()
while (($#)); do
    case $1 in
        --out) OUT=$2; shift 2 ;;
        --python) PY=$2; shift 2 ;;
        --major) MAJOR=$2; shift 2 ;;
        --include) INCLUDES+=("$2"); shift 2 ;;
        --lib) LIBDIR=$2; shift 2 ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
mkdir -p "$OUT"

# build MAJOR LIBDIR INCLUDE...: the injection library for that CUDA major.
build() {
    local major=$1 libdir=$2 out=$OUT/libgfxcupti-cu$1.so incs=() link=()
    shift 2
    for d in "$@"; do incs+=(-I "$d"); done
    if [ -f "$out" ] && [ "$out" -nt "$HERE/inject.c" ] && [ "$out" -nt "$PROGRAMS/gfx_cupti.h" ]; then
        return
    fi
    if [ -n "$libdir" ]; then
        link=(-L "$libdir" "-Wl,-rpath,$libdir" -l:libcupti.so."$major")
    else  # the process's own libcupti (PyTorch loads it); left unresolved until then
        link=(-Wl,--allow-shlib-undefined -Wl,--unresolved-symbols=ignore-all)
    fi
    gcc -O2 -g -fPIC -shared -fvisibility=hidden -Wall -Wno-deprecated-declarations \
        -fno-omit-frame-pointer -Wl,--enable-new-dtags -Wl,-soname,libgfxcupti-cu"$major".so \
        "${incs[@]}" -I "$PROGRAMS" -o "$out.tmp" "$HERE/inject.c" "${link[@]}" -lpthread
    mv "$out.tmp" "$out"
    echo "built $out"
}

# fetch MAJOR REQUIREMENT...: unpack the wheels into OUT/cuMAJOR once.
fetch() {
    local major=$1 dest=$OUT/cu$1 tmp
    shift
    [ -f "$dest/.complete" ] && return
    tmp=$(mktemp -d)
    "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "$@"
    rm -rf "$dest" && mkdir -p "$dest"
    for w in "$tmp"/*.whl; do "$PY" -m zipfile -e "$w" "$dest/wheels"; done
    rm -rf "$tmp"
    mkdir -p "$dest/include" "$dest/lib"
    # cu12 wheels keep nvidia/<component>/{include,lib}; cu13 ones nvidia/cu13/{include,lib}
    cp -r "$dest"/wheels/nvidia/*/include/. "$dest/include/"
    cp -r "$dest"/wheels/nvidia/*/lib/. "$dest/lib/"
    rm -rf "$dest/wheels"
    touch "$dest/.complete"
}

if ((${#INCLUDES[@]})); then
    [ -n "$MAJOR" ] || { echo "build.sh: --include needs --major" >&2; exit 2; }
    build "$MAJOR" "$LIBDIR" "${INCLUDES[@]}"
    exit 0
fi
# cuda.h's crt/host_defines.h: from nvidia-cuda-crt (13) for both, macros only.
fetch 12 'nvidia-cuda-cupti-cu12>=12,<13' 'nvidia-cuda-runtime-cu12>=12,<13' 'nvidia-cuda-crt>=13,<14'
fetch 13 'nvidia-cuda-cupti>=13,<14' 'nvidia-cuda-runtime>=13,<14' 'nvidia-cuda-crt>=13,<14'
build 12 "$OUT/cu12/lib" "$OUT/cu12/include"
build 13 "$OUT/cu13/lib" "$OUT/cu13/include"
