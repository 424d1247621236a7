"""5. Ring buffer: events per second into one Python client, lost counted.

One record per system call of the workload (getppid in a loop), written by
bench.bpf.c's stream_sys_enter into a ring buffer. The consumer is a Python
process of the bench user holding nothing but the ring's fd, reading with
gfxbpf.bpf.RingBuffer (the reader under `gfxclient stream` on the fd
transport). The program counts in the kernel the records the ring had no
room for. Two ring sizes: 64 MiB holds the whole run (what a user sizing
for no loss would do), 256 KiB shows what a small ring loses while the
workload outruns the reader. The peer: bpftrace printf of the same event.
"""

from __future__ import annotations

import time
from typing import Any

from bench import ownprogs
from bench.harness import (
    BenchError,
    Bpftrace,
    Stage,
    bpf_stats_enabled,
    go,
    log,
    read_json_line,
)
from bench.stats import median, ratio

# The periodic reader's pause between reads, seconds: a 64 MiB ring holds the
# whole run, so it loses nothing however long it waits.
PERIODIC_READ_S = 0.01


def _ours(
    stage: Stage,
    n: int,
    ring_bytes: int,
    *,
    reader: bool = True,
    wake_each: int = 0,
    every: float = 0.0,
) -> dict[str, Any]:
    """One traced run. reader=False: no consumer (the ring holds the whole
    run), the kernel's cost alone; wake_each=1: a wake-up per record; every:
    the reader reads at most once per that many seconds."""
    wl = stage.gated_workload("getppid", n)
    knobs = {"target_pid": wl.pid, "wake_each": wake_each}
    got: dict[str, Any] = {}
    try:
        with ownprogs.attached(stage.bench_object, ["stream_sys_enter"], knobs, ring_bytes) as obj:
            ring_fd = obj.map("records").fileno()
            if reader:
                consumer = stage.clientside(
                    "consume", str(ring_fd), "1.0", str(every), pass_fds=(ring_fd,)
                )
                read_json_line(consumer.stdout, consumer, "consume")
            res = go(wl)
            if reader:
                got = read_json_line(consumer.stdout, consumer, "consume")
                consumer.communicate(timeout=30)
            written, lost = ownprogs.tally(obj)
            prog_ns = ownprogs.run_time(obj, "stream_sys_enter")
    finally:
        if wl.poll() is None:
            wl.kill()
    out = {"ring_bytes": ring_bytes, "wake_each": bool(wake_each), "lost_in_kernel": lost,
           "workload_s": round(res["elapsed"], 4), "written": written}  # fmt: skip
    if prog_ns is not None:
        out["program_ns_per_record"] = round(prog_ns[1] / max(1, prog_ns[0]), 1)
    if not reader:
        return out
    if got["received"] != written:
        raise BenchError(f"the kernel wrote {written} records, the client got {got['received']}")
    span = got["last_at"] - res["start"]
    out |= {
        "events": got["received"],
        "delivered_per_s": round(got["received"] / span) if span > 0 else None,
        "reader_ns_per_record": round(got["reader_cpu_s"] / max(1, got["received"]) * 1e9, 1),
    }
    return out


def _bpftrace(stage: Stage, n: int) -> dict[str, Any]:
    wl = stage.gated_workload("getppid", n)
    out = stage.work / "ringbuf-bpftrace.out"
    bt = Bpftrace(
        f'tracepoint:raw_syscalls:sys_enter /pid == {wl.pid}/ {{ printf("%d\\n", args->id); }}',
        out,
    )
    try:
        bt.wait_attached()
        start_size = out.stat().st_size
        res = go(wl)
        # bpftrace has no per-record times: the last time its output grew.
        last_growth, size = time.monotonic(), out.stat().st_size
        while time.monotonic() - last_growth < 1.0:
            time.sleep(0.01)
            if (s := out.stat().st_size) != size:
                size, last_growth = s, time.monotonic()
    finally:
        bt.stop()
        if wl.poll() is None:
            wl.kill()
    lines = out.read_bytes()[start_size:].decode(errors="replace").splitlines()
    events = sum(1 for line in lines if line.isdigit())
    lost = sum(int(w) for line in lines if "Lost" in line for w in line.split() if w.isdigit())
    span = last_growth - res["start"]
    return {
        "events": events,
        "lost_reported": lost,
        "workload_s": round(res["elapsed"], 4),
        "delivered_per_s": round(events / span) if span > 0 else None,
    }


def run(stage: Stage, n: int, rounds: int) -> dict[str, Any]:
    log(f"ring buffer: getppid x {n} untraced; with a 64 MiB ring: gfxbpf reader; no reader; "
        "a wake-up per record")  # fmt: skip
    # Rounds interleave the four, each first in turn: a shared machine's load drifts.
    variants: list[dict[str, Any] | None] = [
        None,
        {},
        {"reader": False},
        {"wake_each": 1},
        {"every": PERIODIC_READ_S},
    ]
    got: list[list[dict[str, Any]]] = [[] for _ in variants]
    for i in range(rounds):
        for k in range(len(variants)):
            v = (i + k) % len(variants)
            knobs = variants[v]
            if knobs is None:
                got[v].append({"workload_s": stage.workload("getppid", n)["elapsed"]})
            else:
                got[v].append(_ours(stage, n, 64 << 20, **knobs))
    untraced, big, alone, woken, periodic = got
    base = median([r["workload_s"] for r in untraced])
    best = sorted(big, key=lambda r: r["delivered_per_s"] or 0)[len(big) // 2]
    log("ring buffer: the program's own time per record (kernel.bpf_stats)")
    with bpf_stats_enabled():
        timed = _ours(stage, n, 64 << 20, reader=False)
    log("ring buffer: gfxbpf reader, 256 KiB ring")
    small = _ours(stage, n, 256 << 10)
    log("ring buffer: bpftrace printf (slow: it holds the workload back)")
    peer = _bpftrace(stage, n)
    return {
        "workload": f"getppid x {n}",
        "untraced_s": round(base, 4),
        "gfxbpf": best,
        "gfxbpf_no_reader_s": median([r["workload_s"] for r in alone]),
        "rounds_s": {  # each round's workload time, per variant
            name: [round(r["workload_s"], 4) for r in rs]
            for name, rs in zip(
                ("untraced", "reader", "no_reader", "wake_each", "periodic"), got, strict=True
            )
        },
        "gfxbpf_wake_each": sorted(woken, key=lambda r: r["workload_s"])[len(woken) // 2],
        "gfxbpf_periodic": sorted(periodic, key=lambda r: r["workload_s"])[len(periodic) // 2],
        "periodic_read_s": PERIODIC_READ_S,
        "program_ns_per_record": timed.get("program_ns_per_record"),
        "gfxbpf_small_ring": small,
        "bpftrace": peer,
        "gfxbpf_workload_slowdown": ratio(best["workload_s"], base),
        "bpftrace_workload_slowdown": ratio(peer["workload_s"], base),
        "ratio_events_per_s_vs_bpftrace": ratio(
            best["delivered_per_s"] or 0, peer["delivered_per_s"] or 0
        ),
    }
