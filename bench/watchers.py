"""3. Watchers: a syscall-heavy workload under 1, 10 and 100 watchers.

gfxbpf: that many `gfxclient watch syscount --json` processes of the bench
user, refreshing every second; the broker runs one shared syscount instance
for all of them. bpftrace: that many processes of the syscall-count
one-liner, each with its own program on the tracepoint.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from typing import Any

from bench.first_data import SYSCOUNT_BT
from bench.harness import BenchError, Stage, bpftraces, cpu_seconds, log
from bench.stats import median, ratio


@contextlib.contextmanager
def gfxclient_watchers(stage: Stage, n: int) -> Iterator[list[subprocess.Popen[str]]]:
    argv = ["--json", "watch", "syscount", "--interval", "1"]
    procs: list[subprocess.Popen[str]] = []
    outs = [stage.work / f"watch-{i}.jsonl" for i in range(n)]
    try:
        for path in outs:
            with open(path, "w") as f:
                procs.append(stage.gfxclient(*argv, stdout=f, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 120
        # Each prints its first view right after attaching.
        while not all(p.stat().st_size for p in outs):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise BenchError(f"not all {n} gfxclient watchers started")
            time.sleep(0.05)
        yield procs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def run(stage: Stage, counts: list[int], n: int, rounds: int) -> dict[str, Any]:
    log(f"watchers: untraced baseline, getppid x {n}")
    base = median([stage.workload("getppid", n)["elapsed"] for _ in range(rounds)])
    out: dict[str, Any] = {"untraced_s": round(base, 4), "workload": f"getppid x {n}"}
    one: dict[str, float] = {}
    for k in counts:
        log(f"watchers: {k} gfxclient watch syscount")
        with gfxclient_watchers(stage, k) as procs:
            shared = sum(
                1
                for r in stage.audit()
                if r.get("op") == "attach" and r.get("program") == "syscount" and r.get("shared")
            )
            # What the watchers and the broker spent while the workload ran: the
            # kernel side is one shared instance, so the rest is their CPU.
            pids = [p.pid for p in procs]
            cpu0, broker0, t0 = _cpu(pids), cpu_seconds(stage.broker_pid), time.monotonic()
            gfx = median([stage.workload("getppid", n)["elapsed"] for _ in range(rounds)])
            wall = time.monotonic() - t0
            watch_cpu = (_cpu(pids) - cpu0) / wall
            broker_cpu = (cpu_seconds(stage.broker_pid) - broker0) / wall
        log(f"watchers: {k} bpftrace")
        with bpftraces(SYSCOUNT_BT, k, stage.work) as fleet:
            bt = median([stage.workload("getppid", n)["elapsed"] for _ in range(rounds)])
        one.setdefault("gfxbpf", gfx)
        one.setdefault("bpftrace", bt)
        out[str(k)] = {
            "gfxbpf_s": round(gfx, 4),
            "bpftrace_s": round(bt, 4),
            "gfxbpf_slowdown": ratio(gfx, base),
            "bpftrace_slowdown": ratio(bt, base),
            "gfxbpf_vs_one_watcher": ratio(gfx, one["gfxbpf"]),
            "bpftrace_vs_one": ratio(bt, one["bpftrace"]),
            "ratio_vs_bpftrace": ratio(gfx, bt),
            "shared_joins_so_far": shared,
            # CPU seconds per second of the workload's rounds (2 CPUs: 2.0 is all)
            "gfxclient_watchers_cpu_per_s": round(watch_cpu, 3),
            "broker_cpu_per_s": round(broker_cpu, 3),
            "bpftrace_attached": len(fleet.attached),
            "bpftrace_failed": len(fleet.failed),
            "bpftrace_failure": fleet.failed[0] if fleet.failed else None,
        }
    return out


def _cpu(pids: list[int]) -> float:
    """The CPU seconds these processes used (one that exited: what it had)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += cpu_seconds(pid)
    return total
