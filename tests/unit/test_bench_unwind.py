"""bench/unwind_profile.py's parsing and arithmetic, and its rows in the table, offline
(the measurement itself needs root, a broker and perf)."""

from __future__ import annotations

from typing import Any

import pytest

from bench import report
from bench.harness import BenchError
from bench.unwind_profile import (
    bpf_cost,
    busiest_new,
    collapse_perf_script,
    completeness,
    elapsed_of,
    holds,
    parse_folded,
    starts,
)

# `perf script -F comm,ip,sym` of three samples: two of xz (one reaching
# __libc_start_main, one cut short), one of another process.
PERF_SCRIPT = """xz
\tffffffff821ef666 do_syscall_64
\t           9945 [unknown]
\t          27249 __libc_start_call_main
\t          27304 __libc_start_main_impl (inlined)

xz
\t           4ca7 lzma_code
\t           55eb

timeit
\t          1a34e _dl_sysdep_start
"""


def test_perf_script_is_folded_root_first_with_the_comm_as_root() -> None:
    stacks = collapse_perf_script(PERF_SCRIPT)
    assert stacks == {
        ("xz", "__libc_start_main_impl (inlined)", "__libc_start_call_main", "[unknown]",
         "do_syscall_64"): 1,
        ("xz", "[unknown]", "lzma_code"): 1,
        ("timeit", "_dl_sysdep_start"): 1,
    }  # fmt: skip
    share, n = completeness(stacks, "xz", starts("__libc_start_main"))
    assert (share, n) == (0.5, 2)  # timeit's sample is not xz's


def test_folded_lines_add_up_and_completeness_counts_weights() -> None:
    text = "chain;main;chain_a 30\nchain;[unwind stopped: no CFI];x 10\nchain;main 0\n"
    stacks = parse_folded(text)
    assert stacks[("chain", "main", "chain_a")] == 30
    assert completeness(stacks, "chain", holds("main")) == (0.75, 40)
    assert completeness(stacks, "xz", holds("main")) == (None, 0)


def test_the_launchers_timing_line_is_found_among_other_output() -> None:
    err = "perf: some warning\nUNWIND_ELAPSED 2.500000 2.250000\n"
    assert elapsed_of(err) == (2.5, 2.25)
    with pytest.raises(BenchError):
        elapsed_of("no timing here\n")


def test_bpf_cost_is_the_profiles_busiest_program() -> None:
    ran = {1: (100, 4000), 7: (4000, 8_000_000), 8: (3, 900)}  # 7: sampler, 8: fork hook
    runs = busiest_new(ran)
    assert runs == (4000, 8_000_000)
    cost = bpf_cost(runs, recorded=1000)
    assert cost == {"runs": 4000, "ns_per_run": 2000.0, "ns_per_recorded_sample": 8000.0}
    assert bpf_cost((0, 0), 0) == {"runs": 0, "ns_per_run": None, "ns_per_recorded_sample": None}
    with pytest.raises(BenchError):
        busiest_new({})


def _tool(complete: float, s: float, slowdown: float) -> dict[str, Any]:
    times = {"s": s, "slowdown": slowdown, "cpu_s": s, "cpu_slowdown": slowdown, "tool_cpu_s": 0.4}
    return {"complete": complete, "samples": 2000, "output_s": 0.01, "script_fold_s": 0.3, **times}


def _cell(gfx_s: float) -> dict[str, Any]:
    return {
        "gfxclient": _tool(0.999, gfx_s, gfx_s / 2),
        "perf_dwarf": _tool(1.0, 2.2, 1.1),
        "perf_fp": _tool(0.0, 2.1, 1.05),
        "bpf": {"runs": 8000, "ns_per_run": 1200.0, "ns_per_recorded_sample": 4500.0},
        "map_bytes": {"stack_copies": 2 << 20, "copy_scratch": 40 << 10},
    }


def test_the_unwind_rows_say_what_was_met() -> None:
    workload = {
        "untraced_s": 2.0,
        "hz": {"99": _cell(2.0), "999": _cell(2.6)},
        "flamegraph": {"hz": 999, "gfxclient_svg_s": 0.012, "perf_script_fold_s": 0.3,
                       "ratio_vs_perf": 0.04},
    }  # fmt: skip
    lib = {"path": "/usr/lib/libbig.so", "file_mb": 117.3, "eh_frame_mb": 5.2, "fdes": 98256,
           "table_mb": 6.7, "first_parse_s": 1.25, "cached_load_s": 0.013}  # fmt: skip
    rows = report.SECTIONS["unwind"]({"workloads": {"xz": workload}, "largest_library": lib})
    text = "\n".join(" | ".join(r) for r in rows)
    reach = "11 xz: samples reaching main at 999 Hz (2000 samples) | 99.9% | perf dwarf 100.0%"
    assert reach in text
    at = {r[0].split(" (")[0]: r for r in rows}
    assert at["11 xz: workload at 99 Hz"][5] == "yes"  # 2.0 s against perf dwarf's 2.2 s
    assert at["11 xz: workload at 999 Hz"][5] == "**no**"  # 2.6 s against 2.2 s
    assert "client CPU 400 ms" in at["11 xz: workload at 99 Hz"][1]
    assert at["11 xz: end of sampling → flame graph at 999 Hz"][5] == "yes"
    assert "4.5 µs" in at["11 xz: BPF time per sample at 999 Hz"][1]
    assert "2.04 MiB" in at["11 kernel memory of stackcopy's maps"][1]
    assert "first parse 1250 ms, cached 13 ms" in text and "table 6.7 MB" in text


def _with_rounds(cell: dict[str, Any], rounds: dict[str, list[float]]) -> dict[str, Any]:
    cpu = {"untraced": 0.0, "gfxclient": 0.5, "perf_dwarf": 0.3, "perf_fp": 0.1}
    cell["rounds"] = {t: {"s": s, "tool_cpu_s": [cpu[t]] * len(s)} for t, s in rounds.items()}
    return cell


def test_a_missed_slowdown_is_weighed_against_the_untraced_rounds_spread() -> None:
    flame = {"hz": 999, "gfxclient_svg_s": 0.01, "perf_script_fold_s": 0.3, "ratio_vs_perf": 0.03}
    noisy = {"untraced": [2.0, 2.3, 2.1], "gfxclient": [2.3, 2.2, 2.4],
             "perf_dwarf": [2.2, 2.2, 2.1], "perf_fp": [2.1, 2.1, 2.1]}  # fmt: skip
    steady = {**noisy, "untraced": [2.0, 2.01, 2.0], "gfxclient": [2.6, 2.6, 2.55]}
    workloads = {
        "xz": {"untraced_s": 2.0, "flamegraph": flame,
               "hz": {"99": _cell(2.0), "999": _with_rounds(_cell(2.3), noisy)}},
        "chain": {"untraced_s": 2.0, "flamegraph": flame,
                  "hz": {"99": _cell(2.0), "999": _with_rounds(_cell(2.6), steady)}},
    }  # fmt: skip
    why = report.missed({"results": {"unwind": {"workloads": workloads, "largest_library": {}}}})
    xz, chain = why
    assert xz.startswith("11 xz: workload at 999 Hz") and "+100 ms" in xz
    assert "the untraced rounds alone spread over 300 ms, more than the medians' difference" in xz
    assert "the client used [0.5, 0.5, 0.5] s of CPU per round" in xz
    assert chain.startswith("11 chain: workload at 999 Hz") and "+400 ms" in chain
    assert "the perf dwarf rounds alone spread over 100 ms, less than the medians'" in chain
