#!/usr/bin/env bash
# Make a Debian 13 (trixie) userland in DIR with debootstrap (minbase): the one
# step tools/debian13.sh (the suite in Debian 13) and the kernel tests'
# debian13_root fixture (tests/kernel/chroots.py) share, with one cache.
#
#   sudo tools/debian13_rootfs.sh DIR
#
# The packages come from $GFXBPF_DEBIAN_MIRROR (default
# http://deb.debian.org/debian); their tarball is cached in
# $GFXBPF_DEBIAN13_CACHE (default /var/cache/gfxbpf; empty: no cache), named
# after the package list, so a longer list never reuses a shorter one's
# tarball. debootstrap is installed first when missing (apt-get). Works the
# same inside the userland of tools/debian13.sh (a trixie root in trixie).
set -euo pipefail

# Another suite and package list for a test that needs them (Debian
# unstable's python3.15): GFXBPF_ROOTFS_SUITE, GFXBPF_ROOTFS_INCLUDE.
SUITE=${GFXBPF_ROOTFS_SUITE:-trixie}
INCLUDE=${GFXBPF_ROOTFS_INCLUDE:-python3,ca-certificates,xz-utils,gzip}
MIRROR=${GFXBPF_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${GFXBPF_DEBIAN13_CACHE-/var/cache/gfxbpf}

die() { echo "debian13_rootfs: $*" >&2; exit 1; }
[ $# = 1 ] || die "usage: $0 DIR"
ROOTFS=$1
[ "$(id -u)" = 0 ] || die "run as root (debootstrap needs it)"

if ! command -v debootstrap >/dev/null; then
    echo "debian13_rootfs: installing debootstrap" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends debootstrap >&2 ||
        { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends debootstrap >&2; }
fi
[ -e "/usr/share/debootstrap/scripts/$SUITE" ] ||
    die "this debootstrap does not know $SUITE: install a newer debootstrap (Debian 12: bookworm-backports)"

LOG=$(mktemp /var/tmp/gfxbpf-debootstrap.XXXXXX.log)
trap 'rm -f "$LOG"' EXIT
DEBOOTSTRAP=(debootstrap --variant=minbase "--include=$INCLUDE")
NAME=debian13
[ "$SUITE" = trixie ] || NAME=debian-$SUITE
TARBALL=${CACHE:+$CACHE/$NAME-minbase-${INCLUDE//,/+}.tgz}
if [ -n "$TARBALL" ]; then
    mkdir -p "$CACHE"
    # One maker at a time: test sessions and debian13.sh may start together.
    exec 9>"$CACHE/.debian13.lock"
    flock 9
    if [ ! -s "$TARBALL" ]; then
        MK=$(mktemp -d /var/tmp/gfxbpf-debootstrap-mk.XXXXXX)
        "${DEBOOTSTRAP[@]}" --make-tarball="$TARBALL.new" "$SUITE" "$MK" "$MIRROR" >"$LOG" 2>&1 ||
            { tail -20 "$LOG" >&2; rm -rf --one-file-system "$MK"; die "debootstrap --make-tarball failed"; }
        chmod 0644 "$TARBALL.new"
        mv "$TARBALL.new" "$TARBALL"
        rm -rf --one-file-system "$MK"
    fi
    flock -u 9
fi
"${DEBOOTSTRAP[@]}" ${TARBALL:+--unpack-tarball="$TARBALL"} "$SUITE" "$ROOTFS" "$MIRROR" >"$LOG" 2>&1 ||
    { tail -20 "$LOG" >&2; die "debootstrap failed"; }
echo "debian13_rootfs: Debian $SUITE ($(cat "$ROOTFS/etc/debian_version")) in $ROOTFS"
