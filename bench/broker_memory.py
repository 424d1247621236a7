"""10. Broker memory and the first CO-RE attach (issue #25).

Each round starts a fresh broker (so that its first CO-RE load is this
round's) and reads its VmRSS: idle; while the bench user holds execsnoop's
tp_btf build (CO-RE against the kernel's BTF); in the last round also after
every catalog program that takes no parameter was attached once, and with
100 sessions on syscount. The first attach is timed in the client, from the
request to the reply that says it is attached, and the broker's CPU time
over it is read from the kernel (every thread's on-CPU time, verification
included); the peer is libbpf loading the same object with `bpftool prog
loadall` (a whole process: ELF, vmlinux BTF, CO-RE, maps, every program of
the object verified and pinned, which the broker does not need to do for
the build it leaves out), wall and CPU time.

The broker indexes vmlinux BTF at start (its live-maps iterator is CO-RE),
so the request does not pay for that; the cold row runs the same load path
in a fresh process (`python -m bench.broker_memory OBJ PROGRAM`, imports
excluded) with vmlinux not indexed yet, phase by phase.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.exporter_scrape import attachable_programs
from bench.harness import REPO, BenchError, Stage, bpftool_pins, log, read_json_line, rss_kib
from bench.procs import stop as stop_process
from bench.stats import median
from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.kernel.vmlinux import kernel_target
from gfxbpf.bpf.loader import load
from gfxbpf.bpf.object import ObjectSpec
from gfxbpf.catalog.entries import load_catalog
from gfxbpf.catalog.objects import object_path

CORE_PROGRAM = "execsnoop"  # its tp_btf build: CO-RE and a BTF attach target
CORE_BUILD = "process_exec_btf"  # the program of that build


def _restart_broker(stage: Stage) -> int:
    assert stage.broker is not None
    stop_process(stage.broker)
    stage.start_broker()
    time.sleep(1.0)  # start-up finished: imports, policy, listeners
    return rss_kib(stage.broker_pid)


def cpu_ns(pid: int) -> int:
    """On-CPU time (ns) of pid's threads, from the scheduler: exact, unlike the
    ticks of /proc/PID/stat (the broker's pool threads live as long as it does)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            total += int(f.read().split()[0])
    return total


def _attach_each(stage: Stage, programs: list[str]) -> list[dict[str, Any]]:
    """Attach each program once in one session; RSS read while each is held, and
    the broker's CPU time over each attach."""
    p = stage.clientside("attach-each", *programs)
    assert p.stdin is not None
    out = []
    try:
        read_json_line(p.stdout, p, "attach-each")  # connected
        for _ in programs:
            before = cpu_ns(stage.broker_pid)
            p.stdin.write("\n")
            p.stdin.flush()
            row = read_json_line(p.stdout, p, "attach-each")
            row["broker_cpu_s"] = (cpu_ns(stage.broker_pid) - before) / 1e9
            row["rss_kib"] = rss_kib(stage.broker_pid)
            out.append(row)
        p.stdin.write("\n")
        p.stdin.flush()
    finally:
        p.communicate(timeout=120)
    return out


def _libbpf_loadall(obj: str) -> tuple[float, float]:
    """(wall s, CPU s) of `bpftool prog loadall` (libbpf) for obj, as one process."""
    with bpftool_pins() as pins, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(["bpftool", "prog", "loadall", obj, str(pins)], stderr=err)
        _, status, usage = os.wait4(p.pid, 0)  # its own CPU time, as the kernel counted it
        dt = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            err.seek(0)
            raise BenchError(f"bpftool prog loadall {obj} failed: {err.read().decode()}")
    return dt, usage.ru_utime + usage.ru_stime


def _cold(stage: Stage, obj: str) -> dict[str, float]:
    argv = [str(stage.venv / "bin/python"), "-m", "bench.broker_memory", obj, CORE_BUILD]
    r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise BenchError(f"the cold load failed: {r.stderr.strip()}")
    return dict(json.loads(r.stdout.splitlines()[-1]))


def run(stage: Stage, rounds: int, sessions: int) -> dict[str, Any]:
    obj = str(object_path(load_catalog().get(CORE_PROGRAM)))
    others = [n for n in attachable_programs() if n != CORE_PROGRAM]
    idle, first_rss, first_s, first_cpu, libbpf_s, libbpf_cpu = [], [], [], [], [], []
    colds: list[dict[str, float]] = []
    catalog: list[dict[str, Any]] = []
    for i in range(rounds):
        log(f"broker memory: round {i + 1}/{rounds}")
        idle.append(_restart_broker(stage))
        last = i == rounds - 1
        rows = _attach_each(stage, [CORE_PROGRAM, *(others if last else [])])
        if "error" in rows[0]:
            raise BenchError(f"{CORE_PROGRAM} did not attach: {rows[0]['error']}")
        first_s.append(rows[0]["attach_s"])
        first_cpu.append(rows[0]["broker_cpu_s"])
        first_rss.append(rows[0]["rss_kib"])
        if last:
            catalog = rows
        wall, cpu = _libbpf_loadall(obj)
        libbpf_s.append(wall)
        libbpf_cpu.append(cpu)
        colds.append(_cold(stage, obj))
    rss_catalog = rss_kib(stage.broker_pid)
    with stage.held("syscount", sessions=sessions):
        rss_sessions = rss_kib(stage.broker_pid)
    first, peer = median(first_s), median(libbpf_s)
    cold = {k: round(median([c[k] for c in colds]), 4) for k in colds[0]}
    return {
        "rounds": rounds,
        "rss_idle_kib": max(idle),
        "rss_first_core_kib": max(first_rss),
        "rss_all_catalog_kib": max([rss_catalog] + [r["rss_kib"] for r in catalog]),
        "catalog_attached": [r["program"] for r in catalog if "error" not in r],
        "catalog_refused": {r["program"]: r["error"] for r in catalog if "error" in r},
        "sessions": sessions,
        "rss_sessions_kib": rss_sessions,
        "first_core_attach_s": first_s,
        "first_core_broker_cpu_s": first_cpu,
        "libbpf_loadall_s": libbpf_s,
        "libbpf_loadall_cpu_s": libbpf_cpu,
        "cold_load": colds,
        "first_core_attach_median_s": round(first, 4),
        "first_core_broker_cpu_median_s": round(median(first_cpu), 4),
        "libbpf_loadall_median_s": round(peer, 4),
        "libbpf_loadall_cpu_median_s": round(median(libbpf_cpu), 4),
        "cold_load_median": cold,
        "ratio_vs_libbpf": round(first / peer, 2),
    }


def cold_load(obj: str, program: str) -> dict[str, float]:
    """In this fresh process (imports done): vmlinux BTF indexed, then obj's
    program loaded as the broker loads it (CO-RE, verified), each timed, wall
    and CPU (system time included: the verifier runs in this process's
    syscall), and the wall time spent inside BPF_BTF_LOAD and BPF_PROG_LOAD."""
    in_kernel = [0.0]

    def timed(fn: Any) -> Any:  # the loader calls these through the module
        def call(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                in_kernel[0] += time.perf_counter() - t

        return call

    bpfsys.btf_load = timed(bpfsys.btf_load)  # type: ignore[assignment]
    bpfsys.prog_load = timed(bpfsys.prog_load)  # type: ignore[assignment]
    w0, c0 = time.perf_counter(), time.process_time()
    kernel_target()
    w1, c1 = time.perf_counter(), time.process_time()
    with load(ObjectSpec.from_file(obj), [program]):
        w2, c2 = time.perf_counter(), time.process_time()
    return {
        "index_s": w1 - w0,
        "index_cpu_s": c1 - c0,
        "load_s": w2 - w1,
        "load_cpu_s": c2 - c1,
        "total_s": w2 - w0,
        "total_cpu_s": c2 - c0,
        "bpf_syscalls_s": in_kernel[0],
    }


if __name__ == "__main__":
    print(json.dumps(cold_load(sys.argv[1], sys.argv[2])))
