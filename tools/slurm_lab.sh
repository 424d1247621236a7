#!/usr/bin/env bash
# A one-machine Slurm cluster for the job tests and the demo (run as root):
#   tools/slurm_lab.sh start    munge, slurmctld and slurmd on this machine
#   tools/slurm_lab.sh stop     the daemons stopped, the lab's files removed
#   tools/slurm_lab.sh status   the daemons' pids and `sinfo`
# Debian's slurm-wlm and munge (installed here when missing), run directly:
# no systemd needed. Jobs are contained by cgroup v2 (proctrack/cgroup,
# task/cgroup, CgroupPlugin=cgroup/v2 with IgnoreSystemd): each job's
# processes live in <cgroup2>/system.slice/slurmstepd.scope/job_ID.
# Where /sys/fs/cgroup is a hybrid (cgroup v1 controllers beside a v2
# hierarchy at /sys/fs/cgroup/unified, which Slurm refuses), slurmd runs in a
# mount namespace of its own that sees that same v2 hierarchy at
# /sys/fs/cgroup: the job cgroups are the ones BPF sees either way.
# Idempotent: `start` on a running lab only checks it; `stop` twice is fine.
set -euo pipefail
cd "$(dirname "$0")/.."

LAB=${GFXBPF_SLURM_LAB:-/run/gfxbpf-slurm-lab}
CONF=/etc/slurm
NODE=$(hostname -s)
CPUS=$(nproc)

die() { echo "slurm_lab: $*" >&2; exit 1; }
pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

install_packages() {
    local missing=()
    for p in slurm-wlm slurm-client munge; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
    done
    if ((${#missing[@]})); then
        echo "slurm_lab: installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        . tools/apt_wait.sh
        apt_get_waiting update -q
        apt_get_waiting install -y -q --no-install-recommends "${missing[@]}"
    fi
}

write_config() {
    mkdir -p "$CONF" "$LAB/ctld" "$LAB/slurmd" "$LAB/log"
    # The lab owns these two files while it runs; a site's own are kept aside.
    for f in slurm.conf cgroup.conf; do
        if [ -e "$CONF/$f" ] && ! grep -q "gfxbpf slurm lab" "$CONF/$f"; then
            mv "$CONF/$f" "$LAB/$f.site"
        fi
    done
    cat >"$CONF/slurm.conf" <<EOF
# gfxbpf slurm lab (tools/slurm_lab.sh): removed by \`tools/slurm_lab.sh stop\`
ClusterName=gfxlab
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$LAB/ctld
SlurmdSpoolDir=$LAB/slurmd
SlurmctldPidFile=$LAB/slurmctld.pid
SlurmdPidFile=$LAB/slurmd.pid
SlurmctldLogFile=$LAB/log/slurmctld.log
SlurmdLogFile=$LAB/log/slurmd.log
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
ReturnToService=2
MpiDefault=none
KillWait=2
InactiveLimit=0
MinJobAge=30
NodeName=$NODE CPUs=$CPUS State=UNKNOWN
PartitionName=lab Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
EOF
    cat >"$CONF/cgroup.conf" <<EOF
# gfxbpf slurm lab (tools/slurm_lab.sh): removed by \`tools/slurm_lab.sh stop\`
CgroupPlugin=cgroup/v2
IgnoreSystemd=yes
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
EOF
}

start_munge() {
    if pid_alive "$LAB/munged.pid"; then return; fi
    # A munged the host runs already (Debian's package starts one under
    # systemd): the lab uses it and leaves it running at stop.
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
    if [ ! -s /etc/munge/munge.key ]; then
        mkdir -p /etc/munge
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
        touch "$LAB/munge.key.ours"
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
    runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
    cp /run/munge/munged.pid "$LAB/munged.pid"
}

# The cgroup v2 mount slurmd must see at /sys/fs/cgroup.
hybrid() { [ "$(stat -f -c %T /sys/fs/cgroup)" != cgroup2fs ]; }

start_slurmd() {
    if pid_alive "$LAB/slurmd.pid"; then return; fi
    if hybrid; then
        [ "$(stat -f -c %T /sys/fs/cgroup/unified 2>/dev/null)" = cgroup2fs ] ||
            die "no cgroup v2 hierarchy at /sys/fs/cgroup nor /sys/fs/cgroup/unified"
        # Slurm reads /proc/self/cgroup and refuses a hybrid: the shim shows it
        # the v2 line alone (tools/slurm_lab/v2only.c).
        gcc -shared -fPIC -O2 -Wall -o "$LAB/v2only.so" tools/slurm_lab/v2only.c -ldl
        mkdir -p /sys/fs/cgroup/unified/system.slice   # no systemd made it
        LD_PRELOAD="$LAB/v2only.so" unshare --mount --propagation private sh -c \
            'umount -l /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup && exec slurmd'
    else
        mkdir -p /sys/fs/cgroup/system.slice
        slurmd
    fi
}

wait_idle() {
    local i
    for i in $(seq 1 60); do
        if sinfo -h -N -o '%T' 2>/dev/null | grep -q -E '^(idle|mixed|allocated)'; then
            return 0
        fi
        sleep 0.5
    done
    echo "slurm_lab: the node did not come up; logs in $LAB/log:" >&2
    tail -n 20 "$LAB"/log/*.log >&2 || true
    return 1
}

start() {
    [ "$(id -u)" = 0 ] || die "run as root"
    install_packages
    mkdir -p "$LAB"
    write_config
    start_munge
    pid_alive "$LAB/slurmctld.pid" || slurmctld -c -i
    start_slurmd
    wait_idle
    scontrol update nodename="$NODE" state=resume 2>/dev/null || true
    echo "slurm_lab: up: node $NODE, partition lab ($CPUS CPUs); \`tools/slurm_lab.sh stop\` ends it"
}

stop_pidfile() {
    local f=$1 i
    pid_alive "$f" || return 0
    kill "$(cat "$f")"
    for i in $(seq 1 40); do pid_alive "$f" || return 0; sleep 0.25; done
    kill -9 "$(cat "$f")" 2>/dev/null || true
}

stop() {
    [ "$(id -u)" = 0 ] || die "run as root"
    if [ -d "$LAB" ]; then
        scancel --full --quiet --state=RUNNING --partition=lab 2>/dev/null || true
        stop_pidfile "$LAB/slurmd.pid"
        stop_pidfile "$LAB/slurmctld.pid"
        stop_pidfile "$LAB/munged.pid"
        if [ -e "$LAB/munge.key.ours" ]; then rm -f /etc/munge/munge.key; fi
        for f in slurm.conf cgroup.conf; do
            if grep -q "gfxbpf slurm lab" "$CONF/$f" 2>/dev/null; then rm -f "$CONF/$f"; fi
            if [ -e "$LAB/$f.site" ]; then mv "$LAB/$f.site" "$CONF/$f"; fi
        done
        rm -rf "$LAB"
        # slurmstepd's empty cgroups (the scope slurmd made, its slurmd and
        # system children): rmdir, deepest first; a cgroup with tasks stays.
        for root in /sys/fs/cgroup /sys/fs/cgroup/unified; do
            scope="$root/system.slice/${NODE}_slurmstepd.scope"
            [ -d "$scope" ] && find "$scope" -depth -type d -exec rmdir {} \; 2>/dev/null
        done
    fi
    echo "slurm_lab: stopped"
}

status() {
    for d in munged slurmctld slurmd; do
        if pid_alive "$LAB/$d.pid"; then echo "$d: pid $(cat "$LAB/$d.pid")"; else echo "$d: not running"; fi
    done
    sinfo 2>/dev/null || true
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) status ;;
*) echo "usage: tools/slurm_lab.sh start|stop|status" >&2; exit 2 ;;
esac
