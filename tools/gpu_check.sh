#!/usr/bin/env bash
# tools/gpu_check.sh: check the `cuda` program against the truth on your own NVIDIA host.
#
#   sudo tools/gpu_check.sh [--python PY] [--user NAME] [--site DIR] [--launches N] [--keep]
#                           [--out DIR] [--skip-python] [--cprofile] [--inject LIB]
#
# First run on 2026-11-26 on an NVIDIA H200 (driver 580, CUDA 13, PyTorch
# 2.11): docs/gpu-hosts.md has its figures; add yours there.
#
# What it does, as root:
#  1. starts a broker as deployed (--user gfxbpf: it drops to CAP_BPF +
#     CAP_PERFMON itself) with a policy that lets one ordinary user run `cuda`
#     on this host's libcuda;
#  2. as that user, starts a PyTorch workload that initialises CUDA, measures
#     its launches untraced, frees its memory and waits;
#  3. as that user, runs `gfxclient watch cuda --pid PID --json`, then lets the
#     workload do known work: N kernel launches, copies of known sizes host to
#     device, device to host and device to device, allocations through
#     PyTorch's caching allocator (whose own statistics give the bytes it took
#     from cudaMalloc), and synchronizations;
#  4. prints what gfxclient saw next to the truth, the broker's attach times
#     (first and second attach) and the launch time untraced and traced, and a
#     markdown block for docs/gpu-hosts.md;
#  5. Python frames down to the launch: a second PyTorch workload launches
#     from two Python functions a known number of times each, and the user
#     runs `watch cuda --by-python` (exact launches per Python function), a
#     `profile --stacks-at libcuda:<launch function>` (native and Python launch
#     stacks), CPU profiles of a Python loop that launches (the
#     default stack copy, 24 KiB as `approve` writes it, and 8 KiB), and
#     off-CPU and wall-clock profiles of one that waits
#     for the GPU; it prints the shares found;
#  7. device memory per Python line: a PyTorch workload allocates tensors
#     from two Python functions under `profile --memory --cuda` and
#     `--memory-live`; it prints the bytes gfxclient saw under each function
#     next to what torch.cuda.memory_stats() says the caching allocator
#     reserved from the driver in each (cudaMalloc'd segments, not tensors);
#  6. with --inject LIB (gfxbpf's CUPTI injection library, gpu/cupti/build.sh):
#     GPU time per kernel and the library's cost, by bench/gpu_kernels_check.py:
#     a launch-bound loop without the library, with it loaded and not listened
#     to, listened to (program `cudakernels` attached) and under torch.profiler;
#     the records collected while nothing listened (0); and the device time of
#     N matrix products from `cudakernels` against CUDA events around each.
#
# Options:
#   --python PY   the Python that has PyTorch (default: python3); run as --user
#   --user NAME   the ordinary user who runs the workload and gfxclient
#                 (default: gfxcheck, created without a home if missing)
#   --site DIR    gfxbpf installed with `pip install --target DIR` (see
#                 docs/gpu-hosts.md for hosts without network); default: the
#                 gfxbpf that `python3 -c 'import gfxbpf'` finds for root
#   --launches N  kernel launches in the measured window (default 20000)
#   --keep        keep the work directory (policy, audit log, outputs)
#   --out DIR     copy the reports, the audit log and the folded profiles here
#   --skip-python skip step 5
#   --cprofile    run step 5's CPU profile's gfxclient under cProfile (where its time goes)
#   --inject LIB  run step 6 with this injection library (libgfxcupti-cu13.so)
#
# Needs: nvidia-smi, a libcuda.so.1 that ldconfig knows, PyTorch with CUDA for
# --python, gfxbpf and its dependencies for root's python3, and a kernel with
# uprobe_multi (Linux >= 6.6). Pitfalls met on such hosts: background jobs of
# a non-interactive shell ignore SIGINT (so gfxclient runs with --duration);
# tracefs may need remounting for the broker's group (not needed by `cuda`).
set -euo pipefail

PY=python3
USERNAME=gfxcheck
SITE=""
LAUNCHES=20000
KEEP=0
OUTDIR=""
PYFRAMES=1
CPROFILE=0
INJECT=""
while [ $# -gt 0 ]; do
    case "$1" in
        --python) PY=$2; shift 2 ;;
        --user) USERNAME=$2; shift 2 ;;
        --site) SITE=$2; shift 2 ;;
        --launches) LAUNCHES=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
        --out) OUTDIR=$2; shift 2 ;;
        --skip-python) PYFRAMES=0; shift ;;
        --cprofile) CPROFILE=1; shift ;;
        --inject) INJECT=$(readlink -f "$2"); shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 1 ;;
    esac
done

die() { echo "gpu_check: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root: it starts the broker and switches to --user"
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this is not an NVIDIA host"
# The driver's libcuda: from ldconfig, else the one PyTorch maps (container
# hosts mount the driver's folder without telling ldconfig).
LIBCUDA=$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')
if [ -z "$LIBCUDA" ]; then
    LIBCUDA=$("$PY" -c 'import torch; torch.zeros(1, device="cuda")
print(next(l.split()[-1] for l in open("/proc/self/maps") if "/libcuda.so" in l))' 2>/dev/null || true)
fi
[ -n "$LIBCUDA" ] || die "no libcuda.so.1 (neither ldconfig nor $PY knows one): is the NVIDIA driver installed?"
LIBCUDA=$(readlink -f "$LIBCUDA")

if [ -n "$SITE" ]; then
    export PYTHONPATH=$SITE
    BIN=$SITE/bin
else
    BIN=$(dirname "$(command -v gfxclient || echo /nonexistent/gfxclient)")
fi
python3 -c 'import gfxbpf.broker.main, gfxbpf.client' 2>/dev/null \
    || die "root's python3 cannot import gfxbpf (give --site DIR, see docs/gpu-hosts.md)"

id gfxbpf >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin gfxbpf
id "$USERNAME" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$USERNAME"
AS=(runuser -u "$USERNAME" --)
"${AS[@]}" "$PY" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null \
    || die "$PY run as $USERNAME has no PyTorch with a usable GPU (give --python)"

WORK=$(mktemp -d /tmp/gfxbpf-gpu-check.XXXXXX)
chmod 0755 "$WORK"
BROKER_PID=""
cleanup() {
    [ -n "$BROKER_PID" ] && kill "$BROKER_PID" 2>/dev/null && wait "$BROKER_PID" 2>/dev/null
    if [ -n "$OUTDIR" ]; then
        mkdir -p "$OUTDIR"
        tar czf "$OUTDIR/gpu_check.tgz" -C "$WORK" --exclude=./run . || true
    fi
    if [ "$KEEP" = 1 ]; then echo "gpu_check: kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# ------------------------------------------------------------------ the broker
LIBS="$LIBCUDA,$(dirname "$LIBCUDA")/libcuda.so*"
{
    python3 -m gfxbpf.broker.admin approve cuda --users "$USERNAME" --scope self --libraries "$LIBS"
    # step 5: launch stacks (ustackcopy), CPU samples (stackcopy), waits (offcpu)
    python3 -m gfxbpf.broker.admin approve ustackcopy --users "$USERNAME" --scope self --libraries "$LIBS"
    python3 -m gfxbpf.broker.admin approve stackcopy --users "$USERNAME" --scope self
    python3 -m gfxbpf.broker.admin approve offcpu --users "$USERNAME" --scope self
    # step 7: device memory per Python line (memstacks on libcuda)
    python3 -m gfxbpf.broker.admin approve memstacks --users "$USERNAME" --scope self \
        --libraries "$LIBS"
    # step 6: GPU time per kernel (cudakernels on the injection library)
    if [ -n "$INJECT" ]; then
        python3 -m gfxbpf.broker.admin approve cudakernels --users "$USERNAME" --scope self \
            --libraries "$INJECT"
    fi
    printf '[limits]\nmap_bytes_per_user = %d\n' $((512 << 20))
} > "$WORK/policy.toml"
chmod 0644 "$WORK/policy.toml"
mkdir -m 1777 "$WORK/run"
python3 -m gfxbpf.broker.main --user gfxbpf --policy "$WORK/policy.toml" \
    --socket "$WORK/run/control.sock" --grpc "unix:$WORK/run/grpc.sock" 2> "$WORK/audit.log" &
BROKER_PID=$!
for _ in $(seq 100); do [ -S "$WORK/run/control.sock" ] && break; sleep 0.1; done
[ -S "$WORK/run/control.sock" ] || { cat "$WORK/audit.log" >&2; die "the broker did not start"; }
GFX=(env "PYTHONPATH=${PYTHONPATH:-}" python3 -m gfxbpf.client --socket "$WORK/run/control.sock"
     --grpc "unix:$WORK/run/grpc.sock")

# ------------------------------------------------------------------ the workload
cat > "$WORK/workload.py" <<'EOF'
"""Known CUDA work for gpu_check.sh; writes its truth as JSON at the end."""
import json, os, sys, time
import torch

work, n = sys.argv[1], int(sys.argv[2])
MIB = 1 << 20
dev = torch.device("cuda")
x = torch.zeros(1024, device=dev)
for _ in range(100):  # warm up: the first launches load modules
    x.add_(1)
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(n):
    x.add_(1)
untraced_us = (time.perf_counter() - t) * 1e6 / n
torch.cuda.synchronize()
host = torch.ones(8 * MIB // 4, dtype=torch.float32)   # 8 MiB, pageable
pinned = torch.ones(4 * MIB // 4, dtype=torch.float32).pin_memory()  # 4 MiB
torch.cuda.synchronize()
torch.cuda.empty_cache()
torch.cuda.reset_peak_memory_stats()
before = torch.cuda.memory_stats()
with open(f"{work}/pid", "w") as f:
    f.write(str(os.getpid()))
while not os.path.exists(f"{work}/go"):
    time.sleep(0.02)

t = time.perf_counter()
for _ in range(n):
    x.add_(1)  # one elementwise kernel each
traced_us = (time.perf_counter() - t) * 1e6 / n
torch.cuda.synchronize()
a = torch.empty(64 * MIB // 4, device=dev)   # allocations of known size
b = torch.empty(64 * MIB // 4, device=dev)
d = torch.empty(8 * MIB // 4, device=dev)
p = torch.empty(4 * MIB // 4, device=dev)
for _ in range(3):
    d.copy_(host)               # 3 x 8 MiB host to device (pageable)
    p.copy_(pinned, non_blocking=True)  # 3 x 4 MiB host to device (pinned)
for _ in range(2):
    host.copy_(d)               # 2 x 8 MiB device to host
for _ in range(5):
    b[: 16 * MIB // 4].copy_(a[: 16 * MIB // 4])  # 5 x 16 MiB device to device
syncs = 7
for _ in range(syncs):
    torch.cuda.synchronize()
del a, d
torch.cuda.empty_cache()        # gives the freed segments back: cuMemFree
after = torch.cuda.memory_stats()
base = before["reserved_bytes.all.current"]
truth = {
    "launches": n,
    "htod_bytes": 3 * 8 * MIB + 3 * 4 * MIB,
    "dtoh_bytes": 2 * 8 * MIB,
    "dtod_bytes": 5 * 16 * MIB,
    "segments_allocated": after["segment.all.allocated"] - before["segment.all.allocated"],
    "segments_freed": after["segment.all.freed"] - before["segment.all.freed"],
    "live_bytes": after["reserved_bytes.all.current"] - base,
    "peak_bytes": after["reserved_bytes.all.peak"] - base,
    "synchronize_calls": syncs,
    "launch_us_untraced": round(untraced_us, 3),
    "launch_us_traced": round(traced_us, 3),
}
with open(f"{work}/truth.json", "w") as f:
    json.dump(truth, f)
time.sleep(2.5)  # two more views of the watch after the work
EOF
chmod 0644 "$WORK/workload.py"
mkdir -m 0777 "$WORK/out"

"${AS[@]}" "$PY" "$WORK/workload.py" "$WORK/out" "$LAUNCHES" > "$WORK/workload.log" 2>&1 &
WL=$!
for _ in $(seq 600); do [ -s "$WORK/out/pid" ] && break; sleep 0.1; done
[ -s "$WORK/out/pid" ] || { cat "$WORK/workload.log" >&2; die "the workload did not start"; }
PID=$(cat "$WORK/out/pid")

# A first attach (cold symbol index) and a second (cached), broker-side times from the audit log.
"${AS[@]}" "${GFX[@]}" watch cuda --pid "$PID" --once --interval 0.1 --json > "$WORK/once1.json"
"${AS[@]}" "${GFX[@]}" watch cuda --pid "$PID" --once --interval 0.1 > "$WORK/once2.txt"

"${AS[@]}" "${GFX[@]}" watch cuda --pid "$PID" --interval 1 --duration 600 --json \
    > "$WORK/watch.json" 2> "$WORK/watch.err" &
WATCH=$!
for _ in $(seq 300); do [ -s "$WORK/watch.json" ] && break; sleep 0.1; done
[ -s "$WORK/watch.json" ] || { cat "$WORK/watch.err" >&2; die "gfxclient watch cuda printed nothing"; }
touch "$WORK/out/go"
wait "$WL" || { cat "$WORK/workload.log" >&2; die "the workload failed"; }
kill "$WATCH" 2>/dev/null; wait "$WATCH" 2>/dev/null || true

# ------------------------------------------------------------------ the report
python3 - "$WORK" "$PID" "$LIBCUDA" <<'EOF'
import json, os, platform, subprocess, sys, time
work, pid, lib = sys.argv[1], sys.argv[2], sys.argv[3]
truth = json.load(open(f"{work}/out/truth.json"))
last = json.loads(open(f"{work}/watch.json").read().splitlines()[-1])
proc = last["processes"].get(pid)
if proc is None:
    sys.exit(f"gpu_check: gfxclient saw no CUDA calls of process {pid}: {last}")
attaches = [json.loads(l) for l in open(f"{work}/audit.log") if l.startswith("{")]
attach_ms = [r["elapsed_ms"] for r in attaches if r.get("op") == "attach" and r.get("result") == "ok"]
mem, copies = proc["memory"], proc["copies"]
rows = [
    ("kernel launches", proc["launches"], truth["launches"]),
    ("bytes host to device", copies["htod"]["bytes"], truth["htod_bytes"]),
    ("bytes device to host", copies["dtoh"]["bytes"], truth["dtoh_bytes"]),
    ("bytes device to device", copies["dtod"]["bytes"], truth["dtod_bytes"]),
    ("bytes by unified-address copies (cuMemcpy*; direction unknown)", copies["any"]["bytes"], 0),
    ("allocations (cudaMalloc segments)", proc["allocations"], truth["segments_allocated"]),
    ("frees (segments given back)", mem.get("frees", 0), truth["segments_freed"]),
    ("live device bytes at the end", mem.get("live", 0), truth["live_bytes"]),
    ("peak device bytes", mem.get("peak", 0), truth["peak_bytes"]),
    ("synchronize calls (at least)", proc["sync_calls"], truth["synchronize_calls"]),
]
drv = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip().splitlines()[0]
print(f"\n{'measure':<62} {'gfxclient':>14} {'truth':>14}")
for name, got, want in rows:
    ok = got >= want if "at least" in name else got == want
    mark = "" if ok else "  <- differs"
    print(f"{name:<62} {got:>14} {want:>14}{mark}")
print(f"time blocked in synchronization: {proc['sync_ns'] / 1e6:.1f} ms")
print(f"skipped functions: {last['skipped_functions'] or 'none'}")
print(f"broker attach ms (first, then later ones): {attach_ms}")
print(f"launch time untraced {truth['launch_us_untraced']} us, traced {truth['launch_us_traced']} us")
print("\nFor docs/gpu-hosts.md:\n")
print(f"### {time.strftime('%Y-%m-%d')}: {drv}, kernel {platform.release()}\n")
print(f"`tools/gpu_check.sh --launches {truth['launches']}`, libcuda {lib} "
      f"({os.path.getsize(lib) / 1e6:.0f} MB).\n")
print("| measure | gfxclient | truth |\n|---|---|---|")
for name, got, want in rows:
    print(f"| {name} | {got} | {want} |")
print(f"| broker attach, first / second (ms) | {attach_ms[0] if attach_ms else '?'} / "
      f"{attach_ms[1] if len(attach_ms) > 1 else '?'} | — |")
print(f"| launch time untraced → traced (µs) | {truth['launch_us_untraced']} → "
      f"{truth['launch_us_traced']} | — |")
EOF

# ------------------------------------------------------------------ 6. GPU time per kernel
if [ -n "$INJECT" ]; then
    echo; echo "## GPU time per kernel and the injection library's cost (step 6)"
    python3 "$(dirname "$0")/../bench/gpu_kernels_check.py" --inject "$INJECT" --python "$PY" \
        --user "$USERNAME" --out "$WORK/kernels.json" --socket "$WORK/run/control.sock" \
        || echo "gpu_check: step 6 failed (its output above says where)" >&2
fi

# ------------------------------------------------------------------ 7. device memory per Python line
# The workload allocates in two functions, each phase started by a file:
# big() 64 MiB tensors (a segment each), small() 1 MiB ones (the allocator's
# 20 MiB large-pool segments); it frees big()'s segments (empty_cache) and
# writes what each function made it reserve (memory_stats) to mem-PHASE.json.
cat > "$WORK/memwork.py" <<'PYEOF'
import json, os, sys, time
import torch
out = sys.argv[1]
torch.zeros(1, device="cuda")
def wait(name):
    while not os.path.exists(f"{out}/{name}"): time.sleep(0.05)
def reserved():
    return torch.cuda.memory_stats()["reserved_bytes.all.allocated"]
def big(n): return [torch.empty(64 << 20, dtype=torch.uint8, device="cuda") for _ in range(n)]
def small(n): return [torch.empty(1 << 20, dtype=torch.uint8, device="cuda") for _ in range(n)]
open(f"{out}/pid", "w").write(str(os.getpid()))
for phase in ("alloc", "live"):
    wait(f"go-{phase}")
    r0 = reserved(); a = big(8); r1 = reserved(); b = small(100); r2 = reserved()
    del a; torch.cuda.empty_cache()  # big()'s segments back to the driver
    json.dump({"big": r1 - r0, "small": r2 - r1}, open(f"{out}/mem-{phase}.json", "w"))
    time.sleep(10.0)  # small()'s still held when the profile ends
    del b; torch.cuda.empty_cache()
PYEOF
chmod 0644 "$WORK/memwork.py"
O7=$WORK/out7
mkdir -p "$O7" && chown "$USERNAME" "$O7"
"${AS[@]}" "$PY" "$WORK/memwork.py" "$O7" > "$WORK/memwork.log" 2>&1 &
WL7=$!
mem_attaches() {  # memstacks attaches the broker has audited as done
    grep '"op": *"attach"' "$WORK/audit.log" | grep '"result": *"ok"' \
        | grep -c '"program": *"memstacks"' || true
}
step7() {
    for _ in $(seq 600); do [ -s "$O7/pid" ] && break; sleep 0.1; done
    local phase flag pid n0 prof
    pid=$(cat "$O7/pid")
    for phase in alloc live; do
        flag=--memory; [ "$phase" = live ] && flag=--memory-live
        n0=$(mem_attaches)
        "${AS[@]}" "${GFX[@]}" --json profile "$flag" --cuda --pid "$pid" --duration 6 \
            --format folded -o "$O7/$phase.folded" > "$O7/$phase.json" 2> "$O7/$phase.err" &
        prof=$!
        for _ in $(seq 300); do [ "$(mem_attaches)" -gt "$n0" ] && break; sleep 0.1; done
        "${AS[@]}" touch "$O7/go-$phase"  # the probes are live: allocate
        wait "$prof" || true
    done
}
step7 || echo "gpu_check: step 7 did not finish" >&2
kill "$WL7" 2>/dev/null || true
python3 - "$O7" <<'PYEOF'
import json, os, sys
d = sys.argv[1]
print("\n## Device memory per Python line (step 7)\n")
print("| profile | Python function | gfxclient (bytes) | memory_stats (bytes) |\n|---|---|---|---|")
for phase in ("alloc", "live"):
    try:
        truth = json.load(open(f"{d}/mem-{phase}.json"))
        rows = [l.rsplit(" ", 1) for l in open(f"{d}/{phase}.folded").read().split("\n") if l]
    except OSError as e:
        print(f"| {phase} | — | {e} | — |"); continue
    for fn in ("big", "small"):
        got = sum(int(n) for s, n in rows if f";{fn} (" in s)
        want = 0 if phase == "live" and fn == "big" else truth[fn]
        print(f"| --memory{'-live' if phase == 'live' else ''} --cuda | {fn} | {got} | {want} |")
    err = open(f"{d}/{phase}.err").read().strip()
    if err:
        print(f"\n{phase} stderr: {err[-600:]}")
PYEOF

[ "$PYFRAMES" = 1 ] || exit 0

# ------------------------------------------------------------------ 5. Python frames down to the launch
# The workload's phases each end by writing a file and wait for the next `goK`:
# (1) launch_a N times and launch_b 3N times, counted exactly by
# `watch cuda --by-python`; (2) the same two functions in turns for PHASE
# seconds, under `profile --stacks-at libcuda:FUNC`; (3) a Python loop that
# computes and launches (spin), under two CPU profiles (the default 24 KiB
# and 8 KiB stack copies); (4) matrix products and synchronizations (wait_gpu), under
# `profile --off-cpu` and `--wall`. The workload's context blocks in synchronizations (CU_CTX_SCHED_BLOCKING_SYNC): with the
# default on a host of many cores the CPU spins in them and no wait shows.
cat > "$WORK/pyframes.py" <<'PYEOF'
"""Python functions that launch known CUDA work, for gpu_check.sh step 5."""
import ctypes, os, sys, time

cu = ctypes.CDLL("libcuda.so.1")  # before torch makes the primary context
dev = ctypes.c_int()
assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
set_flags = getattr(cu, "cuDevicePrimaryCtxSetFlags_v2", None) or cu.cuDevicePrimaryCtxSetFlags
assert set_flags(dev, 4) == 0  # CU_CTX_SCHED_BLOCKING_SYNC

import torch  # noqa: E402

work, n, phase = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
x = torch.zeros(1024, device="cuda")
a = torch.randn(4096, 4096, device="cuda")


def launch_a(k):
    for _ in range(k):
        x.add_(1)


def launch_b(k):
    for _ in range(k):
        x.mul_(1.0)


def spin(seconds):
    end = time.perf_counter() + seconds
    total = 0
    while time.perf_counter() < end:
        total += sum(i * i for i in range(200))
        x.add_(1)
    return total


def wait_gpu(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            a.mul_(0.5).add_(a @ a)
        torch.cuda.synchronize()


def step(done, go):
    with open(f"{work}/{done}", "w"):
        pass
    while not os.path.exists(f"{work}/{go}"):
        time.sleep(0.02)


launch_a(100)
launch_b(100)
torch.cuda.synchronize()
with open(f"{work}/pid", "w") as f:
    f.write(str(os.getpid()))
step("ready", "go1")
launch_a(n)
launch_b(3 * n)
torch.cuda.synchronize()
step("done1", "go2")
end = time.perf_counter() + phase
while time.perf_counter() < end:
    launch_a(100)
    launch_b(300)
torch.cuda.synchronize()
step("done2", "go3")
spin(2 * phase + 4)  # two profiles: 24 and 8 KiB stack copies
step("done3", "go4")
wait_gpu(2 * phase + 4)  # two profiles: --off-cpu and --wall
with open(f"{work}/done4", "w"):
    pass
PYEOF
chmod 0644 "$WORK/pyframes.py"
mkdir -m 0777 "$WORK/out2"
O2=$WORK/out2
PHASE=10
N2=$((LAUNCHES / 4))
"${AS[@]}" "$PY" "$WORK/pyframes.py" "$O2" "$N2" "$PHASE" > "$WORK/pyframes.log" 2>&1 &
WL2=$!
wait_for() {  # FILE SECONDS
    for _ in $(seq $(($2 * 10))); do [ -e "$1" ] && return 0; sleep 0.1; done
    cat "$WORK/pyframes.log" >&2
    echo "gpu_check: step 5: no $1 after $2 s" >&2
    return 1
}
profile_phase() {  # GO NAME ARGS...: start the phase, then profile it
    local go=$1 name=$2 t0 client=("${GFX[@]}")
    shift 2
    if [ "$CPROFILE" = 1 ] && [ "$name" = cpu ]; then
        client=("${GFX[@]:0:3}" -m cProfile -o "$O2/client.cprofile" "${GFX[@]:3}")
    fi
    touch "$O2/$go"
    t0=$(date +%s.%N)
    "${AS[@]}" "${client[@]}" --json profile --pid "$PID2" --duration $((PHASE - 4)) "$@" \
        --format folded -o "$O2/$name.folded" > "$WORK/$name.json" 2> "$WORK/$name.err" \
        || cat "$WORK/$name.err" >&2
    echo "$t0 $(date +%s.%N)" > "$WORK/$name.time"
}
step5() {
    wait_for "$O2/ready" 120 || return 1
    PID2=$(cat "$O2/pid")
    "${AS[@]}" "${GFX[@]}" watch cuda --by-python --pid "$PID2" --interval 1 --duration 600 \
        --json > "$WORK/bypy.json" 2> "$WORK/bypy.err" &
    local w=$!
    for _ in $(seq 600); do [ -s "$WORK/bypy.json" ] && break; sleep 0.1; done
    touch "$O2/go1"
    wait_for "$O2/done1" 120 || return 1
    sleep 2.5  # two more views
    kill "$w" 2>/dev/null
    wait "$w" 2>/dev/null || true
    # the launch function PyTorch's runtime calls most, from the counts above
    local fn
    fn=$(python3 -c 'import json, sys
by = {}
for g in json.loads(open(sys.argv[1]).read().splitlines()[-1]).get("python_functions", []):
    for f, k in g.get("by_launch_function", {}).items():
        by[f] = by.get(f, 0) + k
print(max(by, key=by.get) if by else "cuLaunchKernel")' "$WORK/bypy.json" 2>/dev/null) \
        || fn=cuLaunchKernel
    echo "$fn" > "$WORK/launch_function"
    profile_phase go2 launch --stacks-at "$LIBCUDA:$fn"
    wait_for "$O2/done2" 60 || return 1
    profile_phase go3 cpu --frequency 499
    profile_phase go3 cpu8k --frequency 499 --stack-bytes 8192
    wait_for "$O2/done3" 60 || return 1
    profile_phase go4 offcpu --off-cpu
    profile_phase go4 wall --wall --frequency 99
    wait "$WL2" || { cat "$WORK/pyframes.log" >&2; return 1; }
}
step5 || echo "gpu_check: step 5 did not finish; its report shows what it has" >&2

python3 - "$WORK" "$N2" $((PHASE - 4)) <<'PYEOF' | tee "$WORK/python_report.txt"
import json, os, sys

work, n = sys.argv[1], int(sys.argv[2])


def text(name):
    try:
        return open(f"{work}/{name}").read()
    except OSError:
        return ""


def records(name):  # one JSON document, or one per line (watch)
    try:
        return [json.loads(text(name))]
    except ValueError:
        return [json.loads(ln) for ln in text(name).splitlines() if ln.startswith("{")]


def folded(name):
    rows = []
    for line in text(f"out2/{name}.folded").split("\n"):  # one stack a line: not splitlines()
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        rows.append((stack.split(";"), int(count)))
    return rows


def share(rows, test):
    total = sum(c for _, c in rows)
    return (sum(c for s, c in rows if test(s)) * 100 / total if total else 0.0), total


def has(prefix):
    return lambda stack: any(f.startswith(prefix) for f in stack)


print("\n## Python frames down to the launch (step 5)\n")
views = records("bypy.json")
if views:
    last = views[-1]
    funcs = last.get("python_functions", [])
    # launches per calling function of the script, wherever it is in the chain
    under = {"launch_a": 0, "launch_b": 0, "other": 0}
    for g in funcs:
        for c in g.get("chains", []):
            names = [f.split(" (")[0] for f in c["chain"]]
            key = next((k for k in ("launch_a", "launch_b") if k in names), "other")
            under[key] += c["launches"]
    print("| watch cuda --by-python | gfxclient | truth |\n|---|---|---|")
    print(f"| launches under launch_a | {under['launch_a']} | {n} |")
    print(f"| launches under launch_b | {under['launch_b']} | {3 * n} |")
    print(f"| launches under other Python functions | {under['other']} | 0 |")
    print(f"| all launches | {last.get('launches')} | {4 * n} |")
    print(f"| lost | {last.get('lost')} | 0 |")
    for g in funcs:
        print(f"\n`{g['function']}`: {g['launches']} launches, {g.get('by_launch_function')}")
        for c in g.get("chains", [])[:2]:
            print(f"  {c['launches']}: {' -> '.join(c['chain'])}")
else:
    print("watch cuda --by-python printed nothing:\n" + text("bypy.err"))

fn = text("launch_function").strip() or "?"
print("\n| profile | measure | value |\n|---|---|---|")
rows = folded("launch")
s, t = share(rows, lambda st: has("launch_a (")(st) or has("launch_b (")(st))
a, _ = share(rows, has("launch_a ("))
b, _ = share(rows, has("launch_b ("))
print(f"| --stacks-at libcuda:{fn} | calls | {t} |")
print(f"| | share under launch_a or launch_b | {s:.1f}% |")
print(f"| | launch_b : launch_a (truth 3) | {b / a if a else 0:.2f} |")
print(f"| | share reaching Py_BytesMain | {share(rows, has('Py_BytesMain'))[0]:.1f}% |")
for name, copy in (("cpu", "the policy's default, 24 KiB"), ("cpu8k", "8 KiB")):
    rows = folded(name)
    s, t = share(rows, has("spin ("))
    print(f"| CPU at 499 Hz, a Python loop that launches ({copy} stack copies) | samples | {t} |")
    print(f"| | share under spin | {s:.1f}% |")
    print(f"| | share reaching Py_BytesMain | {share(rows, has('Py_BytesMain'))[0]:.1f}% |")
    print(f"| | share in libcuda | {share(rows, lambda st: any('libcuda' in f for f in st))[0]:.1f}% |")
rows = folded("offcpu")
s, t = share(rows, has("wait_gpu ("))
leaves: dict[str, int] = {}
for st, c in rows:
    leaves[st[-1]] = leaves.get(st[-1], 0) + c
top = ", ".join(f"{k} {v / 1e9:.2f} s" for k, v in sorted(leaves.items(), key=lambda kv: -kv[1])[:4])
print(f"| off-CPU, matrix products and synchronize | blocked time | {t / 1e9:.2f} s |")
print(f"| | share under wait_gpu | {s:.1f}% |")
print(f"| | leaf frames | {top} |")
rows = folded("wall")
s, t = share(rows, has("wait_gpu ("))
threads = {st[1] for st, _ in rows if len(st) > 1}
waits = share(rows, lambda st: st[-1].startswith("[wait"))[0]
print(f"| wall clock, 99 Hz, the same loop | time | {t / 1e9:.2f} s over {len(threads)} threads |")
print(f"| | share under wait_gpu | {s:.1f}% |")
print(f"| | share waiting (off the CPU) | {waits:.1f}% |")
for name in ("launch", "cpu", "cpu8k", "offcpu", "wall"):
    t = text(f"{name}.time").split()
    if len(t) == 2:
        print(f"\n{name}: gfxclient ran {float(t[1]) - float(t[0]):.2f} s "
              f"for a profile of {sys.argv[3]} s")
    for rec in records(f"{name}.json")[-1:]:
        print(f"\n{name}: {json.dumps(rec)[:1200]}")
    if text(f"{name}.err").strip():
        print(f"\n{name} stderr: {text(f'{name}.err')[-800:]}")
PYEOF
