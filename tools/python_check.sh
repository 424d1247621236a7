#!/usr/bin/env bash
# Check Python frames on another distribution's CPython, by hand: make a
# minbase userland of a Debian suite with its python3 (debootstrap), run an
# outer -> middle -> inner loop in it as the demo user, profile that process
# with `gfxclient profile --pid` as the same user, and print the share of
# samples holding the whole Python chain. Used for Debian unstable's 3.14,
# which moves daily (docs/PYTHON.md records the results); CI tests Debian 13's
# 3.13 in tests/kernel/test_python_frames.py.
#
#   sudo tools/python_check.sh SUITE [DIR]    e.g. sid (3.14), trixie (3.13)
#
# Needs the demo broker up (sudo tools/demo.sh --keep-broker). DIR defaults to
# /var/tmp/gfxbpf-python-SUITE and is kept for the next run.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
SUITE=${1:?usage: $0 SUITE [DIR]}
ROOT=${2:-/var/tmp/gfxbpf-python-$SUITE}
MIRROR=${GFXBPF_DEBIAN_MIRROR:-http://deb.debian.org/debian}
VENV=${GFXBPF_VENV:-/opt/gfxbpf/venv}
USER_=gfxdemo
SECONDS_=${GFXBPF_CHECK_SECONDS:-5}

die() { echo "python_check: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (debootstrap and chroot need it)"
id "$USER_" >/dev/null 2>&1 || die "no user $USER_: run sudo tools/demo.sh --keep-broker first"
tools/broker.sh status >/dev/null || die "no broker running: run sudo tools/demo.sh --keep-broker first"

if [ ! -x "$ROOT/usr/bin/python3" ]; then
    echo "python_check: debootstrap $SUITE into $ROOT (a minute or two)" >&2
    debootstrap --variant=minbase --include=python3 "$SUITE" "$ROOT" "$MIRROR" >/dev/null
fi
chmod 755 "$ROOT"
VERSION=$(chroot "$ROOT" /usr/bin/python3 -c 'import sys; print(sys.version.split()[0])')
# The bench's outer -> middle -> inner script (bench/python_profile.py), run "forever".
PYTHONPATH=$REPO "$VENV/bin/python" -c 'from bench.python_profile import SCRIPT; print(SCRIPT)' \
    >"$ROOT/tmp/gfxbpf_loop.py"
chmod 644 "$ROOT/tmp/gfxbpf_loop.py"
# Numeric ids: the chroot has its own /etc/passwd, without the demo user.
chroot --userspec="$(id -u "$USER_"):$(id -g "$USER_")" "$ROOT" /usr/bin/python3 /tmp/gfxbpf_loop.py 1000000000 &
LOOP=$!
trap 'kill $LOOP 2>/dev/null || true' EXIT
sleep 1
OUT=$(mktemp -d /tmp/gfxbpf-python-check.XXXXXX)
chown "$USER_" "$OUT"
setpriv --reuid="$USER_" --regid="$USER_" --init-groups -- env HOME="$OUT" \
    "$VENV/bin/gfxclient" --json profile --pid "$LOOP" --duration "$SECONDS_" \
    --format folded -o "$OUT/profile.folded" >"$OUT/summary.json"
PYTHONPATH=$REPO "$VENV/bin/python" - "$OUT" "$SUITE" "$VERSION" <<'EOF'
import json, sys
from pathlib import Path
from bench.python_profile import chain_share, parse_folded
out, suite, version = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
stacks = parse_folded((out / "profile.folded").read_text().splitlines())
summary = json.loads((out / "summary.json").read_text())
samples = sum(c for _, c in stacks)
share = chain_share(stacks)
native = sum(c for f, c in stacks if any(x.startswith("Py_BytesMain") for x in f)) / max(samples, 1)
print(json.dumps({
    "suite": suite, "python": version, "samples": samples,
    "chain_share": round(share, 4), "py_bytesmain_share": round(native, 4),
    "python_summary": summary.get("python"),
}, indent=2))
sys.exit(0 if share >= 0.9 else 1)
EOF
