#!/usr/bin/env bash
# The main job on a fresh machine, as root: set everything up, start the broker
# as the unprivileged service user with only CAP_BPF+CAP_PERFMON, let a demo
# user (no capabilities) watch a real kernel program for a few seconds while
# some activity runs, then stop the broker cleanly.
#
#   sudo tools/demo.sh [SECONDS]      (default 6)
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_TO_WATCH=${1:-6}
VENV=${GFXBPF_VENV:-/opt/gfxbpf/venv}
SERVICE_USER=gfxbpf
DEMO_USER=gfxdemo
RUN=/run/gfxbpf
POLICY=/etc/gfxbpf/demo-policy.toml

if [ "$(id -u)" != 0 ]; then
    echo "demo: run as root (it installs packages, creates users and starts the broker)" >&2
    exit 1
fi

tools/setup.sh

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "users: $SERVICE_USER (broker), $DEMO_USER (an ordinary user)"
getent group "$SERVICE_USER" >/dev/null || groupadd --system "$SERVICE_USER"
id "$SERVICE_USER" >/dev/null 2>&1 ||
    useradd --system --gid "$SERVICE_USER" --no-create-home --shell /usr/sbin/nologin "$SERVICE_USER"
id "$DEMO_USER" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$DEMO_USER"

say "tracefs readable by group $SERVICE_USER only (deploy/README.md explains why)"
# A number, not the name: util-linux 2.41 (Debian 13) passes a remount's
# gid= to the kernel as written, and tracefs takes numbers only.
SERVICE_GID=$(getent group "$SERVICE_USER" | cut -d: -f3)
if mountpoint -q /sys/kernel/tracing; then
    mount -o remount,gid="$SERVICE_GID",mode=0750 /sys/kernel/tracing
else
    mount -t tracefs -o nosuid,nodev,noexec,gid="$SERVICE_GID",mode=0750 nodev /sys/kernel/tracing
fi

say "policy: $DEMO_USER may watch syscount, execsnoop, clonecount (own events) and vmabind"
install -d -m 0750 -g "$SERVICE_USER" /etc/gfxbpf
"$VENV/bin/gfxbpf-admin" approve syscount --users "$DEMO_USER" --scope self >"$POLICY.new"
"$VENV/bin/gfxbpf-admin" approve execsnoop --users "$DEMO_USER" --scope self >>"$POLICY.new"
"$VENV/bin/gfxbpf-admin" approve clonecount --users "$DEMO_USER" --scope self >>"$POLICY.new"
"$VENV/bin/gfxbpf-admin" approve vmabind --users "$DEMO_USER" --scope system >>"$POLICY.new"
install -m 0640 -g "$SERVICE_USER" "$POLICY.new" "$POLICY" && rm -f "$POLICY.new"
"$VENV/bin/gfxbpf-broker" --policy "$POLICY" --check-policy

say "broker: the unit's ExecStart, as $SERVICE_USER with only CAP_BPF and CAP_PERFMON"
install -d -m 0755 -o "$SERVICE_USER" -g "$SERVICE_USER" "$RUN"
mapfile -t BROKER < <("$VENV/bin/python" tools/unit_exec.py deploy/gfxbpf.service \
    --print-argv "--policy=$POLICY" "program=$VENV/bin/gfxbpf-broker")
LOG=$(mktemp /tmp/gfxbpf-demo-audit.XXXXXX)
"${BROKER[@]}" 2>"$LOG" &
BROKER_PID=$!
stop_broker() {
    if kill -0 "$BROKER_PID" 2>/dev/null; then
        kill -TERM "$BROKER_PID"
        wait "$BROKER_PID" || true
    fi
}
trap stop_broker EXIT
for _ in $(seq 100); do
    [ -S "$RUN/control.sock" ] && break
    kill -0 "$BROKER_PID" 2>/dev/null || { cat "$LOG" >&2; exit 1; }
    sleep 0.1
done
grep -E '^Cap(Eff|Prm|Bnd)|^NoNewPrivs' "/proc/$BROKER_PID/status"

as_demo() { setpriv --reuid="$DEMO_USER" --regid="$DEMO_USER" --init-groups -- "$@"; }

say "$DEMO_USER: gfxclient list"
as_demo "$VENV/bin/gfxclient" list

say "$DEMO_USER: gfxclient watch syscount for ${SECONDS_TO_WATCH}s while $DEMO_USER copies files"
as_demo bash -c 'end=$((SECONDS + '"$SECONDS_TO_WATCH"')); while [ $SECONDS -lt $end ]; do
    dd if=/dev/zero of=/dev/null bs=512 count=2000 status=none; ls / >/dev/null; done' &
WORK=$!
as_demo "$VENV/bin/gfxclient" watch syscount --interval 1 --duration "$SECONDS_TO_WATCH" --top 12
wait "$WORK" || true

say "$DEMO_USER: gfxclient watch vmabind (no i915 here: a clear message, not a traceback)"
as_demo "$VENV/bin/gfxclient" watch vmabind --once || echo "(exit code $?)"

say "stopping the broker"
stop_broker
trap - EXIT
echo "audit log (one JSON line per request):"
tail -n 5 "$LOG"
rm -f "$LOG"
