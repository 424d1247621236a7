"""14. Attach latency of the profiling programs: cold (loaded and verified for
this request) and warm (a parked instance of the same user and knobs,
broker/sharing/warm.py), against `bpftool prog loadall` of the same object.

Each round profiles (through the library call take_profile, bench/clientside.py)
one of the bench user's processes (Python, calling
getpid for 5 ms and sleeping 5 ms in turn) with
stackcopy, offcpu and ustackcopy (--stacks-at libc's getpid) with a stack
copy size of that round's own (a knob in the verified program, so the
first profile must load), then another process with the same knobs (which
must find the first one's instance parked). The broker's own figure is its
audit line's elapsed_ms: from the request to the attachment live, policy
and audit included. `profile` (the frame-pointer sampler, counts in the
kernel, no ring) is never parked: every attach loads it.

bpftool's figure is the whole `bpftool prog loadall OBJ DIR` process. It
verifies the object with its default knobs (target_uid = GFX_ANY, the scope
system build these self-only programs refuse at once), so the verifier
prunes nearly everything: it is the floor of a load, not the same work.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

from bench.harness import REPO, BenchError, Stage, bpftool_pins, log
from bench.stats import median

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
# The ProfileRequest of each (client/profiles/engine/request.py), as gfxclient
# profile builds it from --off-cpu, --stacks-at LIBC:getpid and --scope system.
PROGRAMS: dict[str, dict[str, Any]] = {
    "stackcopy": {},
    "offcpu": {"mode": "off-cpu"},
    "ustackcopy": {"library": LIBC, "functions": ["getpid"]},
    "profile": {"scope": "system"},
}
GOALS_MS = {"cold": 400.0, "warm": 100.0}
# Runs and waits in turn, and calls libc's getpid: every program has data.
TARGET = """
import os, time
while True:
    t = time.monotonic()
    while time.monotonic() - t < 0.005:
        os.getpid()
    time.sleep(0.005)
"""


def _attach_ms(stage: Stage, program: str, since: int) -> tuple[float, bool]:
    recs = [
        r
        for r in stage.audit()[since:]
        if r.get("op") == "attach" and r.get("result") == "ok" and r.get("program") == program
    ]
    if len(recs) != 1:
        raise BenchError(f"expected one audited attach of {program}, found {len(recs)}")
    return float(recs[0]["elapsed_ms"]), bool(recs[0].get("warm"))


def _profile(stage: Stage, program: str, pid: int, stack_bytes: int) -> tuple[float, bool]:
    """A 0.3 s profile through the library call (take_profile), as the bench user."""
    since = len(stage.audit())
    spec = {"pids": [], "command": [], "duration": 0.3, **PROGRAMS[program]}
    if program != "profile":
        spec.update(pids=[pid], stack_bytes=stack_bytes)
    stage.clientside_result("profile", json.dumps(spec), timeout=120)
    return _attach_ms(stage, program, since)


def _bpftool_ms(program: str) -> float:
    obj = REPO / "catalog" / "programs" / f"{program}.bpf.o"
    with bpftool_pins() as pins:
        t0 = time.perf_counter()
        r = subprocess.run(["bpftool", "prog", "loadall", str(obj), str(pins)], capture_output=True)
        dt = (time.perf_counter() - t0) * 1000
    if r.returncode != 0:
        raise BenchError(f"bpftool prog loadall {obj} failed: {r.stderr.decode().strip()}")
    return dt


def run(stage: Stage, rounds: int) -> dict[str, Any]:
    sleepers = [stage.as_bench_user(["/usr/bin/python3", "-c", TARGET]) for _ in range(2)]
    times: dict[str, dict[str, list[float]]] = {
        p: {"cold": [], "warm": [], "bpftool": []} for p in PROGRAMS
    }
    warm_seen: dict[str, list[bool]] = {p: [] for p in PROGRAMS}
    try:
        for i in range(rounds):
            log(f"attach latency: round {i + 1}/{rounds}")
            size = 8192 - 64 * (i + 1)  # a knob no earlier round loaded
            for program in PROGRAMS:
                cold, _ = _profile(stage, program, sleepers[0].pid, size)
                warm, was_warm = _profile(stage, program, sleepers[1].pid, size)
                times[program]["cold"].append(cold)
                times[program]["warm"].append(warm)
                warm_seen[program].append(was_warm)
                times[program]["bpftool"].append(_bpftool_ms(program))
    finally:
        for s in sleepers:
            s.kill()
            s.wait()
    return {
        program: {
            "cold_ms": median(t["cold"]),
            "warm_ms": median(t["warm"]),
            "bpftool_ms": median(t["bpftool"]),
            "warm_reused": all(warm_seen[program]),
            "rounds": t,
        }
        for program, t in times.items()
    } | {"goals_ms": GOALS_MS}
