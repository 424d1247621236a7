#!/usr/bin/env bash
# The main job on a fresh machine, as root: set everything up, start the broker
# as the unprivileged service user with only CAP_BPF+CAP_PERFMON, let a demo
# user (no capabilities) watch a real kernel program for a few seconds while
# some activity runs, then stop the broker cleanly, or leave it running.
#
#   tools/demo.sh [--keep-broker] [--user NAME]... [SECONDS]   (as root; default 6 s)
#
# --keep-broker  leave the broker running (tools/broker.sh stop stops it), for
#                the README's "Using gfxclient"
# --user NAME    grant NAME, an existing ordinary user, what gfxdemo may do
set -euo pipefail
cd "$(dirname "$0")/.."

KEEP=0
EXTRA_USERS=()
SECONDS_TO_WATCH=6
while [ $# -gt 0 ]; do
    case "$1" in
        --keep-broker) KEEP=1; shift ;;
        --user) EXTRA_USERS+=("${2:?--user needs a user name}"); shift 2 ;;
        -h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *[!0-9]* | "") echo "demo: unknown argument $1 (see tools/demo.sh --help)" >&2; exit 2 ;;
        *) SECONDS_TO_WATCH=$1; shift ;;
    esac
done
VENV=${GFXBPF_VENV:-/opt/gfxbpf/venv}
SERVICE_USER=gfxbpf
DEMO_USER=gfxdemo
RUN=/run/gfxbpf
POLICY=/etc/gfxbpf/demo-policy.toml

if [ "$(id -u)" != 0 ]; then
    echo "demo: run as root (it installs packages, creates users and starts the broker):" \
        "sudo tools/demo.sh, or tools/demo.sh in a root shell" >&2
    exit 1
fi
for u in "${EXTRA_USERS[@]}"; do
    id "$u" >/dev/null 2>&1 || { echo "demo: --user $u: no such user (create it first)" >&2; exit 2; }
done

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

# Debian's kernels default to 3, at which only CAP_SYS_ADMIN opens perf events:
# the broker's CAP_PERFMON could then attach no profile and no tracepoint.
PARANOID=$(cat /proc/sys/kernel/perf_event_paranoid)
if [ "$PARANOID" -gt 2 ]; then
    say "kernel.perf_event_paranoid $PARANOID -> 2 (upstream's default), until reboot; deploy/sysctl.d/60-gfxbpf.conf keeps it"
    echo 2 >/proc/sys/kernel/perf_event_paranoid
fi

USERS=$(IFS=,; echo "$DEMO_USER${EXTRA_USERS[*]:+,${EXTRA_USERS[*]}}")
say "policy: $USERS may watch syscount, execsnoop, clonecount (own events) and vmabind, and profile own processes (CPU, probes, waits)"
install -d -m 0750 -g "$SERVICE_USER" /etc/gfxbpf
"$VENV/bin/gfxbpf-admin" approve syscount --users "$USERS" --scope self >"$POLICY.new"
"$VENV/bin/gfxbpf-admin" approve execsnoop --users "$USERS" --scope self >>"$POLICY.new"
"$VENV/bin/gfxbpf-admin" approve clonecount --users "$USERS" --scope self >>"$POLICY.new"
"$VENV/bin/gfxbpf-admin" approve vmabind --users "$USERS" --scope system >>"$POLICY.new"
"$VENV/bin/gfxbpf-admin" approve profile --users "$USERS" --scope self >>"$POLICY.new"
# gfxclient profile's complete stacks: stack copies it unwinds with .eh_frame
"$VENV/bin/gfxbpf-admin" approve stackcopy --users "$USERS" --scope self >>"$POLICY.new"
# ... at probes (profile --stacks-at), and where threads wait (profile --off-cpu, --wall)
"$VENV/bin/gfxbpf-admin" approve ustackcopy --users "$USERS" --scope self >>"$POLICY.new"
"$VENV/bin/gfxbpf-admin" approve offcpu --users "$USERS" --scope self >>"$POLICY.new"
# ... which lock they wait on (profile --locks), and who woke them (--off-cpu --wakers)
"$VENV/bin/gfxbpf-admin" approve locks --users "$USERS" --scope self >>"$POLICY.new"
"$VENV/bin/gfxbpf-admin" approve offwake --users "$USERS" --scope self >>"$POLICY.new"
install -m 0640 -g "$SERVICE_USER" "$POLICY.new" "$POLICY" && rm -f "$POLICY.new"
"$VENV/bin/gfxbpf-broker" --policy "$POLICY" --check-policy

say "gfxclient on every user's PATH: /usr/local/bin/gfxclient -> $VENV/bin/gfxclient"
ln -sfn "$VENV/bin/gfxclient" /usr/local/bin/gfxclient

say "broker: the unit's ExecStart, as $SERVICE_USER with only CAP_BPF and CAP_PERFMON (tools/broker.sh)"
if tools/broker.sh status >/dev/null; then
    echo "demo: stopping the broker tools/broker.sh started earlier (the demo runs its own policy)"
    tools/broker.sh stop
fi
tools/broker.sh start --policy "$POLICY"
trap 'tools/broker.sh stop' EXIT
tools/broker.sh status

as_demo() { setpriv --reuid="$DEMO_USER" --regid="$DEMO_USER" --init-groups -- "$@"; }
test -S "$RUN/control.sock"

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

trap - EXIT
if [ "$KEEP" = 1 ]; then
    say "the broker stays up: try the README's \"Using gfxclient\" as $USERS (su - $DEMO_USER)"
    echo "stop it with: tools/broker.sh stop   (audit log: /var/log/gfxbpf-broker.log)"
    exit 0
fi
say "stopping the broker"
tools/broker.sh stop
echo "audit log (one JSON line per request):"
tail -n 5 /var/log/gfxbpf-broker.log
echo
echo "To keep a broker running for the README's \"Using gfxclient\":" \
    "tools/broker.sh start --policy $POLICY"
