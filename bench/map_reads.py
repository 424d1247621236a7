"""4. Reading a 10,000-entry hash map: fd batch, gRPC, `bpftool map dump`.

The map is clonecount's `counts`, filled by real events: the workload forks
10,000 times, each time under a new command name. The bench user's client
reads it decoded (BTF -> dicts) through its read-only fd with batch lookups,
and through the broker's gRPC ReadMap; root runs `bpftool map dump` on the
same map. Whole commands are timed too: `gfxclient dump` (a new Python
process that attaches, reads, prints) against bpftool, and `gfxclient dump
--help`, its start alone.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

from bench.harness import BenchError, Stage, log, read_json_line
from bench.stats import median, ratio


def _bpftool_dump(map_id: int, *flags: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    r = subprocess.run(
        ["bpftool", *flags, "map", "dump", "id", str(map_id)], capture_output=True, text=True
    )
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise BenchError(f"bpftool map dump failed: {r.stderr.strip()}")
    entries = len(json.loads(r.stdout)) if flags else r.stdout.count('"key":')
    return dt, entries


def _gfxclient_dump(stage: Stage) -> tuple[float, int]:
    dt, out = stage.timed_gfxclient("--json", "dump", "clonecount", "counts")
    data = json.loads(out)
    return dt, len(data["maps"]["counts"]["entries"])


def run(stage: Stage, entries: int, rounds: int) -> dict[str, Any]:
    client = stage.clientside("mapread", "clonecount", "counts", str(rounds))
    try:
        ready = read_json_line(client.stdout, client, "mapread")
        log(f"map reads: filling clonecount with {entries} command names")
        stage.workload("comms", entries)
        map_id = ready["map_id"]
        log("map reads: bpftool map dump")
        plain = [_bpftool_dump(map_id) for _ in range(rounds)]
        as_json = [_bpftool_dump(map_id, "--json") for _ in range(rounds)]
        log("map reads: gfxclient dump")
        cmd = [_gfxclient_dump(stage) for _ in range(rounds)]
        # Its start alone: Python, the imports of dump, the parser; no work.
        start = [stage.timed_gfxclient("dump", "--help")[0] for _ in range(rounds)]
        log("map reads: client library, fd and gRPC")
        assert client.stdin is not None
        client.stdin.write("go\n")
        client.stdin.flush()
        res = read_json_line(client.stdout, client, "mapread")
    finally:
        client.communicate(timeout=120)
    fd = median(res["fd_decoded_s"])
    bt = median([t for t, _ in plain])
    return {
        "entries": {
            "fd": res["entries_fd"],
            "grpc": res["entries_grpc"],
            "bpftool": plain[-1][1],
            "gfxclient_dump": cmd[-1][1],
        },
        "fd_batch_decoded_ms": round(fd * 1000, 2),
        "fd_batch_raw_ms": round(median(res["fd_raw_s"]) * 1000, 2),
        "grpc_decoded_ms": round(median(res["grpc_decoded_s"]) * 1000, 2),
        "bpftool_dump_ms": round(bt * 1000, 2),
        "bpftool_json_dump_ms": round(median([t for t, _ in as_json]) * 1000, 2),
        "gfxclient_dump_cmd_ms": round(median([t for t, _ in cmd]) * 1000, 2),
        "gfxclient_start_ms": round(median(start) * 1000, 2),
        "bpftool_speedup_fd": ratio(bt, fd),
        "bpftool_speedup_grpc": ratio(bt, median(res["grpc_decoded_s"])),
        "bpftool_speedup_gfxclient_cmd": ratio(bt, median([t for t, _ in cmd])),
        "grpc_vs_fd": ratio(median(res["grpc_decoded_s"]), fd),
        "gfxclient_cmd_vs_bpftool": ratio(median([t for t, _ in cmd]), bt),
        "rounds": rounds,
    }
