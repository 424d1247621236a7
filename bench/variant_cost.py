"""tp_btf + CO-RE builds against tracefs builds: per-event cost, A/B.

Run as root: python3 -m bench.variant_cost [--json]. Not a bench/run row
(it compares two builds of gfxbpf's own programs, not gfxbpf with a peer).

1. execsnoop's two catalog builds (variants `btf` and `tracefs`), each
   loaded alone in turn, system-wide, its ring drained; /bin/true execs.
2. bench/readcost.bpf.c: the same two sys_enter values read at format-file
   offsets (tracepoint) or through typed arguments (tp_btf); getppid calls,
   plus the wall time per call, which also counts what the kernel does
   before the program runs (a tracepoint program gets a perf record built
   for it, a tp_btf program its raw arguments), and a baseline with none.

Run time per event is the kernel's run_time_ns / run_cnt (BPF_ENABLE_STATS:
on while its fd is open, no sysctl changed). Rounds alternate the order;
figures are medians.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.stats import median
from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.kernel import vmlinux as kernel_btf
from gfxbpf.bpf.link import attach, tracing
from gfxbpf.bpf.loader import load
from gfxbpf.bpf.object import ObjectSpec
from gfxbpf.bpf.ringbuf import RingBuffer
from gfxbpf.catalog import instance
from gfxbpf.catalog.entries import load_catalog
from gfxbpf.catalog.objects import read_object

READCOST = Path(__file__).with_name("readcost.bpf.o")


def _exec_true(n: int) -> None:
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            try:
                os.execv("/bin/true", ["true"])
            finally:
                os._exit(127)
        os.waitpid(pid, 0)


def _getppid(n: int) -> float:
    """Wall ns per getppid() call."""
    t = time.perf_counter_ns()
    for _ in range(n):
        os.getppid()
    return (time.perf_counter_ns() - t) / n


def _per_event(fd: int, work: Callable[[], Any]) -> tuple[float, Any]:
    before = bpfsys.prog_info(fd)
    out = work()
    after = bpfsys.prog_info(fd)
    runs = after.run_cnt - before.run_cnt
    if runs <= 0:
        raise RuntimeError("the program did not run during the workload")
    return (after.run_time_ns - before.run_time_ns) / runs, out


def execsnoop_round(variant: str, execs: int) -> float:
    """ns per event of one execsnoop build over `execs` execs."""
    entry = load_catalog().get("execsnoop")
    real = kernel_btf.tp_btf_target_exists
    if variant == "tracefs":  # choose the build a kernel without BTF gets
        kernel_btf.tp_btf_target_exists = lambda _name: False  # type: ignore[assignment]
    try:
        with instance.start(entry, read_object(entry), instance.Params()) as inst:
            assert inst.variant == variant, inst.variant
            prog = next(iter(inst.obj.programs.values()))
            stop = threading.Event()

            def drain() -> None:  # a consumer, as a client would run
                with RingBuffer(os.dup(inst.obj.map("events").fileno()), owns_fd=True) as rb:
                    while not stop.is_set():
                        rb.poll(0.1)

            t = threading.Thread(target=drain)
            t.start()
            try:
                ns, _ = _per_event(prog.fd, lambda: _exec_true(execs))
            finally:
                stop.set()
                t.join()
            return ns
    finally:
        kernel_btf.tp_btf_target_exists = real  # type: ignore[assignment]


def readcost_round(program: str | None, calls: int) -> tuple[float | None, float]:
    """(ns per event, wall ns per getppid) with one readcost program, or none."""
    if program is None:
        return None, _getppid(calls)
    spec = ObjectSpec.from_file(str(READCOST))
    spec.set_variable("target_tgid", os.getpid())
    with load(spec, programs=[program]) as obj:
        fd = obj.programs[program].fd
        if program == "knob_reads":
            att: attach.Attachment = attach.attach_tracepoint(fd, "raw_syscalls", "sys_enter")
        else:
            att = tracing.attach_btf_traced(fd, "tp_btf sys_enter")
        with att:
            ns, wall = _per_event(fd, lambda: _getppid(calls))
        if sum(v for _, v in obj.map("sums").read()) < calls:
            raise RuntimeError(f"{program} missed calls")
        return ns, wall


def run(rounds: int, execs: int, calls: int) -> dict[str, Any]:
    exec_ns: dict[str, list[float]] = {"btf": [], "tracefs": []}
    read_ns: dict[str, list[float]] = {"knob_reads": [], "typed_reads": []}
    wall: dict[str, list[float]] = {"knob_reads": [], "typed_reads": [], "none": []}
    stats_fd = bpfsys.enable_stats()
    try:
        for i in range(rounds):
            flip = -1 if i % 2 else 1
            for v in ("btf", "tracefs")[::flip]:
                exec_ns[v].append(execsnoop_round(v, execs))
            for p in ("knob_reads", "typed_reads", None)[::flip]:
                ns, w = readcost_round(p, calls)
                wall[p or "none"].append(w)
                if p is not None and ns is not None:
                    read_ns[p].append(ns)
    finally:
        os.close(stats_fd)

    def fig(xs: list[float]) -> dict[str, float]:
        return {"median": round(median(xs), 1), "min": round(min(xs), 1), "max": round(max(xs), 1)}

    return {
        "rounds": rounds,
        "execsnoop_ns_per_event": {k: fig(v) for k, v in exec_ns.items()},
        "execsnoop_workload": f"/bin/true x {execs}",
        "sys_enter_ns_per_event": {k: fig(v) for k, v in read_ns.items()},
        "getppid_wall_ns_per_call": {k: fig(v) for k, v in wall.items()},
        "sys_enter_workload": f"getppid x {calls}",
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python3 -m bench.variant_cost",
        description="Per-event cost of tp_btf+CO-RE builds vs tracefs builds (run as root).",
    )
    ap.add_argument("--rounds", type=int, default=6, help="A/B rounds (default 6)")
    ap.add_argument("--execs", type=int, default=600, help="execs per execsnoop round")
    ap.add_argument("--calls", type=int, default=500_000, help="getppid calls per round")
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        ap.error("run as root: it loads BPF programs and enables BPF run-time stats")
    out = run(args.rounds, args.execs, args.calls)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for key in ("execsnoop_ns_per_event", "sys_enter_ns_per_event", "getppid_wall_ns_per_call"):
        for name, f in out[key].items():
            print(f"{key:26} {name:12} median {f['median']:9.1f}  ({f['min']}-{f['max']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
