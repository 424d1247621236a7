"""bench/run: measure gfxbpf against bpftrace and bpftool, side by side.

Run as root (sudo bench/run). Sets up what a deployment has (the service
user, tracefs for its group, the broker from the unit's ExecStart with only
CAP_BPF+CAP_PERFMON) plus an unprivileged bench user, runs each measurement
against its peer in the same run, writes bench/results/<date>.json and
<date>.md (and latest.md), and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench import (
    attach_latency,
    broker_memory,
    cuda_cost,
    exporter_scrape,
    first_data,
    fixed_cost,
    footprint,
    kernel_cost,
    locks,
    machine,
    map_reads,
    memory_cost,
    offcpu,
    profile_bench,
    python_profile,
    report,
    ringbuf_rate,
    torch_chains,
    unwind_profile,
)
from bench import watchers as watchers_mod
from bench.harness import REPO, BenchError, Stage, log

# measurement -> (full run parameters, --quick parameters). --quick is a smoke
# (CI runs it: tests/kernel/test_bench_quick.py): every measurement once, small,
# so that none rots; its figures are not to be compared.
PLANS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "first_data": ({"rounds": 5, "attaches": 50}, {"rounds": 1, "attaches": 3}),
    "kernel_cost": ({"rounds": 3, "scale": 1.0}, {"rounds": 1, "scale": 0.05}),
    "watchers": (
        {"counts": [1, 10, 100], "n": 5_000_000, "rounds": 2},
        {"counts": [1, 2], "n": 100_000, "rounds": 1},
    ),
    "map_reads": ({"entries": 10_000, "rounds": 5}, {"entries": 1_000, "rounds": 1}),
    "ringbuf": ({"n": 2_000_000, "rounds": 5}, {"n": 50_000, "rounds": 1}),
    "footprint": ({"sessions": 100, "window": 10.0}, {"sessions": 10, "window": 1.0}),
    "cuda": (
        {
            "fillers": 30_000,
            "pad_mib": 64,
            "files": 3,
            "attaches": 10,
            "calls": 100_000,
            "rounds": 3,
        },
        {"fillers": 3_000, "pad_mib": 4, "files": 2, "attaches": 2, "calls": 5_000, "rounds": 1},
    ),  # fmt: skip
    "exporter": ({"comms": 10_000, "scrapes": 50}, {"comms": 200, "scrapes": 3}),
    "profile": (
        {"rounds": 3, "seconds": 5.0, "fold_hz": 20000, "fold_seconds": 4.0},
        {"rounds": 1, "seconds": 0.5, "fold_hz": 20000, "fold_seconds": 0.5},
    ),
    "broker_memory": ({"rounds": 3, "sessions": 100}, {"rounds": 1, "sessions": 10}),
    "python": ({"rounds": 3, "seconds": 5.0}, {"rounds": 1, "seconds": 0.5}),
    "unwind": ({"rounds": 3, "seconds": 4.0}, {"rounds": 1, "seconds": 0.5}),
    "offcpu": ({"rounds": 5, "seconds": 3.0}, {"rounds": 1, "seconds": 0.5}),
    "attach": ({"rounds": 5}, {"rounds": 1}),
    "locks": ({"rounds": 5, "seconds": 2.0}, {"rounds": 1, "seconds": 1.0}),
    "memory": ({"rounds": 3, "entries": 1_000_000}, {"rounds": 1, "entries": 300_000}),
    "fixed_cost": ({"rounds": 5}, {"rounds": 1}),
    # --quick: the stand-in loop (bench/torch_standin.py), no torch: CI's Debian 13
    # leg has none (tools/test_deps.sh), and torch's start would double the smoke.
    "torch": (
        {"rounds": 5, "seconds": 5.0, "workload": "torch"},
        {"rounds": 1, "seconds": 0.5, "workload": "standin"},
    ),
}
RUNNERS = {
    "first_data": first_data.run,
    "kernel_cost": kernel_cost.run,
    "watchers": watchers_mod.run,
    "map_reads": map_reads.run,
    "ringbuf": ringbuf_rate.run,
    "footprint": footprint.run,
    "cuda": cuda_cost.run,
    "exporter": exporter_scrape.run,
    "profile": profile_bench.run,
    "broker_memory": broker_memory.run,
    "python": python_profile.run,
    "unwind": unwind_profile.run,
    "offcpu": offcpu.run,
    "attach": attach_latency.run,
    "locks": locks.run,
    "memory": memory_cost.run,
    "fixed_cost": fixed_cost.run,
    "torch": torch_chains.run,
}

NOTES = [
    "Memory (17): python3 builds a dict of str -> list entries with PYTHONMALLOC=malloc "
    "(bench/memory_cost.py), timed by its own CPU time (the probes' time is charged to it). "
    "gfxclient profile --memory ran it as `-- COMMAND`, exact and with "
    "--sample-bytes 524288; the peer (bcc's memleak where it runs, else bpftrace's uprobes "
    "on malloc with its return and free, the same bookkeeping, by root) follows its pid, "
    "started stopped and continued once attached.",
    "Attach (14): the broker's audited elapsed_ms from request to attachment live. Cold: "
    "a stack copy size no earlier attach used, so the program is loaded and verified; warm: "
    "the same knobs for another process, which attaches the instance the first profile "
    "left parked (broker/sharing/warm.py). bpftool prog loadall verifies the object with "
    "its default knobs (target_uid GFX_ANY: these self-only programs return at once), so "
    "its figure is the floor of a load, not the same verification.",
    "Each ratio compares figures measured in this run, on this machine; medians over the "
    "rounds given in the JSON file.",
    "The broker ran from deploy/gfxbpf.service's ExecStart as the service user with only "
    "CAP_BPF and CAP_PERFMON; gfxclient and the client library ran as an unprivileged user; "
    "bpftrace and bpftool ran as root, as they must.",
    "Catalog programs were attached with scope=system, so they count every process's events "
    "as the bpftrace one-liners do.",
    "Per-event cost is the kernel's run_time_ns / run_cnt (kernel.bpf_stats_enabled=1 for "
    "the run, restored after); the timing adds the same overhead to every program.",
    "Time to first data: `watch --once` shows one view after one interval, so the literal "
    "command is dominated by its 1 s default interval; the rows below it separate the "
    "interval from start-up and attach.",
    "execsnoop's cost is its own run: a comm and a 256-byte filename copied into a reserved "
    "record. Its records are committed without waking the reader (BPF_RB_NO_WAKEUP; a "
    "wake-up only when the unread data crosses a quarter of the ring; readers look again "
    "every 50 ms): a wake-up per record ran inside the program's timed run (an irq_work "
    "self-IPI) and cost about 19 us per exec on these VMs (issue #15).",
    "Ring buffer: the reader is gfxbpf.bpf.RingBuffer in a Python process holding only the "
    "ring fd, fed by bench/bench.bpf.c (one 16-byte record per system call of the workload), "
    "decoding each record's two fields in runs (RingBuffer.poll_runs, RecordRun.unpack); "
    "lost records are counted by the program in the kernel. bpftrace's rate is its output "
    "lines over the time until its output stopped growing. The parts: the same workload with "
    "the program and no reader, with a wake-up per record (bench.bpf.c's wake_each), and "
    "the program's own run per record (kernel.bpf_stats, a round of its own).",
    "cuda: the stand-in libcuda (bench/cuda_standin.c) does no work, so a launch costs a few "
    "ns untraced and the traced figure is the price of one uprobe and one uretprobe trap plus "
    "the BPF programs. Uprobe traps are slow in a VM: ucalls on the same function costs as "
    "much here; on a 2026-11-22 H100 host ucalls added about 1.7 us per real launch "
    "(docs/gpu-hosts.md).",
    "Exporter: gfxbpf-exporter as the bench user with every catalog program that takes no "
    "parameter (scope system); scrape latency is a whole HTTP GET of /metrics; no peer "
    "exporter is installed to compare with.",
    "Profiles: the workload (bench/profile_bench.py, 10,000 distinct stacks, frame pointers) "
    "times itself; gfxclient ran it as `-- COMMAND` (pid filter in the kernel), perf record "
    "-g ran it through setpriv as the bench user, bpftrace sampled every CPU filtered by the "
    "bench user's uid. The flame-graph row times gfxclient from the end of sampling to the "
    "written file (maps read, symbols, output) against `perf script` plus a fold in Python "
    "(Debian has no stackcollapse-perf.pl), each at the frequency shown; the stack-trace "
    "map holds 16385 stacks in 32768 buckets and drops colliding ones (their samples kept "
    "as [user stack lost]), and its 16384-row count map fills at 20 kHz (the rest counted "
    "as lost), so gfxbpf folds fewer distinct stacks than perf. gfxclient reads new stacks "
    "and names their frames once a second while sampling; its symbol cache "
    "(~/.cache/gfxbpf/symbols) is warm after the first profile.",
    "Broker memory (10): a fresh broker each round; RSS is VmRSS, read while the bench "
    "user holds the program just attached (catalog: the largest over every program held "
    "in turn). The first CO-RE attach (execsnoop's tp_btf build, the first client load "
    "that relocates against vmlinux BTF) is timed in the client from request to attached; "
    "its CPU is the broker's (every thread's on-CPU time from /proc/PID/task/*/schedstat, "
    "the kernel's verification included) over that request. libbpf's time is the whole "
    "`bpftool prog loadall` process on the same object (both builds verified and pinned, "
    "not attached), its CPU its rusage. The broker indexes vmlinux BTF at start (its "
    "live-maps iterator is CO-RE; vmlinux is mapped, not copied, on kernels 6.16+), so "
    "the request does not pay for it; the next row is the same load in a fresh process "
    "(`python -m bench.broker_memory`) that has not indexed vmlinux yet.",
    "Python (12): Debian's python3 runs outer -> middle -> inner (bench/python_profile.py); "
    "gfxclient profile runs it as `-- COMMAND` with the bench user's stackcopy grant "
    "(scope self), py-spy 0.4 (PyPI) runs as root and starts it through setpriv as the bench "
    "user, in its default blocking mode (it stops the process per sample) and with "
    "--nonblocking. A sample counts as complete when outer, middle and inner are adjacent "
    "in order in its stack. The flame-graph time runs from the workload's own end to the "
    "tool's exit.",
    "Fixed cost (15): `gfxclient profile -o FILE.svg -- COMMAND` as the bench user against "
    "`perf record -g -o FILE -- COMMAND` and `py-spy record -o FILE.svg -- COMMAND` (Python "
    "only), both started as root through setpriv as the bench user; each from start to exit, "
    "rounds interleaved, after one untimed profile of each command (the caches a user's "
    "second profile finds: ~/.cache/gfxbpf in the bench user's own home). perf's figure "
    "ends with perf.data written, py-spy's and gfxclient's with the flame graph.",
    "Off-CPU (13): two threads ping-pong a byte over two pipes (bench/offcpu.py), about "
    "four context switches per round trip, timed by the workload itself. gfxclient "
    "profile --off-cpu ran it as `-- COMMAND`; offcputime (libbpf-tools) ran as root with "
    "-p on the same process, started stopped and continued once the tool had attached; "
    "perf record --off-cpu ran it through setpriv where Debian's perf supports the option "
    "(built with BUILD_BPF_SKEL=1; neither Debian 12's perf 6.1 nor Debian 13's 6.12 is). "
    "All keep waits of 1 ms and more. The rounds interleave the tools, and the JSON keeps "
    "each round's time (rounds_s): ping-pong times on a shared VM move by tens of percent.",
    "PyTorch loop (18): bench/torch_cnn.py (torch 2.13 CPU, a small CNN, a DataLoader with 2 "
    "workers, one intra-op thread), each step timed by bench/torch_timed.py; gfxclient "
    "profile as the bench user with only the entries `gfxbpf-admin approve profile` and "
    "`approve stackcopy` write with --users (the policy reloaded for the row) and no option "
    "but its output; perf record --call-graph dwarf -k CLOCK_MONOTONIC, py-spy record "
    "--native and py-spy record (PyPI) as root, starting the loop through setpriv as the "
    "bench user; all at 99 Hz (gfxclient's default). Under the step: a train_step frame "
    "(gfxclient, py-spy), the main thread inside a timed step (perf). Whole: reaches "
    "Py_BytesMain or main with no unwind-stopped marker; py-spy --native hides python3's "
    "own frames, main among them, so there a root frame in libc. Slowdown: untraced steps/s "
    "over traced in the same round, the median over rounds whose order rotates (the JSON "
    "keeps every round's rates). "
    "bench/torch_chains.py says how each figure is taken.",
    "Locks (16): four threads contend one pthread mutex (bench/locks.py); a contended "
    "operation is a futex wait that slept, as --locks counted them in the same round; the "
    "cost per contended operation is the added time of the workload's median run over "
    "that count, and the "
    "BPF time is kernel.bpf_stats' run time of program locks over it. gfxclient profile "
    "--locks ran it as `-- COMMAND`; perf lock contention -b (root) ran it through "
    "setpriv where Debian's perf has it (built with BUILD_BPF_SKEL=1); where not, the row "
    "gives perf's own error.",
]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench/run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="measurements: " + ", ".join(PLANS),
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke: each measurement once, small (~3 min); checks every row has a figure",
    )
    p.add_argument("--only", nargs="+", choices=list(PLANS), metavar="NAME", help="run only these")
    p.add_argument(
        "--out", type=Path, default=REPO / "bench/results", help="where results are written"
    )
    p.add_argument("--json", action="store_true", help="print the JSON document, not the table")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if os.geteuid() != 0:
        print(
            "bench/run: run as root (sudo bench/run): it starts the broker as the service "
            "user, runs bpftrace and bpftool, and turns kernel.bpf_stats_enabled on",
            file=sys.stderr,
        )
        return 2
    venv = Path(os.environ.get("GFXBPF_VENV", "/opt/gfxbpf/venv"))
    names = args.only or list(PLANS)
    started, load_start = time.monotonic(), round(os.getloadavg()[0], 2)
    stage = Stage(venv=venv)
    results: dict[str, Any] = {}
    params: dict[str, Any] = {}
    took: dict[str, float] = {}  # seconds per measurement
    try:
        log(f"setting up in {stage.work}")
        stage.prepare()
        for name in names:
            params[name] = PLANS[name][1 if args.quick else 0]
            log(f"== {name}")
            t0 = time.monotonic()
            results[name] = RUNNERS[name](stage, **params[name])
            took[name] = round(time.monotonic() - t0, 1)
            log(f"{name}: {took[name]} s")
    except BenchError as e:
        stage.close(keep=True)
        print(f"bench/run: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        stage.close()
        print("bench/run: interrupted; nothing written", file=sys.stderr)
        return 130
    except BaseException:
        stage.close(keep=True)
        raise
    stage.close(keep=bool(os.environ.get("GFXBPF_BENCH_KEEP")))  # the outputs, to look at
    doc = {
        "date": datetime.date.today().isoformat(),
        "args": argv,
        "elapsed_s": round(time.monotonic() - started, 1),
        "elapsed_by_measurement_s": took,
        # The machine is shared: its 1-minute load average at the start and the end.
        "load_average": [load_start, round(os.getloadavg()[0], 2)],
        "machine": machine.describe(),
        "parameters": params,
        "results": results,
        "notes": NOTES + [f"BCC: {machine.bcc_status()}"],
    }
    return _write(args, doc)


def _write(args: argparse.Namespace, doc: dict[str, Any]) -> int:
    """The JSON and the table (latest.md too, for a whole run); 1 if a row has no figure."""
    args.out.mkdir(parents=True, exist_ok=True)
    # A partial run is named by what it ran: it never overwrites a whole run's files.
    stem = (
        doc["date"] + ("-quick" if args.quick else "") + "".join(f"-{n}" for n in args.only or [])
    )
    (args.out / f"{stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    table = report.markdown(doc)
    (args.out / f"{stem}.md").write_text(table)
    if not args.quick and not args.only:
        (args.out / "latest.md").write_text(table)
    print(json.dumps(doc, indent=2) if args.json else table)
    log(f"wrote {args.out / stem}.json and .md")
    missing = report.missing_figures(doc)
    for problem in missing:
        print(f"bench/run: {problem}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
