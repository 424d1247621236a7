#!/usr/bin/env bash
# The broker without systemd (containers, CI, lab images whose PID 1 is not
# systemd): started in the background from deploy/gfxbpf.service's own
# ExecStart line, as its User with only its two capabilities (tools/unit_exec.py
# turns the unit into a setpriv command line). Run as root.
#
#   tools/broker.sh start [--policy FILE]   default: the unit's /etc/gfxbpf/policy.toml
#   tools/broker.sh stop
#   tools/broker.sh status
#   tools/broker.sh reload                  re-read the policy (SIGHUP)
#
# Where systemd runs, use the units instead (deploy/README.md): they add the
# sandbox that setpriv cannot. This script says so, and refuses to start a
# second broker beside gfxbpf.socket.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${GFXBPF_VENV:-/opt/gfxbpf/venv}
UNIT=deploy/gfxbpf.service
RUN=/run/gfxbpf
# Root's files, outside /run/gfxbpf (which the service user owns): a pid file
# the service user could rewrite would let it choose what root signals.
PIDFILE=/run/gfxbpf-broker.pid
LOG=/var/log/gfxbpf-broker.log

die() { echo "broker.sh: $*" >&2; exit 1; }
usage() { sed -n '7,11p' "$0" | sed 's/^# \{0,1\}//'; }

case "${1:-}" in -h | --help | "") usage; [ -n "${1:-}" ]; exit ;; esac
[ "$(id -u)" = 0 ] || die "run as root (sudo tools/broker.sh … where sudo exists): it starts the broker as user gfxbpf"

running_pid() {
    # The pid in the file, if that process is our broker (not a recycled pid).
    local pid
    pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "gfxbpf-broker" || return 1
    echo "$pid"
}

systemd_note() {
    [ -d /run/systemd/system ] || return 0
    if systemctl cat gfxbpf.socket >/dev/null 2>&1; then
        die "systemd runs here and gfxbpf.socket is installed: use systemctl start gfxbpf.socket (and systemctl stop gfxbpf.socket gfxbpf), not this script"
    fi
    echo "broker.sh: note: systemd runs here; the supported way is its units (deploy/README.md:" \
        "systemctl start gfxbpf.socket), which add a sandbox. Starting without them."
}

start() {
    local policy=""
    while [ $# -gt 0 ]; do
        case "$1" in
            --policy) policy=${2:?--policy needs a file}; shift 2 ;;
            --policy=*) policy=${1#--policy=}; shift ;;
            *) die "unknown argument $1 (usage: tools/broker.sh start [--policy FILE])" ;;
        esac
    done
    if pid=$(running_pid); then
        echo "broker.sh: the broker is already running (pid $pid); tools/broker.sh stop stops it"
        return 0
    fi
    systemd_note
    [ -x "$VENV/bin/gfxbpf-broker" ] || die "$VENV/bin/gfxbpf-broker is missing: run tools/setup.sh (or tools/demo.sh) first"
    id gfxbpf >/dev/null 2>&1 || die "no user gfxbpf: create it (systemd-sysusers deploy/sysusers.d/gfxbpf.conf, or tools/demo.sh does it)"
    local overrides=("program=$VENV/bin/gfxbpf-broker")
    [ -n "$policy" ] && overrides+=("--policy=$policy")
    local argv
    mapfile -t argv < <("$VENV/bin/python" tools/unit_exec.py "$UNIT" --print-argv "${overrides[@]}")
    [ ${#argv[@]} -gt 0 ] || die "cannot read $UNIT"
    # What tmpfiles.d and RuntimeDirectory= would create.
    install -d -m 0755 -o gfxbpf -g gfxbpf "$RUN"
    install -m 0640 -o root -g gfxbpf /dev/null "$LOG.new" && mv -f "$LOG.new" "$LOG"
    # Its own session: it outlives this shell and the terminal.
    setsid "${argv[@]}" </dev/null >>"$LOG" 2>&1 &
    local pid=$!
    echo "$pid" >"$PIDFILE"
    for _ in $(seq 150); do
        [ -S "$RUN/control.sock" ] && grep -q '"op":"listen"' "$LOG" 2>/dev/null && break
        if ! kill -0 "$pid" 2>/dev/null; then
            rm -f "$PIDFILE"
            tail -n 20 "$LOG" >&2
            die "the broker exited at start (above: its last lines; the whole log: $LOG)"
        fi
        sleep 0.1
    done
    [ -S "$RUN/control.sock" ] || die "the broker (pid $pid) did not open $RUN/control.sock in 15 s: see $LOG"
    echo "broker.sh: broker running, pid $pid, as user gfxbpf with CAP_BPF and CAP_PERFMON only"
    echo "broker.sh: socket $RUN/control.sock; audit log $LOG; stop: tools/broker.sh stop"
}

stop() {
    local pid
    if ! pid=$(running_pid); then
        rm -f "$PIDFILE"
        echo "broker.sh: no broker started by this script is running"
        return 0
    fi
    kill -TERM "$pid"
    for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && die "the broker (pid $pid) did not stop in 10 s"
    rm -f "$PIDFILE" "$RUN/control.sock" "$RUN/grpc.sock"
    echo "broker.sh: broker stopped (pid $pid)"
}

status() {
    local pid
    if pid=$(running_pid); then
        echo "broker.sh: running, pid $pid (log: $LOG)"
        grep -E '^(Uid|Cap(Eff|Prm|Bnd)|NoNewPrivs)' "/proc/$pid/status"
    else
        echo "broker.sh: not running (tools/broker.sh start starts it)"
        return 3
    fi
}

case "${1:-}" in
    start) shift; start "$@" ;;
    stop) stop ;;
    status) status ;;
    reload)
        pid=$(running_pid) || die "not running"
        kill -HUP "$pid" && echo "broker.sh: asked the broker to re-read its policy (see $LOG)"
        ;;
    *) usage >&2; exit 2 ;;
esac
