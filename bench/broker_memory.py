"""10. Broker memory and the first CO-RE attach (issue #25).

Each round starts a fresh broker (so that its first CO-RE load is this
round's) and reads its VmRSS: idle; while the bench user holds execsnoop's
tp_btf build (CO-RE against the kernel's BTF: the broker's first look at
vmlinux BTF); in the last round also after every catalog program that takes
no parameter was attached once, and with 100 sessions on syscount. The first
attach is timed in the client, from the request to the reply that says it is
attached; the peer is libbpf loading the same object with `bpftool prog
loadall` (a whole process: ELF, vmlinux BTF, CO-RE, maps, every program of
the object verified and pinned, which the broker does not need to do for
the build it leaves out).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from typing import Any

from bench.exporter_scrape import attachable_programs
from bench.harness import BenchError, Stage, log, read_json_line, rss_kib
from bench.procs import stop as stop_process
from bench.stats import median
from gfxbpf.catalog.entries import load_catalog, object_path

CORE_PROGRAM = "execsnoop"  # its tp_btf build: CO-RE and a BTF attach target
BPFFS = "/sys/fs/bpf"


def _restart_broker(stage: Stage) -> int:
    assert stage.broker is not None
    stop_process(stage.broker)
    stage.start_broker()
    time.sleep(1.0)  # start-up finished: imports, policy, listeners
    return rss_kib(stage.broker_pid)


def _attach_each(stage: Stage, programs: list[str]) -> list[dict[str, Any]]:
    """Attach each program once in one session; RSS read while each is held."""
    p = stage.clientside("attach-each", *programs)
    assert p.stdin is not None
    out = []
    try:
        for _ in programs:
            row = read_json_line(p.stdout, p, "attach-each")
            row["rss_kib"] = rss_kib(stage.broker_pid)
            out.append(row)
            p.stdin.write("\n")
            p.stdin.flush()
    finally:
        p.communicate(timeout=120)
    return out


def _libbpf_loadall(obj: str) -> float:
    """Seconds `bpftool prog loadall` (libbpf) takes for obj, as one process."""
    pins = tempfile.mkdtemp(prefix="gfxbench_", dir=BPFFS)
    os.rmdir(pins)  # bpftool creates it
    try:
        t0 = time.perf_counter()
        r = subprocess.run(["bpftool", "prog", "loadall", obj, pins], capture_output=True)
        dt = time.perf_counter() - t0
        if r.returncode != 0:
            raise BenchError(f"bpftool prog loadall {obj} failed: {r.stderr.decode().strip()}")
        return dt
    finally:
        shutil.rmtree(pins, ignore_errors=True)


def run(stage: Stage, rounds: int, sessions: int) -> dict[str, Any]:
    obj = str(object_path(load_catalog().get(CORE_PROGRAM)))
    others = [n for n in attachable_programs() if n != CORE_PROGRAM]
    idle, first_rss, first_s, libbpf_s = [], [], [], []
    catalog: list[dict[str, Any]] = []
    for i in range(rounds):
        log(f"broker memory: round {i + 1}/{rounds}")
        idle.append(_restart_broker(stage))
        last = i == rounds - 1
        rows = _attach_each(stage, [CORE_PROGRAM, *(others if last else [])])
        if "error" in rows[0]:
            raise BenchError(f"{CORE_PROGRAM} did not attach: {rows[0]['error']}")
        first_s.append(rows[0]["attach_s"])
        first_rss.append(rows[0]["rss_kib"])
        if last:
            catalog = rows
        libbpf_s.append(_libbpf_loadall(obj))
    rss_catalog = rss_kib(stage.broker_pid)
    with stage.held("syscount", sessions=sessions):
        rss_sessions = rss_kib(stage.broker_pid)
    first, peer = median(first_s), median(libbpf_s)
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
        "libbpf_loadall_s": libbpf_s,
        "first_core_attach_median_s": round(first, 4),
        "libbpf_loadall_median_s": round(peer, 4),
        "ratio_vs_libbpf": round(first / peer, 2),
    }
