#!/usr/bin/env bash
# A one-machine Slurm cluster for the job tests and the demo (run as root):
#   tools/slurm_lab.sh start    munge, slurmctld and slurmd on this machine
#   tools/slurm_lab.sh start --two-nodes
#                               and a second node, NODE2 (gfxlab-n2), whose slurmd
#                               runs in network, UTS and mount namespaces of its
#                               own (netns gfxlab-n2, 10.99.0.2 on a veth pair;
#                               this machine is 10.99.0.1): multi-node jobs
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
NODE2=gfxlab-n2
NETNS=gfxlab-n2
HOST_ADDR=10.99.0.1
NODE2_ADDR=10.99.0.2

die() { echo "slurm_lab: $*" >&2; exit 1; }
pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

install_packages() {
    local missing=()
    for p in slurm-wlm slurm-client munge iproute2; do
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
    local ctld=$NODE nodes="NodeName=$NODE CPUs=$CPUS State=UNKNOWN" names=$NODE
    if [ -e "$LAB/two-nodes" ]; then
        ctld="$NODE($HOST_ADDR)" names="$NODE,$NODE2"
        nodes="NodeName=$NODE NodeAddr=$HOST_ADDR CPUs=$CPUS State=UNKNOWN
NodeName=$NODE2 NodeAddr=$NODE2_ADDR CPUs=$CPUS State=UNKNOWN"
    fi
    mkdir -p "$CONF" "$LAB/ctld" "$LAB/log"
    # The lab owns these two files while it runs; a site's own are kept aside.
    for f in slurm.conf cgroup.conf; do
        if [ -e "$CONF/$f" ] && ! grep -q "gfxbpf slurm lab" "$CONF/$f"; then
            mv "$CONF/$f" "$LAB/$f.site"
        fi
    done
    cat >"$CONF/slurm.conf" <<EOF
# gfxbpf slurm lab (tools/slurm_lab.sh): removed by \`tools/slurm_lab.sh stop\`
ClusterName=gfxlab
SlurmctldHost=$ctld
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$LAB/ctld
SlurmdSpoolDir=$LAB/slurmd-%n
SlurmctldPidFile=$LAB/slurmctld.pid
SlurmdPidFile=$LAB/slurmd-%n.pid
SlurmctldLogFile=$LAB/log/slurmctld.log
SlurmdLogFile=$LAB/log/slurmd-%n.log
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
$nodes
PartitionName=lab Nodes=$names Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
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

# slurmd -N NAME, with the cgroup v2 hierarchy at /sys/fs/cgroup in its
# mount namespace; "$@" before it: a command that runs it elsewhere (n2's
# namespaces), whose own mount namespace the cgroup2 mount then goes into.
start_slurmd() {
    local name=$1 preload="" mountcg=true
    shift
    if pid_alive "$LAB/slurmd-$name.pid"; then return; fi
    if hybrid; then
        [ "$(stat -f -c %T /sys/fs/cgroup/unified 2>/dev/null)" = cgroup2fs ] ||
            die "no cgroup v2 hierarchy at /sys/fs/cgroup nor /sys/fs/cgroup/unified"
        # Slurm reads /proc/self/cgroup and refuses a hybrid: the shim shows it
        # the v2 line alone (tools/slurm_lab/v2only.c).
        gcc -shared -fPIC -O2 -Wall -o "$LAB/v2only.so" tools/slurm_lab/v2only.c -ldl
        mkdir -p /sys/fs/cgroup/unified/system.slice   # no systemd made it
        preload="$LAB/v2only.so"
        mountcg="umount -l /sys/fs/cgroup 2>/dev/null; mount -t cgroup2 cgroup2 /sys/fs/cgroup"
    elif [ $# -gt 0 ]; then  # ip netns exec mounts a sysfs of its own: no cgroup2 there
        mountcg="mount -t cgroup2 cgroup2 /sys/fs/cgroup"
    fi
    mkdir -p /sys/fs/cgroup/system.slice 2>/dev/null || true
    "$@" unshare --mount --propagation private env LD_PRELOAD="$preload" sh -c \
        "$mountcg && exec slurmd -N $name"
}

# n2's network: a veth pair between this machine and the namespace.
start_netns() {
    ip netns list | grep -qw "$NETNS" && return
    ip netns add "$NETNS"
    ip link add gfxlab0 type veth peer name gfxlab1
    ip link set gfxlab1 netns "$NETNS"
    ip addr add "$HOST_ADDR/24" dev gfxlab0
    ip link set gfxlab0 up
    ip netns exec "$NETNS" ip addr add "$NODE2_ADDR/24" dev gfxlab1
    ip netns exec "$NETNS" ip link set gfxlab1 up
    ip netns exec "$NETNS" ip link set lo up
}

wait_idle() {
    local i want=1
    [ -e "$LAB/two-nodes" ] && want=2
    for i in $(seq 1 60); do
        if [ "$(sinfo -h -N -o '%T' 2>/dev/null | grep -c -E '^(idle|mixed|allocated)')" = "$want" ]; then
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
    local what="node $NODE"
    if [ "${1:-}" = --two-nodes ]; then
        [ -e "$LAB/two-nodes" ] || [ ! -e "$LAB/slurmctld.pid" ] ||
            die "a one-node lab runs: tools/slurm_lab.sh stop first"
        touch "$LAB/two-nodes"
        start_netns
        what="nodes $NODE ($HOST_ADDR) and $NODE2 ($NODE2_ADDR, netns $NETNS)"
    fi
    write_config
    start_munge
    pid_alive "$LAB/slurmctld.pid" || slurmctld -c -i
    start_slurmd "$NODE"
    if [ -e "$LAB/two-nodes" ]; then
        # Its own host name too: slurmd and the broker there know their node by it.
        start_slurmd "$NODE2" ip netns exec "$NETNS" unshare --uts sh -c \
            "hostname $NODE2 && exec \"\$@\"" sh
    fi
    wait_idle
    scontrol update nodename="$NODE" state=resume 2>/dev/null || true
    echo "slurm_lab: up: $what, partition lab; \`tools/slurm_lab.sh stop\` ends it"
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
        for f in "$LAB"/slurmd-*.pid; do stop_pidfile "$f"; done
        stop_pidfile "$LAB/slurmctld.pid"
        stop_pidfile "$LAB/munged.pid"
        if [ -e "$LAB/munge.key.ours" ]; then rm -f /etc/munge/munge.key; fi
        for f in slurm.conf cgroup.conf; do
            if grep -q "gfxbpf slurm lab" "$CONF/$f" 2>/dev/null; then rm -f "$CONF/$f"; fi
            if [ -e "$LAB/$f.site" ]; then mv "$LAB/$f.site" "$CONF/$f"; fi
        done
        rm -rf "$LAB"
        if ip netns list | grep -qw "$NETNS"; then
            ip netns del "$NETNS"
            ip link del gfxlab0 2>/dev/null || true
        fi
        # slurmstepd's empty cgroups (the scope slurmd made, its slurmd and
        # system children): rmdir, deepest first; a cgroup with tasks stays.
        for root in /sys/fs/cgroup /sys/fs/cgroup/unified; do
            for scope in "$root/system.slice/${NODE}_slurmstepd.scope" \
                "$root/system.slice/${NODE2}_slurmstepd.scope"; do
                [ -d "$scope" ] && find "$scope" -depth -type d -exec rmdir {} \; 2>/dev/null
            done
        done
    fi
    echo "slurm_lab: stopped"
}

status() {
    for d in munged slurmctld "slurmd-$NODE" "slurmd-$NODE2"; do
        if pid_alive "$LAB/$d.pid"; then echo "$d: pid $(cat "$LAB/$d.pid")"; else echo "$d: not running"; fi
    done
    sinfo 2>/dev/null || true
}

case "${1:-}" in
start) start "${2:-}" ;;
stop) stop ;;
status) status ;;
*) echo "usage: tools/slurm_lab.sh start [--two-nodes] | stop | status" >&2; exit 2 ;;
esac
