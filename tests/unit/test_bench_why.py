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


def _watchers(cpu: bool) -> dict[str, Any]:
    """A watchers section as bench/watchers.py writes it (figures of one run)."""

    def k(n: int, joins: int, s: float) -> dict[str, Any]:
        row = {"gfxbpf_s": s, "bpftrace_s": 2.0 * s, "gfxbpf_slowdown": s / 0.65,
               "bpftrace_slowdown": 3.0, "gfxbpf_vs_one_watcher": s / 0.7,
               "bpftrace_vs_one": 2.0, "ratio_vs_bpftrace": 0.5, "shared_joins_so_far": joins,
               "bpftrace_attached": n, "bpftrace_failed": 0, "bpftrace_failure": None}  # fmt: skip
        if cpu:
            row.update(gfxclient_watchers_cpu_per_s=0.0125 * n, broker_cpu_per_s=0.05)
        return row

    return {"untraced_s": 0.65, "workload": "getppid x 5000000",
            "1": k(1, 0, 0.7), "10": k(10, 9, 0.75), "100": k(100, 108, 0.84)}  # fmt: skip


def test_watchers_say_the_instance_is_shared_and_what_the_clients_used() -> None:
    old = _why("watchers", _watchers(cpu=False), "3 100 watchers vs 1 watcher")
    assert "share one syscount instance" in old and "(108 joins since the first)" in old
    assert "the workload ran 0.8 s against 0.7 s" in old
    assert "CPU-seconds" not in old  # a file without CPU figures: none invented
    new = _why("watchers", _watchers(cpu=True), "3 100 watchers vs 1 watcher")
    assert "used 1.25 CPU-seconds per second" in new and "(12.5 ms each)" in new
    assert "the broker 0.05" in new


def test_execsnoop_names_its_record_and_what_the_goal_leaves() -> None:
    r = copy.deepcopy(_results()["kernel_cost"])
    r["execsnoop"]["ns_per_event"].update(gfxbpf=1624.6, bpftrace=7188.4, empty=209.7)
    r["execsnoop"]["ratio_vs_bpftrace"] = 0.226
    text = _why("kernel_cost", r, "2 ns per event, execsnoop vs bpftrace")
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


def test_clonecount_against_bpftrace_names_both_figures() -> None:
    r = copy.deepcopy(_results()["kernel_cost"])
    r["clonecount"]["ns_per_event"].update(gfxbpf=455.3, bpftrace=402.3)
    r["clonecount"]["ratio_vs_bpftrace"] = 1.132
    text = _why("kernel_cost", r, "2 ns per event, clonecount vs bpftrace")
    assert "455 ns against 402 ns (+53 ns)" in text
