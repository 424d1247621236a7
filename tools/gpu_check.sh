#!/usr/bin/env bash
# tools/gpu_check.sh: check the `cuda` program against the truth on your own NVIDIA host.
#
#   sudo tools/gpu_check.sh [--python PY] [--user NAME] [--site DIR] [--launches N] [--keep]
#
# NOT YET RUN ON A GPU HOST. It was written on 2026-11-23 on a machine without
# a GPU (CI tests the cuda program on a stand-in libcuda); the first person to
# run it on real hardware should expect to fix small things, and should add
# the figures it prints to docs/gpu-hosts.md.
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
#     markdown block for docs/gpu-hosts.md.
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
while [ $# -gt 0 ]; do
    case "$1" in
        --python) PY=$2; shift 2 ;;
        --user) USERNAME=$2; shift 2 ;;
        --site) SITE=$2; shift 2 ;;
        --launches) LAUNCHES=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 1 ;;
    esac
done

die() { echo "gpu_check: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root: it starts the broker and switches to --user"
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this is not an NVIDIA host"
LIBCUDA=$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')
[ -n "$LIBCUDA" ] || die "ldconfig knows no libcuda.so.1: is the NVIDIA driver installed?"
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
    if [ "$KEEP" = 1 ]; then echo "gpu_check: kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# ------------------------------------------------------------------ the broker
python3 -m gfxbpf.broker.admin approve cuda --users "$USERNAME" --scope self \
    --libraries "$LIBCUDA,$(dirname "$LIBCUDA")/libcuda.so*" > "$WORK/policy.toml"
chmod 0644 "$WORK/policy.toml"
mkdir -m 1777 "$WORK/run"
python3 -m gfxbpf.broker.main --user gfxbpf --policy "$WORK/policy.toml" \
    --socket "$WORK/run/control.sock" --grpc "unix:$WORK/run/grpc.sock" 2> "$WORK/audit.log" &
BROKER_PID=$!
for _ in $(seq 100); do [ -S "$WORK/run/control.sock" ] && break; sleep 0.1; done
[ -S "$WORK/run/control.sock" ] || { cat "$WORK/audit.log" >&2; die "the broker did not start"; }
GFX=(env "PYTHONPATH=${PYTHONPATH:-}" python3 -m gfxbpf.client --socket "$WORK/run/control.sock")

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
