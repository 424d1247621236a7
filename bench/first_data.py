"""1. Time to first data, and the broker's own attach latency.

A cold `gfxclient watch syscount --once --json` (a new process; no syscount
instance running) against bpftrace's syscall-count one-liner with `-c
/bin/true` (plain `-c true` is refused on usrmerged Debian: /bin/true and
/usr/bin/true are two paths to one binary and bpftrace wants a unique one).
--once shows one view after one interval (default 1 s), so the literal
command is dominated by that interval; the same command with --interval
0.1, and the first JSON view of a plain `watch --json` (printed right after
attaching), are measured too.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

from bench.harness import BenchError, Stage, log
from bench.map_reads import python_floor
from bench.stats import median, percentile, ratio

SYSCOUNT_BT = "tracepoint:raw_syscalls:sys_enter { @[args->id] = count(); }"


def _gfxclient_once(stage: Stage, *extra: str) -> float:
    dt, out = stage.timed_gfxclient("--json", "watch", "syscount", "--once", *extra, timeout=60)
    if not json.loads(out.splitlines()[-1])["maps"]:
        raise BenchError("gfxclient watch --once showed no maps")
    return dt


def _gfxclient_first_view(stage: Stage) -> float:
    t0 = time.perf_counter()
    p = stage.gfxclient(
        "--json",
        "watch",
        "syscount",
        "--duration",
        "30",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert p.stdout is not None
    line = p.stdout.readline()
    dt = time.perf_counter() - t0
    p.terminate()
    p.communicate(timeout=30)
    if not line or "maps" not in json.loads(line):
        raise BenchError("gfxclient watch --json printed no view")
    return dt


def _bpftrace_once() -> float:
    t0 = time.perf_counter()
    r = subprocess.run(
        ["bpftrace", "-e", SYSCOUNT_BT, "-c", "/bin/true"], capture_output=True, text=True
    )
    dt = time.perf_counter() - t0
    if r.returncode != 0 or "@[" not in r.stdout:
        raise BenchError(f"bpftrace -c /bin/true failed ({r.returncode}): {r.stderr.strip()}")
    return dt


def run(stage: Stage, rounds: int, attaches: int) -> dict[str, Any]:
    once, short, first, peer, floor = [], [], [], [], []
    for i in range(rounds):  # interleaved, so drift hits both tools alike
        log(f"first data: round {i + 1}/{rounds}")
        once.append(_gfxclient_once(stage))
        short.append(_gfxclient_once(stage, "--interval", "0.1"))
        first.append(_gfxclient_first_view(stage))
        peer.append(_bpftrace_once())
        # What any Python client pays before its first request: the split of the first view.
        floor.append(python_floor(stage))
    log(f"attach latency: {attaches} fresh loads, {attaches} joins")
    seen = len(stage.audit())
    client = stage.clientside_result("attach-latency", "syscount", str(attaches))
    records = [
        r
        for r in stage.audit()[seen:]
        if r.get("op") == "attach" and r.get("result") == "ok" and r.get("program") == "syscount"
    ]
    fresh = [r["elapsed_ms"] for r in records if not r["shared"]]
    joined = [r["elapsed_ms"] for r in records if r["shared"]]
    # attach-latency's holder session adds one fresh load of its own
    if len(fresh) != attaches + 1 or len(joined) != attaches:
        raise BenchError(f"expected {attaches + 1} fresh and {attaches} joined attach records")

    def pct(xs: list[float]) -> dict[str, float]:
        return {"p50": round(percentile(xs, 50), 3), "p99": round(percentile(xs, 99), 3)}

    gfx_once, bt = median(once), median(peer)
    return {
        "gfxclient_once_s": round(gfx_once, 4),
        "gfxclient_once_interval_0.1_s": round(median(short), 4),
        "gfxclient_first_view_s": round(median(first), 4),
        "bpftrace_s": round(bt, 4),
        "python_protobuf_floor_s": round(median(floor), 4),
        "ratio_once": ratio(gfx_once, bt),
        "ratio_once_interval_0.1": ratio(median(short), bt),
        "ratio_first_view": ratio(median(first), bt),
        "rounds": rounds,
        "broker_attach_ms": {"fresh": pct(fresh), "joined": pct(joined)},
        "client_attach_ms": {
            "fresh": pct([x * 1000 for x in client["fresh_s"]]),
            "joined": pct([x * 1000 for x in client["joined_s"]]),
        },
        "attaches": attaches,
    }
