#!/usr/bin/env bash
# Run the README's two commands (tools/demo.sh, then tools/test.sh) in a fresh
# Debian 13 (trixie) userland on this host, as root: the tests of a release
# the project supports other than the one the machine runs.
#
#   sudo tools/debian13.sh [PYTEST ARGS...]   demo, then the whole suite (args go to tools/test.sh)
#   sudo tools/debian13.sh --build-bpf        record what Debian 13's clang makes of the
#                                             BPF sources in catalog/toolchains.toml (after
#                                             rebuilding the objects here, see build_bpf.py)
#   sudo tools/debian13.sh --shell            an interactive shell in the userland
#
# The userland comes from the Debian package registry (debootstrap, minbase, by
# tools/debian13_rootfs.sh, which the kernel tests' own Debian 13 userland
# uses too); the tarball of its packages is cached in $GFXBPF_DEBIAN13_CACHE (default
# /var/cache/gfxbpf; GFXBPF_DEBIAN13_CACHE= disables the cache), and so are
# the .debs tools/setup.sh installs in it. The checkout (tracked and untracked,
# not ignored, files) is copied to /gfxbpf inside. Everything runs in a mount
# namespace of its own, so the userland's mounts vanish with it; the userland
# is deleted afterwards (GFXBPF_DEBIAN13_KEEP=1 keeps it, for a look). The
# cache is mounted at /var/cache/gfxbpf inside, for the tests' own userland.
#
# What the userland shares with the host: the kernel, and so tracefs, which has
# one superblock: remounting it inside with gid=<service group> changes the
# host's tracefs too. The service user gfxbpf therefore gets the host's uid and
# gid inside, and the host's tracefs options are restored afterwards all the same.
set -euo pipefail
{ # One compound command: bash reads all of it before running it, so editing
  # this file while it runs (it takes minutes) cannot change what runs.
cd "$(dirname "$0")/.."
SRC=$PWD

SUITE=trixie
MIRROR=${GFXBPF_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${GFXBPF_DEBIAN13_CACHE-/var/cache/gfxbpf}
TRACEFS=/sys/kernel/tracing
SERVICE_USER=gfxbpf
MODE=suite
case "${1:-}" in
--build-bpf) MODE=build-bpf; shift ;;
--shell) MODE=shell; shift ;;
-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac

say() { printf '\n\033[1m== debian13: %s\033[0m\n' "$*"; }
die() { echo "debian13: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (debootstrap, chroot and mounts need it)"
[ "$(uname -m)" = x86_64 ] || die "only x86_64 hosts are supported (the BPF build targets x86)"

# The group and mode of tracefs: what the userland's remounts can change.
tracefs_opts() { findmnt -n -o OPTIONS "$TRACEFS" 2>/dev/null | grep -oE '(gid|mode)=[0-9]+' | paste -sd, || true; }
HOST_TRACEFS=$(tracefs_opts)

# The service user: the same ids as on the host (created there if missing, as
# tools/demo.sh would), so a tracefs gid set inside names the same group outside.
getent group "$SERVICE_USER" >/dev/null || groupadd --system "$SERVICE_USER"
id "$SERVICE_USER" >/dev/null 2>&1 ||
    useradd --system --gid "$SERVICE_USER" --no-create-home --shell /usr/sbin/nologin "$SERVICE_USER"
SERVICE_UID=$(id -u "$SERVICE_USER")
SERVICE_GID=$(getent group "$SERVICE_USER" | cut -d: -f3)

WORK=$(mktemp -d /var/tmp/gfxbpf-debian13.XXXXXX)
ROOTFS=$WORK/root
cleanup() {
    local rc=$?
    # Processes left inside the userland (a broker a failed test left behind).
    local pid
    for pid in $(ls /proc | grep -E '^[0-9]+$'); do
        [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$ROOTFS" ] && kill -KILL "$pid" 2>/dev/null || true
    done
    restore_tracefs
    if [ "${GFXBPF_DEBIAN13_KEEP:-0}" = 1 ]; then
        echo "debian13: userland kept in $ROOTFS (chroot it; remove with rm -rf --one-file-system $WORK)"
    elif findmnt -rn -o TARGET | grep -q "^$WORK"; then
        echo "debian13: something is still mounted under $WORK: not deleting it" >&2
        rc=1
    else
        rm -rf --one-file-system "$WORK"
    fi
    exit "$rc"
}
restore_tracefs() {
    # tracefs remounted inside (demo.sh, the tests) is the host's: put back
    # the host's gid and mode whatever happened in there.
    [ -n "$HOST_TRACEFS" ] || return 0
    [ "$(tracefs_opts)" = "$HOST_TRACEFS" ] && return 0
    mount -o "remount,$HOST_TRACEFS" "$TRACEFS" ||
        echo "debian13: could not restore the host's tracefs options ($HOST_TRACEFS)" >&2
    echo "debian13: host tracefs options restored: $(tracefs_opts)"
}
trap cleanup EXIT

say "debootstrap $SUITE (minbase) into $ROOTFS"
t0=$SECONDS
GFXBPF_DEBIAN13_CACHE=$CACHE GFXBPF_DEBIAN_MIRROR=$MIRROR tools/debian13_rootfs.sh "$ROOTFS" >/dev/null ||
    die "could not make the userland"
echo "debian13: $(cat "$ROOTFS/etc/debian_version") in $((SECONDS - t0)) s"

# The host's name service answers, the service user's ids match the host's.
cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
chroot "$ROOTFS" groupadd --system --gid "$SERVICE_GID" "$SERVICE_USER"
chroot "$ROOTFS" useradd --system --uid "$SERVICE_UID" --gid "$SERVICE_USER" \
    --no-create-home --shell /usr/sbin/nologin "$SERVICE_USER"

# PyPI the way the host reaches it: its pip configuration and the
# certificates it trusts (a proxy's CA, say), and the variables that name them.
for f in /etc/pip.conf /etc/xdg/pip; do
    [ -e "$f" ] && mkdir -p "$ROOTFS$(dirname "$f")" && cp -a "$f" "$ROOTFS$f"
done
if [ -s /etc/ssl/certs/ca-certificates.crt ]; then
    cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/usr/local/share/ca-certificates/host-trust.crt"
    chroot "$ROOTFS" update-ca-certificates >/dev/null
fi
PASS_ENV=()
while IFS= read -r name; do
    PASS_ENV+=("$name=${!name}")
done < <(compgen -e | grep -E '^(GFXBPF_DEBIAN_MIRROR|PIP_[A-Z_]+|SSL_CERT_(FILE|DIR)|REQUESTS_CA_BUNDLE|(https?|no)_proxy|(HTTPS?|NO)_PROXY)$' || true)

if [ "$MODE" = build-bpf ]; then
    say "building the committed objects here (python3 tools/build_bpf.py)"
    python3 tools/build_bpf.py >/dev/null
fi

say "copying the checkout to /gfxbpf"
mkdir -p "$ROOTFS/gfxbpf"
if git -C "$SRC" rev-parse --git-dir >/dev/null 2>&1; then
    git -C "$SRC" ls-files -z --cached --others --exclude-standard |
        (cd "$SRC" && tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -C "$ROOTFS/gfxbpf" -xf -
else
    tar -C "$SRC" --exclude=./.git -cf - . | tar -C "$ROOTFS/gfxbpf" -xf -
fi

case $MODE in
# No torch there (tools/test_deps.sh says why): its one test is left out.
# Nor the Slurm job tests: the userland shares the host's network and cgroup
# tree, so a second one-machine cluster (tools/slurm_lab.sh) there would take
# the ports and the system.slice/<node>_slurmstepd.scope of the Debian 12
# leg's, and Debian 13's Slurm 24.11 has not been run here; the Debian 12 leg runs them.
# Nor test_stock_kernels.py: it boots Debian 12's and 13's kernels under qemu
# whatever the userland, from Debian 12's archive, so the Debian 12 leg runs it.
suite) INNER='tools/demo.sh && CI=${CI:-} GFXBPF_NO_TORCH=1 GFXBPF_NO_SLURM=1 tools/test.sh \
    --deselect tests/kernel/test_torch_profile.py \
    --deselect tests/kernel/test_stock_kernels.py \
    --deselect tests/kernel/test_slurm_job.py --deselect tests/kernel/test_slurm_nodes.py "$@"' ;;
build-bpf)
    # Only the compiler and headers: no need for the suite's packages.
    INNER='export DEBIAN_FRONTEND=noninteractive; apt-get update -q &&
        apt-get install -y -q --no-install-recommends clang llvm libbpf-dev linux-libc-dev >/dev/null &&
        python3 tools/build_bpf.py --record-toolchain' ;;
shell) INNER='exec bash -i' ;;
esac

# The inner part runs in a mount namespace of its own: every mount below
# vanishes with it. Propagation from the host stays one-way (slave), so
# nothing unmounted inside is unmounted on the host.
say "running in the userland: ${MODE}"
t1=$SECONDS
set +e
unshare --mount --propagation slave -- bash -euo pipefail -c '
    R=$1 CACHE=$2 n=$3; shift 3
    PASS_ENV=("${@:1:n}"); shift "$n"
    # The userland'"'"'s root a mount of its own: pivot_root works inside (the
    # tests'"'"' containers, tests/kernel/chroots.py), as on a host.
    mount --bind "$R" "$R"
    mount -t proc proc "$R/proc"
    mount --rbind /sys "$R/sys" && mount --make-rslave "$R/sys"
    mount --rbind /dev "$R/dev" && mount --make-rslave "$R/dev"
    mount -t tmpfs -o mode=0755 tmpfs "$R/run"
    mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"
    if [ -n "$CACHE" ]; then   # the .debs setup.sh installs, kept for the next run
        mkdir -p "$CACHE/debian13-debs" "$R/var/cache/gfxbpf"
        mount --bind "$CACHE/debian13-debs" "$R/var/cache/apt/archives"
        # The tests'"'"' own Debian 13 userland (tests/kernel/chroots.py) unpacks the same tarball.
        mount --bind "$CACHE" "$R/var/cache/gfxbpf"
    fi
    exec chroot "$R" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        HOME=/root TERM="${TERM:-dumb}" LANG=C.UTF-8 CI="${CI:-}" "${PASS_ENV[@]}" \
        bash -c "cd /gfxbpf && $0" bash "$@"
' "$INNER" "$ROOTFS" "$CACHE" "${#PASS_ENV[@]}" "${PASS_ENV[@]}" "$@"
rc=$?
set -e
if [ "$MODE" = build-bpf ] && [ "$rc" = 0 ]; then
    cp "$ROOTFS/gfxbpf/catalog/toolchains.toml" "$SRC/catalog/toolchains.toml"
    echo "debian13: catalog/toolchains.toml updated with Debian 13's hashes"
fi
echo "debian13: $MODE finished with exit code $rc in $((SECONDS - t1)) s ($((SECONDS - t0)) s in all)"
exit "$rc"
}
