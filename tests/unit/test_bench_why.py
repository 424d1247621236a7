"""bench/why.py: the sentences under "Goals missed, and why" for the rows
that had none (watchers, execsnoop, the gRPC read, the 1 s first view), made
from a results file's own figures."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from bench import report

RESULTS = Path(__file__).parents[2] / "bench/results/2026-11-27.json"


def _results() -> dict[str, Any]:
    return json.loads(RESULTS.read_text())["results"]


def _why(section: str, result: dict[str, Any], start: str) -> str:
    lines = report.missed({"results": {section: result}})
    found = [ln for ln in lines if ln.startswith(start)]
    assert len(found) == 1, lines
    assert "no analysis in this run" not in found[0]
    return found[0]


def test_watchers_say_the_instance_is_shared_and_what_the_clients_used() -> None:
    r = copy.deepcopy(_results()["watchers"])
    old = _why("watchers", r, "3 100 watchers vs 1 watcher")
    assert "share one syscount instance" in old and "(108 joins since the first)" in old
    assert "CPU-seconds" not in old  # that file has no CPU figures: none invented
    r["100"].update(gfxclient_watchers_cpu_per_s=1.25, broker_cpu_per_s=0.05)
    new = _why("watchers", r, "3 100 watchers vs 1 watcher")
    assert "used 1.25 CPU-seconds per second" in new and "(12.5 ms each)" in new
    assert "the broker 0.05" in new


def test_execsnoop_names_its_record_and_what_the_goal_leaves() -> None:
    text = _why("kernel_cost", _results()["kernel_cost"], "2 ns per event, execsnoop vs bpftrace")
    assert "1415 ns per exec over the empty program's 210 ns" in text
    assert "a 288-byte record" in text and "0.1x bpftrace is 719 ns" in text


def test_the_grpc_read_is_the_same_read_plus_the_broker_and_the_wire() -> None:
    doc = json.loads((RESULTS.parent / "2026-11-27-map_reads.json").read_text())
    r = doc["results"]["map_reads"]
    text = _why("map_reads", r, "4 same, through gRPC ReadMap")
    more, allowed = r["grpc_decoded_ms"] - r["fd_batch_decoded_ms"], 0.5 * r["fd_batch_decoded_ms"]
    assert f"{more:.1f} ms more, where 1.5x allows {allowed:.1f} ms" in text


def test_the_literal_first_view_waits_its_one_second_interval() -> None:
    r = _results()["first_data"]
    text = _why("first_data", r, "1 first data: `gfxclient watch syscount --once --json` (1 s")
    assert f"{1.0 / r['bpftrace_s']:.1f}x bpftrace's" in text
