"""4. Reading a 10,000-entry hash map: fd batch, gRPC, `bpftool map dump`.

The map is clonecount's `counts`, filled by real events: the workload forks
10,000 times, each time under a new command name. The bench user's client
reads it decoded (BTF -> dicts) through its read-only fd with batch lookups,
and through the broker's gRPC ReadMap; root runs `bpftool map dump` on the
same map. Whole commands are timed too: `gfxclient dump` (a new Python
process that attaches, reads, prints) against bpftool, `gfxclient dump
--help`, its start alone, a Python that only loads the protobuf messages
of the broker's wire, the floor of any Python client, and Python's bare start.
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


def python_floor(stage: Stage, code: str = "import gfxbpf.proto.gfxbpf_pb2") -> float:
    """Seconds of the venv's Python running code, as the bench user. The default
    only loads the protobuf runtime and the session's messages (gfxbpf_pb2):
    the floor under any command of a Python client that speaks the broker's
    wire; "pass" is Python's own start."""
    argv = [str(stage.venv / "bin/python"), "-c", code]
    t0 = time.perf_counter()
    p = stage.as_bench_user(argv, stdout=subprocess.DEVNULL)
    if p.wait(timeout=120) != 0:
        raise BenchError(f"python -c {code!r} failed")
    return time.perf_counter() - t0


def run(stage: Stage, entries: int, rounds: int) -> dict[str, Any]:
    client = stage.clientside("mapread", "clonecount", "counts", str(rounds))
    reads: list[dict[str, Any]] = []
    try:
        ready = read_json_line(client.stdout, client, "mapread")
        log(f"map reads: filling clonecount with {entries} command names")
        stage.workload("comms", entries)
        map_id = ready["map_id"]
        # Each round runs every reader once, one after the other: on a shared
        # machine the load moves between rounds, not between the two sides.
        log("map reads: bpftool map dump, gfxclient dump, the client library (fd, gRPC)")
        plain, as_json, cmd, start, floor, bare = [], [], [], [], [], []
        assert client.stdin is not None
        for _ in range(rounds):
            plain.append(_bpftool_dump(map_id))
            client.stdin.write("go\n")
            client.stdin.flush()
            reads.append(read_json_line(client.stdout, client, "mapread"))
            as_json.append(_bpftool_dump(map_id, "--json"))
            cmd.append(_gfxclient_dump(stage))
            # Its start alone: Python, the imports of dump, the parser; no work.
            start.append(stage.timed_gfxclient("dump", "--help")[0])
            floor.append(python_floor(stage))
            bare.append(python_floor(stage, "pass"))
    finally:
        client.communicate(timeout=120)
    res = {k: [r[k] for r in reads] for k in reads[-1]}
    if min(n for _, n in cmd) < min(res["entries_fd"]):
        raise BenchError(f"gfxclient dump read fewer rows than the fd client: {cmd}")
    fd = median(res["fd_decoded_s"])
    bt = median([t for t, _ in plain])
    return {
        "entries": {
            "fd": res["entries_fd"][-1],
            "grpc": res["entries_grpc"][-1],
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
        "python_protobuf_floor_ms": round(median(floor) * 1000, 2),
        "python_start_ms": round(median(bare) * 1000, 2),
        "bpftool_speedup_fd": ratio(bt, fd),
        "bpftool_speedup_grpc": ratio(bt, median(res["grpc_decoded_s"])),
        "bpftool_speedup_gfxclient_cmd": ratio(bt, median([t for t, _ in cmd])),
        "grpc_vs_fd": ratio(median(res["grpc_decoded_s"]), fd),
        "gfxclient_cmd_vs_bpftool": ratio(median([t for t, _ in cmd]), bt),
        "rounds": rounds,
    }
