#!/usr/bin/env bash
# Build a free-threaded CPython ("python3.13t", configure --disable-gil) from
# Debian 13's python3.13 source package, for the kernel tests that walk its
# frames (tests/kernel/test_python_frames.py). Debian ships no free-threaded
# interpreter package; its source is the one route a fresh machine with
# Debian's mirror can repeat.
#
#   sudo tools/python_freethreaded.sh     # prints the interpreter's path
#
# The interpreter alone is built (`make python`: builtin modules only, no
# shared extension modules), out of tree, in $GFXBPF_PYFT_CACHE (default
# /var/cache/gfxbpf/python3.13t): Python-X.Y.Z/ (the source, whose Lib/ the
# build finds by a relative path) and build/python. A second run reuses it.
# The source comes with apt-get source --download-only from
# $GFXBPF_DEBIAN_MIRROR (default http://deb.debian.org/debian) through a
# private apt state, so the host's own sources.list is not touched. Needs
# gcc and make (tools/setup.sh installs them); a build takes a few minutes.
set -euo pipefail

MIRROR=${GFXBPF_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${GFXBPF_PYFT_CACHE:-/var/cache/gfxbpf/python3.13t}
SUITE=trixie
PACKAGE=python3.13

die() { echo "python_freethreaded: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (apt-get source, the cache in /var/cache)"
if [ -x "$CACHE/build/python" ]; then
    echo "$CACHE/build/python"
    exit 0
fi
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
[ -x "$CACHE/build/python" ] && { echo "$CACHE/build/python"; exit 0; }

APT=$(mktemp -d /var/tmp/gfxbpf-pyft-apt.XXXXXX)
trap 'rm -rf --one-file-system "$APT"' EXIT
mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial"
echo "deb-src $MIRROR $SUITE main" >"$APT/sources.list"
OPTS=(-o "Dir::Etc::SourceList=$APT/sources.list" -o Dir::Etc::SourceParts=/dev/null
      -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache=$APT/cache"
      -o Dir::State::Status=/dev/null -o APT::Sandbox::User=root)
apt-get "${OPTS[@]}" -q update >&2 || die "apt-get update of $SUITE's sources failed"
(cd "$APT" && apt-get "${OPTS[@]}" -q source --download-only "$PACKAGE" >&2) ||
    die "apt-get source $PACKAGE failed"
ORIG=$(ls "$APT"/${PACKAGE}_*.orig.tar.xz 2>/dev/null | head -1)
[ -n "$ORIG" ] || die "no orig tarball of $PACKAGE came"
rm -rf --one-file-system "$CACHE"/Python-* "$CACHE/build"
tar -C "$CACHE" -xf "$ORIG"
SRC=$(cd "$CACHE" && ls -d Python-* | head -1)
mkdir "$CACHE/build"
cd "$CACHE/build"
LOG=$CACHE/build.log
echo "python_freethreaded: building $SRC --disable-gil in $CACHE (a few minutes)" >&2
{ "../$SRC/configure" --disable-gil && make -j"$(nproc)" python; } >"$LOG" 2>&1 ||
    { tail -20 "$LOG" >&2; die "build failed (log: $LOG)"; }
# Sanity: the interpreter runs its own stdlib, and it is free-threaded.
./python -c 'import sys; assert not sys._is_gil_enabled()' ||
    die "the built python is not a free-threaded build"
find "$CACHE" -name '*.o' -delete
chmod -R a+rX "$CACHE"
echo "$CACHE/build/python"
