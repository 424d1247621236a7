"""bench/'s arithmetic and table, offline (the measurements need root and a kernel)."""

from __future__ import annotations

import pytest

from bench import report
from bench import why as bench_why
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
    assert "| 15.0x faster | ≥ 12x faster | yes |" in text
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


def _rows(text: str) -> dict[str, list[str]]:
    """measure -> the other cells, for every table row."""
    out = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| measure"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            out[cells[0]] = cells[1:]
    return out


def _issue_15_results() -> dict:
    first = {
        "bpftrace_s": 0.47,
        "gfxclient_once_s": 1.2,
        "ratio_once": 2.55,
        "gfxclient_once_interval_0.1_s": 0.2,
        "ratio_once_interval_0.1": 0.425,
        "gfxclient_first_view_s": 0.15,
        "ratio_first_view": 0.319,
        "broker_attach_ms": {k: {"p50": 1.0, "p99": 2.0} for k in ("fresh", "joined")},
        "client_attach_ms": {k: {"p50": 1.0, "p99": 2.0} for k in ("fresh", "joined")},
    }

    def cost(ours: float, bt: float, empty: float) -> dict:
        return {
            "ns_per_event": {"gfxbpf": ours, "bpftrace": bt, "empty": empty},
            "ratio_vs_bpftrace": round(ours / bt, 3),
            "ratio_vs_empty": round(ours / empty, 3),
        }

    maps = {
        "entries": {"fd": 10000},
        "fd_batch_decoded_ms": 8.0,
        "bpftool_dump_ms": 100.0,
        "bpftool_speedup_fd": 12.5,
        "grpc_decoded_ms": 13.0,
        "bpftool_speedup_grpc": 7.7,
        "grpc_vs_fd": 1.625,
        "gfxclient_dump_cmd_ms": 90.0,
        "bpftool_speedup_gfxclient_cmd": 1.111,
        "gfxclient_cmd_vs_bpftool": 0.9,
    }
    ring = {
        "workload": "getppid x 2000000",
        "untraced_s": 0.5,
        "gfxbpf": {"delivered_per_s": 4_100_000, "lost_in_kernel": 0},
        "gfxbpf_small_ring": {"delivered_per_s": 1, "lost_in_kernel": 5},
        "bpftrace": {"delivered_per_s": 86_000, "lost_reported": 0},
        "ratio_events_per_s_vs_bpftrace": 47.7,
        "gfxbpf_workload_slowdown": 1.6,
        "bpftrace_workload_slowdown": 45.0,
    }
    results = {
        "first_data": first,
        "kernel_cost": {
            "syscount": cost(60.0, 300.0, 50.0),
            "execsnoop": cost(900.0, 28000.0, 110.0),
            "clonecount": cost(400.0, 1100.0, 100.0),
        },
        "map_reads": maps,
        "ringbuf": ring,
    }
    return results


def test_issue_15_rows_carry_their_targets() -> None:
    rows = _rows(report.markdown(_doc(_issue_15_results())))
    interval = rows["1 first data: same, `--interval 0.1`"]
    assert interval[-2:] == ["≤ 0.4x", "**no**"]
    assert rows["2 ns per event, syscount vs an empty program (floor)"][-2:] == ["≤ 1.3x", "yes"]
    assert rows["2 ns per event, clonecount vs an empty program (floor)"][-2:] == [
        "≤ 1.5x",
        "**no**",
    ]
    assert rows["2 ns per event, execsnoop vs bpftrace"][-2:] == ["≤ 0.1x", "yes"]
    assert rows["2 ns per event, execsnoop vs an empty program (floor)"][-2:] == ["—", "—"]
    assert rows["4 same, through gRPC ReadMap, vs the fd batch"][-3:] == [
        "1.625x",
        "≤ 1.5x",
        "**no**",
    ]
    whole = "4 whole command: `gfxclient --json dump clonecount counts` vs `bpftool map dump`"
    assert rows[whole][-3:] == ["0.9x", "≤ 1.0x", "yes"]
    events = rows["5 events/s into one Python client (getppid x 2000000), lost"]
    assert events[-2:] == ["≥ 4,000,000 /s, 0 lost", "yes"]
    assert rows["5 workload slowdown (untraced 500 ms)"][-2:] == ["≤ 1.5x", "**no**"]


def test_results_from_before_the_new_rows_still_render() -> None:
    maps = {
        "entries": {"fd": 10000},
        "fd_batch_decoded_ms": 22.5,
        "bpftool_dump_ms": 112.1,
        "bpftool_speedup_fd": 4.981,
        "grpc_decoded_ms": 78.1,
        "bpftool_speedup_grpc": 1.435,
        "gfxclient_dump_cmd_ms": 277.3,
        "bpftool_speedup_gfxclient_cmd": 0.404,
    }
    rows = _rows(report.markdown(_doc({"map_reads": maps})))
    assert rows["4 same, through gRPC ReadMap"][-3:] == ["1.435x faster", "—", "—"]


def _broker_memory(**extra: object) -> dict:
    r = {
        "rss_idle_kib": 47 * 1024,
        "rss_first_core_kib": 50 * 1024,
        "rss_all_catalog_kib": 55 * 1024,
        "rss_sessions_kib": 60 * 1024,
        "catalog_attached": ["execsnoop", "syscount"],
        "sessions": 100,
        "first_core_attach_median_s": 0.040,
        "libbpf_loadall_median_s": 0.020,
        "ratio_vs_libbpf": 2.0,
    }
    return r | extra


def test_broker_memory_rows_carry_cpu_time_and_the_cold_load() -> None:
    cold = {
        "index_s": 0.05,
        "index_cpu_s": 0.02,
        "load_s": 0.03,
        "load_cpu_s": 0.01,
        "total_s": 0.08,
        "total_cpu_s": 0.03,
        "bpf_syscalls_s": 0.001,
    }
    r = _broker_memory(
        first_core_broker_cpu_median_s=0.012,
        libbpf_loadall_cpu_median_s=0.015,
        cold_load_median=cold,
    )
    rows = _rows(report.markdown(_doc({"broker_memory": r})))
    first = rows["10 first CO-RE attach, request → attached (execsnoop tp_btf; CPU: the broker's)"]
    assert first == [
        "40 ms (CPU 12.0 ms)",
        "20 ms (CPU 15.0 ms; bpftool prog loadall)",
        "2.0 (CPU 0.80)",
        "≤ 150 ms, ≤ 3×",
        "yes",
    ]
    cold_row = rows[
        "10 the same load, vmlinux BTF not yet indexed (a fresh process, imports excluded)"
    ]
    assert cold_row[0].startswith("80 ms (CPU 30.0 ms: index 20.0 ms, load 10.0 ms;")
    assert cold_row[2] == "4.00 (CPU 2.00)"
    assert rows["10 broker RSS: idle"][-2:] == ["≤ 50 MiB", "yes"]


def test_broker_memory_rows_from_before_cpu_time_still_render() -> None:
    rows = _rows(report.markdown(_doc({"broker_memory": _broker_memory(ratio_vs_libbpf=3.5)})))
    first = rows["10 first CO-RE attach, request → attached (execsnoop tp_btf)"]
    assert first[-3:] == ["3.5", "≤ 150 ms, ≤ 3×", "**no**"]


def test_lock_rows_give_the_cost_per_contended_operation_or_perfs_error() -> None:
    """bench 16: gfxclient's added time and BPF time per contended operation;
    perf lock contention -b's figure, or its own words where it cannot run."""
    r = {
        "iterations": 1000,
        "untraced_s": 1.0,
        "contended_ops": 2500,
        "gfxbpf_s": 1.2,
        "gfxbpf_slowdown": 1.2,
        "gfxbpf_ns_per_contended_op": 80000.0,
        "gfxbpf_bpf_ns_per_contended_op": 3100.0,
        "perf_unsupported": "Error: switch `b' is not available because no BUILD_BPF_SKEL=1",
    }
    rows = report.SECTIONS["locks"](r)
    assert rows[0][1] == "80000.0 ns (×1.2)" and "BUILD_BPF_SKEL" in rows[0][2], rows
    assert rows[1][1] == "3100.0 ns", rows
    r.update(perf_s=1.1, perf_slowdown=1.1, perf_ns_per_contended_op=40000.0)
    rows = report.SECTIONS["locks"](r)
    assert rows[0][2] == "40000.0 ns (×1.1)" and rows[0][3] == str(ratio(80000.0, 40000.0)), rows


FIXED = {
    "true": {"gfxclient_s": 0.41, "perf_record_s": 1.2, "ratio_vs_perf": 0.342},
    "python3 -c pass": {
        "gfxclient_s": 0.45,
        "perf_record_s": 1.3,
        "ratio_vs_perf": 0.346,
        "pyspy_record_s": 0.4,
        "ratio_vs_pyspy": 1.125,
    },
}


def test_fixed_cost_rows_compare_with_perf_and_py_spy() -> None:
    table = report.markdown(_doc({"fixed_cost": FIXED}))
    rows = [r for r in table.splitlines() if r.startswith("| 15 ")]
    assert len(rows) == 3
    assert rows[0].endswith("| 410.0 ms | 1200.0 ms | 0.342x | ≤ 0.5x | yes |"), rows[0]
    assert "py-spy record" in rows[2] and rows[2].endswith("| ≤ 1.0x | **no** |"), rows[2]
    # The missed goal is explained from the run's own figures.
    assert "- 15 profile of `python3 -c pass` (start to exit): gfxclient vs `py-spy" in table


def test_missing_figures_names_rows_without_one_and_results_that_break_the_table() -> None:
    assert report.missing_figures(_doc({"fixed_cost": FIXED})) == []
    broken = {"true": {"gfxclient_s": 0.4}}  # no perf figure: the row cannot be made
    problems = report.missing_figures(_doc({"fixed_cost": broken, "attach": {"goals_ms": {}}}))
    assert len(problems) == 2, problems
    assert problems[0].startswith("fixed_cost: cannot be formatted (KeyError")
    assert problems[1].startswith("attach: no row")
    # The table still renders, with those rows saying why they hold no figure.
    assert "| fixed_cost: cannot be formatted" in report.markdown(_doc({"fixed_cost": broken}))


def test_a_missed_profile_slowdown_is_weighed_against_the_untraced_rounds() -> None:
    r = {
        "untraced_s": 5.1, "untraced_rounds_s": [5.0, 5.1, 5.3],
        "hz": {"99": {"gfxbpf_s": 5.0, "perf_s": 4.9, "rounds_s": {
            "gfxbpf": [5.0, 5.2, 4.9], "perf": [4.9, 5.0, 4.8], "bpftrace": [5.0, 5.0, 5.0]}}},
    }  # fmt: skip
    why = bench_why._why_profile({}, r, "9 workload slowdown at 99 Hz vs perf record -g")
    assert why is not None and "+100 ms" in why
    assert "untraced [5.0, 5.1, 5.3], gfxclient [5.0, 5.2, 4.9], perf record -g [4.9" in why
    assert "the untraced rounds alone spread over 300 ms, more than the medians'" in why
