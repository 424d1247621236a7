"""bench/'s arithmetic and table, offline (the measurements need root and a kernel)."""

from __future__ import annotations

import pytest

from bench import report
from bench.stats import median, percentile, ratio


def test_percentiles_interpolate_between_ranks() -> None:
    xs = [float(x) for x in range(1, 101)]
    assert percentile(xs, 50) == pytest.approx(50.5)
    assert percentile(xs, 99) == pytest.approx(99.01)
    assert percentile([3.0], 99) == 3.0
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert ratio(1.0, 4.0) == 0.25 and ratio(1.0, 0.0) is None
    with pytest.raises(ValueError):
        percentile([], 50)


def _doc(results: dict) -> dict:
    machine = {
        "kernel": "6.18",
        "cpus": 2,
        "cpu": "cpu",
        "memory_gib": 24,
        "gfxbpf": "0.1.0",
        "commit": "abc",
        "bpftrace": "bpftrace v0.17.0",
        "bpftool": "bpftool v7.1.0",
        "python": "3.11",
    }
    return {
        "date": "2026-11-21",
        "args": [],
        "elapsed_s": 1.0,
        "machine": machine,
        "results": results,
        "notes": ["a note"],
    }


def test_table_rows_say_whether_targets_are_met() -> None:
    cost = {
        "ns_per_event": {"gfxbpf": 70.0, "bpftrace": 80.0, "empty": 50.0},
        "ratio_vs_bpftrace": 0.875,
        "ratio_vs_empty": 1.4,
    }
    maps = {
        "entries": {"fd": 10000},
        "fd_batch_decoded_ms": 2.0,
        "bpftool_dump_ms": 30.0,
        "bpftool_speedup_fd": 15.0,
        "grpc_decoded_ms": 20.0,
        "bpftool_speedup_grpc": 1.5,
        "gfxclient_dump_cmd_ms": 300.0,
        "bpftool_speedup_gfxclient_cmd": 0.1,
    }
    text = report.markdown(_doc({"kernel_cost": {"syscount": cost}, "map_reads": maps}))
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| 2")}
    assert rows["| 2 ns per event, syscount vs bpftrace"].endswith("| yes |")
    assert rows["| 2 ns per event, syscount vs an empty program (floor)"].endswith("| **no** |")
    assert "| 15.0x faster | ≥ 10x faster | yes |" in text
    assert "- a note" in text and "watchers" not in text  # only what ran is shown


def test_cuda_rows_hold_attach_and_probe_cost() -> None:
    r = {
        "library_bytes": 71_000_000,
        "dynsym_functions": 30041,
        "index_ms": 34.0,
        "pyelftools_dynsym_ms": 644.0,
        "ratio_index": 0.053,
        "first_attach_ms": 48.0,
        "second_attach_ms": 60.5,
        "second_attach_max_ms": 70.0,
        "launch": {"untraced_ns": 3.0, "traced_ns": 1703.0, "added_ns": 1700.0},
    }
    text = report.markdown(_doc({"cuda": r}))
    rows = [line for line in text.splitlines() if line.startswith("| 7 cuda")]
    assert len(rows) == 4
    assert "71 MB, 30041 functions" in rows[0] and "| 34 ms | 644 ms | 0.053x |" in rows[0]
    assert rows[2].endswith("| ≤ 50 ms | **no** |")  # 60.5 ms misses the target
    assert "+1700 ns (3 → 1703 ns)" in rows[3]


def test_exporter_rows() -> None:
    exporter = {
        "programs": {"syscount": True, "vmabind": False},
        "comms": 2000,
        "series": 2100,
        "bytes": 200_000,
        "scrapes": 20,
        "scrape_ms": {"p50": 80.0, "p99": 1200.0},
        "read_ms_last": 70.0,
        "cpu_ms_per_scrape": 75.0,
        "rss_idle_kib": 30 * 1024,
        "rss_kib": 40 * 1024,
    }
    text = report.markdown(_doc({"exporter": exporter}))
    (scrape,) = [ln for ln in text.splitlines() if ln.startswith("| 8 exporter scrape")]
    assert "(syscount attached;" in scrape and scrape.endswith("| p99 < 1 s | **no** |")
    assert "| 8 exporter RSS, idle → after the scrapes | 30.0 → 40.0 MiB |" in text
