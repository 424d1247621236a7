"""2. Cost per event in the kernel: run_time_ns / run_cnt.

With kernel.bpf_stats_enabled=1 the kernel times every run of every program
(the timing itself adds a little to each, the same for all). For each catalog
program with a bpftrace equivalent, three programs on the same tracepoints
see the same workload, one at a time: the catalog program (attached through
the broker, system-wide, by the bench user), the bpftrace program, and an
empty program (the floor: tracepoint + BPF call, no work).
"""

from __future__ import annotations

import os
from typing import Any

from bench import ownprogs
from bench.harness import BenchError, Bpftrace, Stage, bpf_stats_enabled, log, prog_stats
from bench.stats import median, ratio

# catalog program: (bpftrace script, empty programs, workload, events)
CASES: dict[str, tuple[str, list[str], str, int]] = {
    "syscount": (
        "tracepoint:raw_syscalls:sys_enter { @[args->id] = count(); }",
        ["empty_sys_enter"],
        "getppid",
        2_000_000,
    ),
    "execsnoop": (
        # execsnoop's record: pid, uid, comm, filename, through a ring buffer;
        # bpftrace's printf goes through a perf buffer.
        'tracepoint:sched:sched_process_exec { printf("%d %d %s %s\\n", pid, uid, comm, '
        "str(args->filename)); }",
        ["empty_exec"],
        "exec",
        2_000,
    ),
    "clonecount": (
        "tracepoint:syscalls:sys_enter_clone,tracepoint:syscalls:sys_enter_clone3 "
        "{ @[comm] = count(); }",
        ["empty_clone", "empty_clone3"],
        "fork",
        10_000,
    ),
}


def _measure(stage: Stage, pid: int, ids: list[int] | None, kind: str, n: int) -> dict:
    """ns per run of pid's programs (ids, or all it holds) over one workload."""
    before = prog_stats(pid)
    if ids is None:
        ids = list(before)
    missing = [i for i in ids if i not in before]
    if missing:
        raise BenchError(f"process {pid} holds no fd for programs {missing}")
    stage.workload(kind, n)
    after = prog_stats(pid)
    runs = sum(after[i][0] - before[i][0] for i in ids)
    ns = sum(after[i][1] - before[i][1] for i in ids)
    if runs <= 0:
        raise BenchError(f"programs {ids} did not run during the {kind} workload")
    return {"ns_per_event": ns / runs, "runs": runs}


def run(stage: Stage, rounds: int, scale: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with bpf_stats_enabled():
        for name, (script, empties, kind, n) in CASES.items():
            n = max(1, int(n * scale))
            samples: dict[str, list[dict]] = {"gfxbpf": [], "bpftrace": [], "empty": []}
            for i in range(rounds):
                log(f"kernel cost: {name}, round {i + 1}/{rounds}")
                with stage.held(name, drain=(name == "execsnoop")) as held:
                    samples["gfxbpf"].append(
                        _measure(stage, stage.broker_pid, held["prog_ids"], kind, n)
                    )
                bt = Bpftrace(script, stage.work / f"cost-{name}.out")
                try:
                    bt.wait_attached()
                    samples["bpftrace"].append(_measure(stage, bt.proc.pid, None, kind, n))
                finally:
                    bt.stop()
                with ownprogs.attached(stage.bench_object, empties) as obj:
                    ids = [p.id for p in obj.programs.values()]
                    samples["empty"].append(_measure(stage, os.getpid(), ids, kind, n))
            fig = {k: round(median([s["ns_per_event"] for s in v]), 1) for k, v in samples.items()}
            out[name] = {
                "ns_per_event": fig,
                "runs_per_round": {k: v[0]["runs"] for k, v in samples.items()},
                "ratio_vs_bpftrace": ratio(fig["gfxbpf"], fig["bpftrace"]),
                "ratio_vs_empty": ratio(fig["gfxbpf"], fig["empty"]),
                "bpftrace_vs_empty": ratio(fig["bpftrace"], fig["empty"]),
                "workload": f"{kind} x {n}",
                "bpftrace": script,
            }
    return out
