"""The results as a markdown table: figures, the peer's, ratios, targets."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from bench.stats import ratio

Row = tuple[str, str, str, str, str, str]  # measure, gfxbpf, peer, ratio, target, met

# Targets of issue #15 (ratios: gfxbpf / peer, at most this; None: no target).
FIRST_DATA_TARGETS = {"ratio_once_interval_0.1": 0.4}  # the other rows: 0.5x
KERNEL_COST_TARGETS: dict[str, dict[str, float | None]] = {
    "syscount": {"bpftrace": 1.0, "empty": 1.3},
    "clonecount": {"bpftrace": 1.0, "empty": 1.5},
    # It copies a comm and a 256-byte filename per event: the floor row shows
    # where the time goes, the target is against bpftrace.
    "execsnoop": {"bpftrace": 0.1, "empty": None},
}


def _met(value: float | None, ok: Callable[[float], bool]) -> str:
    if value is None:
        return "—"
    return "yes" if ok(value) else "**no**"


def _s(x: float) -> str:
    return f"{x * 1000:.0f} ms" if x < 10 else f"{x:.1f} s"


def _first_data(r: dict[str, Any]) -> list[Row]:
    bt = _s(r["bpftrace_s"])
    variants = (
        (
            "`gfxclient watch syscount --once --json` (1 s interval) vs bpftrace `-c /bin/true`",
            "gfxclient_once_s",
            "ratio_once",
        ),
        ("same, `--interval 0.1`", "gfxclient_once_interval_0.1_s", "ratio_once_interval_0.1"),
        (
            "first view of `gfxclient watch syscount --json`",
            "gfxclient_first_view_s",
            "ratio_first_view",
        ),
    )
    rows: list[Row] = []
    for label, seconds, ratio_key in variants:
        if seconds not in r:
            continue  # a results file from before the row existed
        goal = FIRST_DATA_TARGETS.get(ratio_key, 0.5)
        rows.append(
            (
                f"1 first data: {label}",
                _s(r[seconds]),
                bt,
                f"{r[ratio_key]}x",
                f"≤ {goal}x",
                _met(r[ratio_key], lambda v, goal=goal: v <= goal),
            )
        )
    for kind in ("fresh", "joined"):
        b, c = r["broker_attach_ms"][kind], r["client_attach_ms"][kind]
        rows.append(
            (
                f"1 attach latency, {kind} (in the broker; client round trip in brackets)",
                f"p50 {b['p50']:.2f} ms, p99 {b['p99']:.2f} ms "
                f"[{c['p50']:.2f} / {c['p99']:.2f} ms]",
                "—",
                "—",
                "—",
                "—",
            )
        )
    return rows


def _target(goal: float | None, value: float | None) -> tuple[str, str]:
    """(target cell, met cell) for a ratio that should stay at or under goal."""
    if goal is None:
        return "—", "—"
    return f"≤ {goal}x", _met(value, lambda v: v <= goal)


def _kernel_cost(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for name, c in r.items():
        ns = c["ns_per_event"]
        goals = KERNEL_COST_TARGETS.get(name, {"bpftrace": 1.0, "empty": 1.2})
        rows.append(
            (
                f"2 ns per event, {name} vs bpftrace",
                f"{ns['gfxbpf']:.1f} ns",
                f"{ns['bpftrace']:.1f} ns",
                f"{c['ratio_vs_bpftrace']}x",
                *_target(goals["bpftrace"], c["ratio_vs_bpftrace"]),
            )
        )
        rows.append(
            (
                f"2 ns per event, {name} vs an empty program (floor)",
                f"{ns['gfxbpf']:.1f} ns",
                f"{ns['empty']:.1f} ns",
                f"{c['ratio_vs_empty']}x",
                *_target(goals["empty"], c["ratio_vs_empty"]),
            )
        )
    return rows


def _attached(w: dict[str, Any], k: str) -> str:
    if not w.get("bpftrace_failed"):
        return ""
    return f"; only {w['bpftrace_attached']} of {k} could attach: {w['bpftrace_failure']}"


def _watchers(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    counts = [k for k in r if k.isdigit()]
    for k in counts:
        w = r[k]
        rows.append(
            (
                f"3 {r['workload']} under {k} watcher(s) (untraced {_s(r['untraced_s'])})",
                f"{_s(w['gfxbpf_s'])} ({w['gfxbpf_slowdown']}x)",
                f"{_s(w['bpftrace_s'])} ({w['bpftrace_slowdown']}x)" + _attached(w, k),
                f"{w['ratio_vs_bpftrace']}x",
                "—",
                "—",
            )
        )
    if len(counts) > 1:
        last = r[counts[-1]]
        rows.append(
            (
                f"3 {counts[-1]} watchers vs 1 watcher",
                f"{last['gfxbpf_vs_one_watcher']}x",
                f"{last['bpftrace_vs_one']}x",
                "—",
                "≤ 1.1x",
                _met(last["gfxbpf_vs_one_watcher"], lambda v: v <= 1.1),
            )
        )
    return rows


def _map_reads(r: dict[str, Any]) -> list[Row]:
    n = r["entries"]["fd"]
    bt = f"{r['bpftool_dump_ms']:.1f} ms"
    fd = f"{r['fd_batch_decoded_ms']:.1f} ms"
    rows: list[Row] = [
        (
            f"4 read {n} entries, decoded: fd batch vs `bpftool map dump`",
            fd,
            bt,
            f"{r['bpftool_speedup_fd']}x faster",
            "≥ 12x faster",
            _met(r["bpftool_speedup_fd"], lambda v: v >= 12),
        ),
    ]
    if "grpc_vs_fd" in r:
        rows.append(
            (
                "4 same, through gRPC ReadMap, vs the fd batch",
                f"{r['grpc_decoded_ms']:.1f} ms",
                fd,
                f"{r['grpc_vs_fd']}x",
                *_target(1.5, r["grpc_vs_fd"]),
            )
        )
    else:  # a results file from before the row existed
        rows.append(
            (
                "4 same, through gRPC ReadMap",
                f"{r['grpc_decoded_ms']:.1f} ms",
                bt,
                f"{r['bpftool_speedup_grpc']}x faster",
                "—",
                "—",
            )
        )
    cmd = r.get("gfxclient_cmd_vs_bpftool")
    rows.append(
        (
            "4 whole command: `gfxclient --json dump clonecount counts` vs `bpftool map dump`",
            f"{r['gfxclient_dump_cmd_ms']:.1f} ms",
            bt,
            f"{cmd}x" if cmd is not None else f"{r['bpftool_speedup_gfxclient_cmd']}x faster",
            *(_target(1.0, cmd) if cmd is not None else ("—", "—")),
        )
    )
    return rows


def _ringbuf(r: dict[str, Any]) -> list[Row]:
    g, s, b = r["gfxbpf"], r["gfxbpf_small_ring"], r["bpftrace"]
    rate = g["delivered_per_s"] or 0
    return [
        (
            f"5 events/s into one Python client ({r['workload']}), lost",
            f"{rate:,} /s, {g['lost_in_kernel']} lost",
            f"{b['delivered_per_s'] or 0:,} /s, {b['lost_reported']} lost",
            f"{r['ratio_events_per_s_vs_bpftrace']}x",
            "≥ 4,000,000 /s, 0 lost",
            _met(rate, lambda v: v >= 4_000_000 and g["lost_in_kernel"] == 0),
        ),
        (
            f"5 workload slowdown (untraced {_s(r['untraced_s'])})",
            f"{r['gfxbpf_workload_slowdown']}x",
            f"{r['bpftrace_workload_slowdown']}x",
            "—",
            "≤ 1.5x",
            _met(r["gfxbpf_workload_slowdown"], lambda v: v <= 1.5),
        ),
        (
            "5 with a 256 KiB ring instead of 64 MiB",
            f"{s['delivered_per_s'] or 0:,} /s, {s['lost_in_kernel']:,} lost",
            "—",
            "—",
            "—",
            "—",
        ),
        *_ringbuf_parts(r),
    ]


def _ringbuf_parts(r: dict[str, Any]) -> list[Row]:
    """Where a traced getppid's time goes: the reader's CPU, the kernel's side
    alone, the program's own run, and what a wake-up per record would cost."""
    if "gfxbpf_wake_each" not in r:  # runs before these were measured
        return []
    g, w, base = r["gfxbpf"], r["gfxbpf_wake_each"], r["untraced_s"]
    prog = r.get("program_ns_per_record")
    return [
        (
            "5 the reader's CPU per record (RingBuffer.poll_runs, decoded in runs; its polls "
            "while caught up included)",
            f"{g['reader_ns_per_record']} ns",
            "—",
            "—",
            "—",
            "—",
        ),
        (
            "5 workload slowdown with no reader (the kernel's side alone; program's "
            "run per record, bpf_stats, in brackets)",
            f"{ratio(r['gfxbpf_no_reader_s'], base)}x"
            + (f" [{prog} ns]" if prog is not None else ""),
            "—",
            "—",
            "—",
            "—",
        ),
        (
            "5 workload slowdown with a wake-up per record (bpf_ringbuf_submit flags 0)",
            f"{ratio(w['workload_s'], base)}x, {w['delivered_per_s'] or 0:,} /s",
            "—",
            "—",
            "—",
            "—",
        ),
        *_ringbuf_periodic(r),
    ]


def _ringbuf_periodic(r: dict[str, Any]) -> list[Row]:
    p = r.get("gfxbpf_periodic")
    if p is None:
        return []
    return [
        (
            f"5 workload slowdown, the reader reading once per {r['periodic_read_s'] * 1000:g} ms "
            "(its CPU per record in brackets)",
            f"{ratio(p['workload_s'], r['untraced_s'])}x [{p['reader_ns_per_record']} ns]",
            "—",
            "—",
            "—",
            "—",
        )
    ]


def _footprint(r: dict[str, Any]) -> list[Row]:
    return [
        (
            f"6 broker RSS, idle → {r['sessions']} sessions",
            f"{r['rss_idle_kib'] / 1024:.1f} → {r['rss_with_sessions_kib'] / 1024:.1f} MiB "
            f"({r['rss_per_session_kib']} KiB/session)",
            "—",
            "—",
            "—",
            "—",
        ),
        (
            f"6 broker CPU: set up {r['sessions']} sessions / hold them / close them",
            f"{r['setup_cpu_s']} s / {r['held_cpu_percent']} % / {r['close_cpu_s']} s",
            "—",
            "—",
            "—",
            "—",
        ),
    ]


def _cuda(r: dict[str, Any]) -> list[Row]:
    size = f"{r['library_bytes'] / 1e6:.0f} MB, {r['dynsym_functions']} functions"
    launch = r["launch"]
    return [
        (
            f"7 cuda: index the stand-in libcuda's symbols ({size}) vs pyelftools' walk",
            f"{r['index_ms']:.0f} ms",
            f"{r['pyelftools_dynsym_ms']:.0f} ms",
            f"{r['ratio_index']}x",
            "—",
            "—",
        ),
        (
            "7 cuda: first attach to that library (broker-side, cold symbol index)",
            f"{r['first_attach_ms']:.0f} ms",
            "—",
            "—",
            "—",
            "—",
        ),
        (
            "7 cuda: second attach to the same library (broker-side, median; max in brackets)",
            f"{r['second_attach_ms']:.1f} ms [{r['second_attach_max_ms']:.1f}]",
            "—",
            "—",
            "≤ 50 ms",
            _met(r["second_attach_ms"], lambda v: v <= 50),
        ),
        (
            "7 cuda: ns added per cuLaunchKernel by the entry and return probes (stand-in)",
            f"+{launch['added_ns']:.0f} ns ({launch['untraced_ns']:.0f} → "
            f"{launch['traced_ns']:.0f} ns)",
            "—",
            "—",
            "—",
            "—",
        ),
    ]


def _exporter(r: dict[str, Any]) -> list[Row]:
    attached = ", ".join(sorted(k for k, v in r["programs"].items() if v)) or "none"
    p99 = r["scrape_ms"]["p99"] / 1000
    return [
        (
            f"8 exporter scrape of /metrics, {r['series']} series ({attached} attached; "
            f"clonecount with {r['comms']} commands)",
            f"p50 {r['scrape_ms']['p50']:.1f} ms, p99 {r['scrape_ms']['p99']:.1f} ms "
            f"({r['cpu_ms_per_scrape']:.1f} ms CPU)",
            "—",
            "—",
            "p99 < 1 s",
            _met(p99, lambda v: v < 1.0),
        ),
        (
            "8 exporter RSS, idle → after the scrapes",
            f"{r['rss_idle_kib'] / 1024:.1f} → {r['rss_kib'] / 1024:.1f} MiB",
            "—",
            "—",
            "—",
            "—",
        ),
    ]


def _profile(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    base = r["untraced_s"]
    for hz, f in r["hz"].items():
        for peer, key in (("perf record -g", "perf"), ("bpftrace profile:hz", "bpftrace")):
            rows.append(
                (
                    f"9 workload slowdown at {hz} Hz vs {peer} (untraced {_s(base)})",
                    f"{_s(f['gfxbpf_s'])} (×{f['gfxbpf_slowdown']})",
                    f"{_s(f[key + '_s'])} (×{f[key + '_slowdown']})",
                    str(ratio(f["gfxbpf_s"], f[key + "_s"])),
                    "≤ perf's" if key == "perf" else "—",
                    _met(ratio(f["gfxbpf_s"], f["perf_s"]), lambda x: x <= 1.0)
                    if key == "perf"
                    else "—",
                )
            )
    g = r["flamegraph"]
    rows.append(
        (
            f"9 end of sampling → folded file at {g['hz']} Hz (stacks: gfxbpf "
            f"{g['gfxbpf_stacks']}, {g['gfxbpf_lost']} lost; perf {g['perf_stacks']})",
            f"{_s(g['gfxbpf_folded_s'])} (svg {_s(g['gfxbpf_svg_s'])})",
            f"{_s(g['perf_fold_s'])} (perf script + fold)",
            str(g["ratio_vs_perf"]),
            "≤ 0.5",
            _met(g["ratio_vs_perf"], lambda x: x <= 0.5),
        )
    )
    return rows


def _broker_memory(r: dict[str, Any]) -> list[Row]:
    def mib(k: str) -> float:
        return float(r[k]) / 1024

    rows: list[Row] = [
        (f"10 broker RSS: {label}", f"{mib(k):.1f} MiB", "—", "—", f"≤ {cap} MiB",
         _met(mib(k), lambda x, c=cap: x <= c))
        for label, k, cap in (
            ("idle", "rss_idle_kib", 50),
            ("after the first CO-RE load (execsnoop tp_btf)", "rss_first_core_kib", 64),
            (f"after each of {len(r['catalog_attached'])} catalog programs once",
             "rss_all_catalog_kib", 72),
            (f"{r['sessions']} sessions (after the above)", "rss_sessions_kib", 72),
        )
    ]  # fmt: skip
    first, peer, ratio = (
        r["first_core_attach_median_s"],
        r["libbpf_loadall_median_s"],
        r["ratio_vs_libbpf"],
    )
    if "first_core_broker_cpu_median_s" not in r:  # results from before CPU was measured
        rows.append(
            (
                "10 first CO-RE attach, request → attached (execsnoop tp_btf)",
                _s(first),
                f"{_s(peer)} (bpftool prog loadall)",
                str(ratio),
                "≤ 150 ms, ≤ 3×",
                _met(first, lambda x: x <= 0.150 and ratio <= 3),
            )
        )
        return rows
    cpu, peer_cpu = r["first_core_broker_cpu_median_s"], r["libbpf_loadall_cpu_median_s"]
    rows.append(
        (
            "10 first CO-RE attach, request → attached (execsnoop tp_btf; CPU: the broker's)",
            f"{_s(first)} (CPU {_ms(cpu)})",
            f"{_s(peer)} (CPU {_ms(peer_cpu)}; bpftool prog loadall)",
            f"{ratio} (CPU {cpu / peer_cpu:.2f})",
            "≤ 150 ms, ≤ 3×",
            _met(first, lambda x: x <= 0.150 and ratio <= 3),
        )
    )
    rows.append(_cold_row(r["cold_load_median"], peer, peer_cpu))
    return rows


def _cold_row(c: dict[str, float], peer: float, peer_cpu: float) -> Row:
    return (
        "10 the same load, vmlinux BTF not yet indexed (a fresh process, imports excluded)",
        f"{_s(c['total_s'])} (CPU {_ms(c['total_cpu_s'])}: index {_ms(c['index_cpu_s'])}, "
        f"load {_ms(c['load_cpu_s'])}; in BPF_BTF_LOAD + BPF_PROG_LOAD "
        f"{_ms(c['bpf_syscalls_s'])})",
        f"{_s(peer)} (CPU {_ms(peer_cpu)}; bpftool prog loadall)",
        f"{c['total_s'] / peer:.2f} (CPU {c['total_cpu_s'] / peer_cpu:.2f})",
        "—",
        "—",
    )


def _ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


def _python(r: dict[str, Any]) -> list[Row]:
    def pct(x: float) -> str:
        return f"{x * 100:.1f}%"

    gfx, spy = r["gfxbpf_chain_share"], r["pyspy_chain_share"]
    return [
        (
            f"12 Python: samples with the whole chain outer;middle;inner ({r['hz']} Hz)",
            pct(gfx),
            f"{pct(spy)} (py-spy; --nonblocking {pct(r['pyspy_nonblocking_chain_share'])})",
            str(ratio(gfx, spy)) if spy else "—",
            "≥ py-spy's",
            _met(gfx - spy, lambda d: d >= 0),
        ),
        *_python_in_script(r, pct),
        (
            f"12 Python: workload slowdown at {r['hz']} Hz (untraced {_s(r['untraced_s'])})",
            f"×{r['gfxbpf_slowdown']}",
            f"×{r['pyspy_slowdown']} (py-spy; --nonblocking ×{r['pyspy_nonblocking_slowdown']})",
            str(ratio(r["gfxbpf_slowdown"], r["pyspy_slowdown"])),
            "≤ py-spy's",
            _met(r["gfxbpf_slowdown"] - r["pyspy_slowdown"], lambda d: d <= 0),
        ),
        (
            "12 Python: end of the workload → flame graph written",
            _s(r["gfxbpf_to_flamegraph_s"]),
            f"{_s(r['pyspy_to_flamegraph_s'])} (py-spy)",
            str(ratio(r["gfxbpf_to_flamegraph_s"], r["pyspy_to_flamegraph_s"])),
            "—",
            "—",
        ),
    ]


def _python_in_script(r: dict[str, Any], pct: Callable[[float], str]) -> list[Row]:
    """The same share of the samples taken while the script ran (results
    from before this row was measured have none)."""
    if "gfxbpf_script_share" not in r:
        return []
    gfx, spy = r["gfxbpf_script_share"], r["pyspy_script_share"]
    return [
        (
            "12 Python: the same, of the samples taken in the script (a frame of loop.py)",
            pct(gfx),
            f"{pct(spy)} (py-spy)",
            str(ratio(gfx, spy)) if spy else "—",
            "≥ py-spy's",
            _met(gfx - spy, lambda d: d >= 0),
        )
    ]


def _share(x: float | None) -> str:
    return "—" if x is None else f"{x:.1%}"


def _unwind_workload(name: str, w: dict[str, Any]) -> list[Row]:
    top = max(w["hz"], key=int)
    c = w["hz"][top]
    g, d, f = c["gfxclient"], c["perf_dwarf"], c["perf_fp"]
    rows: list[Row] = [
        (f"11 {name}: samples reaching main at {top} Hz ({g['samples']} samples)",
         _share(g["complete"]),
         f"perf dwarf {_share(d['complete'])}, perf -g {_share(f['complete'])}",
         "—", "≥ 95%", _met(g["complete"], lambda x: x >= 0.95)),
    ]  # fmt: skip
    for hz, c in w["hz"].items():
        g, d, f = c["gfxclient"], c["perf_dwarf"], c["perf_fp"]
        r = ratio(g["s"], d["s"])
        rows.append(
            (f"11 {name}: workload at {hz} Hz (untraced {_s(w['untraced_s'])})",
             f"{_s(g['s'])} (×{g['slowdown']}; CPU ×{g['cpu_slowdown']}; "
             f"client CPU {_s(g['tool_cpu_s'])})",
             f"perf dwarf {_s(d['s'])} (×{d['slowdown']}; CPU ×{d['cpu_slowdown']}; perf CPU "
             f"{_s(d['tool_cpu_s'])}), perf -g ×{f['slowdown']} (CPU ×{f['cpu_slowdown']})",
             str(r), "≤ perf dwarf's", _met(r, lambda x: x <= 1.0))
        )  # fmt: skip
    fg, bpf = w["flamegraph"], w["hz"][top]["bpf"]
    rows.append(
        (f"11 {name}: end of sampling → flame graph at {fg['hz']} Hz",
         f"{_s(fg['gfxclient_svg_s'])} (svg)",
         f"{_s(fg['perf_script_fold_s'])} (perf script + fold)",
         str(fg["ratio_vs_perf"]), "≤ 0.5", _met(fg["ratio_vs_perf"], lambda x: x <= 0.5))
    )  # fmt: skip
    per = bpf["ns_per_recorded_sample"]
    rows.append(
        (f"11 {name}: BPF time per sample at {top} Hz (bpf_stats)",
         f"{per / 1000:.1f} µs" if per is not None else "—",
         f"({bpf['ns_per_run'] / 1000:.1f} µs per run, {bpf['runs']} runs on all CPUs)"
         if bpf["ns_per_run"] is not None else "—", "—", "—", "—")
    )  # fmt: skip
    return rows


def _unwind(r: dict[str, Any]) -> list[Row]:
    rows = [row for name, w in r["workloads"].items() for row in _unwind_workload(name, w)]
    maps = next(iter(next(iter(r["workloads"].values()))["hz"].values()))["map_bytes"]
    listed = ", ".join(f"{k} {v / 1024:.0f} KiB" for k, v in sorted(maps.items()))
    total = f"{sum(maps.values()) / 2**20:.2f} MiB ({listed})"
    rows.append(("11 kernel memory of stackcopy's maps (memlock)", total, "—", "—", "—", "—"))
    lib = r["largest_library"]
    if lib.get("path"):
        rows.append(
            (f"11 largest .eh_frame: {lib['path']} ({lib['file_mb']} MB, .eh_frame "
             f"{lib['eh_frame_mb']} MB, {lib['fdes']} FDEs)",
             f"first parse {_s(lib['first_parse_s'])}, cached {_s(lib['cached_load_s'])}",
             f"table {lib['table_mb']} MB", "—", "—", "—")
        )  # fmt: skip
    return rows


def _offcpu(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    base, gfx = r["untraced_s"], r["gfxbpf_s"]
    what = f"13 ping-pong slowdown, --off-cpu (untraced {_s(base)}, {r['round_trips']} round trips)"
    peers = (("perf record --off-cpu", "perf"), ("offcputime (libbpf-tools)", "offcputime"))
    for peer, key in peers:
        if key + "_s" not in r:
            why = r.get(key + "_unsupported") or "not run"
            rows.append((f"{what} vs {peer}", f"{_s(gfx)} (×{r['gfxbpf_slowdown']})",
                         f"unsupported: {why}", "—", "—", "—"))  # fmt: skip
            continue
        rel = ratio(gfx, r[key + "_s"])
        rows.append(
            (
                f"{what} vs {peer}",
                f"{_s(gfx)} (×{r['gfxbpf_slowdown']})",
                f"{_s(r[key + '_s'])} (×{r[key + '_slowdown']})",
                str(rel),
                "≤ perf's" if key == "perf" else "—",
                _met(rel, lambda x: x <= 1.0) if key == "perf" else "—",
            )
        )
    gfx_ns, peer_ns = (
        r.get("gfxbpf_bpf_ns_per_round_trip"),
        r.get("offcputime_bpf_ns_per_round_trip"),
    )
    if gfx_ns is not None and peer_ns is not None:
        rows.append(
            (
                "13 BPF run time per round trip (about 4 switches; kernel.bpf_stats), "
                "vs offcputime (libbpf-tools)",
                f"{gfx_ns} ns",
                f"{peer_ns} ns",
                str(ratio(gfx_ns, peer_ns)),
                "—",
                "—",
            )
        )
    return rows


def _memory(r: dict[str, Any]) -> list[Row]:
    base, peer = r["untraced_s"], r["peer_s"]
    what = f"17 dict-building slowdown, --memory (untraced {_s(base)})"
    rows: list[Row] = []
    for label, key in (
        ("exact", "gfxbpf"),
        (f"--sample-bytes {r['sample_bytes']}", "gfxbpf_sampled"),
    ):
        rows.append(
            (
                f"{what}, {label}, vs {r['peer']} (root)",
                f"{_s(r[key + '_s'])} (×{r[key + '_slowdown']})",
                f"{_s(peer)} (×{r['peer_slowdown']})",
                str(ratio(r[key + "_s"], peer)),
                "—",
                "—",
            )
        )
    return rows


def _attach(r: dict[str, Any]) -> list[Row]:
    goals = r["goals_ms"]
    rows: list[Row] = []
    for program, t in r.items():
        if program == "goals_ms":
            continue
        peer = f"{t['bpftool_ms']:.0f} ms"
        for kind in ("cold", "warm"):
            ms = t[f"{kind}_ms"]
            note = "" if kind == "cold" or t["warm_reused"] else " (not parked: loaded)"
            rows.append(
                (
                    f"14 attach of {program}, {kind}{note}: broker's audited time "
                    "vs bpftool prog loadall (default knobs)",
                    f"{ms:.1f} ms",
                    peer,
                    str(ratio(ms, t["bpftool_ms"])),
                    f"≤ {goals[kind]:.0f} ms",
                    _met(ms, lambda x, g=goals[kind]: x <= g),
                )
            )
    return rows


def _locks(r: dict[str, Any]) -> list[Row]:
    what = (
        f"16 added time per contended lock operation, --locks (untraced {_s(r['untraced_s'])}, "
        f"{r['contended_ops']:.0f} futex waits of {4 * r['iterations']} lock operations)"
    )
    gfx = f"{r['gfxbpf_ns_per_contended_op']} ns (×{r['gfxbpf_slowdown']})"
    if "perf_s" not in r:
        why = r.get("perf_unsupported") or "not run"
        rows: list[Row] = [
            (f"{what} vs perf lock contention -b", gfx, f"unsupported: {why}", "—", "—", "—")
        ]
    else:
        peer = r["perf_ns_per_contended_op"]
        rel = ratio(r["gfxbpf_ns_per_contended_op"], peer)
        rows = [
            (f"{what} vs perf lock contention -b", gfx,
             f"{peer} ns (×{r['perf_slowdown']})", str(rel), "—", "—")
        ]  # fmt: skip
    rows.append(
        ("16 BPF run time of program locks per contended operation (kernel.bpf_stats)",
         f"{r['gfxbpf_bpf_ns_per_contended_op']} ns", "—", "—", "—", "—")
    )  # fmt: skip
    return rows


def _spy_failed(t: dict[str, Any]) -> str:
    """How often py-spy failed (its time is kept: what its user waited)."""
    n = t.get("pyspy_failed")
    if not n:
        return ""
    return f" (failed {n} of {len(t['gfxclient_rounds_s'])}: {t['pyspy_failure']})"


def _fixed_cost(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for name, t in r.items():
        ours = _ms(t["gfxclient_s"])
        label = f"15 profile of `{name}` (start to exit): gfxclient"
        rows.append(
            (
                f"{label} vs `perf record -g`",
                ours,
                _ms(t["perf_record_s"]),
                f"{t['ratio_vs_perf']}x",
                *_target(0.5, t["ratio_vs_perf"]),
            )
        )
        if "pyspy_record_s" in t:
            rows.append(
                (
                    f"{label} vs `py-spy record`",
                    ours,
                    _ms(t["pyspy_record_s"]) + _spy_failed(t),
                    f"{t['ratio_vs_pyspy']}x",
                    *_target(1.0, t["ratio_vs_pyspy"]),
                )
            )
    return rows


def _spy_errors(tool: dict[str, Any]) -> str:
    """py-spy's samples it could not take (left out of its file), if any."""
    if not tool.get("errors"):
        return ""
    return f" ({tool['errors']} errors in {tool['samples']} samples, left out)"


def _bytes(tool: dict[str, Any]) -> str:
    n = tool.get("bytes_per_sample")
    return "—" if n is None else f"{n:,} B"


def _torch(r: dict[str, Any]) -> list[Row]:
    g, d, n, p = r["gfxclient"], r["perf_dwarf"], r["pyspy_native"], r["pyspy"]
    label = f"18 {'PyTorch' if r['workload'] == 'torch' else 'stand-in (no torch)'} loop"
    worst = max(d["slowdown"], p["slowdown"])
    return [
        (
            f"{label}: whole native chains under the training step ({r['hz']} Hz; "
            f"{g['samples_under_step']} samples)",
            _share(g["whole"]),
            f"py-spy --native {_share(n['whole'])}{_spy_errors(n)}, perf dwarf "
            f"{_share(d['whole'])} ({d['samples_under_step']} samples)",
            str(ratio(g["whole"], n["whole"])) if n["whole"] else "—",
            "≥ 95%, ≥ py-spy --native's",
            _met(min(g["whole"] - 0.95, g["whole"] - n["whole"]), lambda x: x >= 0),
        ),
        (
            f"{label}: slowdown, untraced over traced steps/s in a round, median "
            f"(untraced {r['untraced_steps_per_s']} steps/s)",
            f"×{g['slowdown']}",
            f"perf dwarf ×{d['slowdown']}, py-spy --native ×{n['slowdown']}, "
            f"py-spy ×{p['slowdown']}",
            str(ratio(g["slowdown"], worst)),
            "≤ perf dwarf's, ≤ py-spy's",
            _met(g["slowdown"] - min(d["slowdown"], p["slowdown"]), lambda x: x <= 0),
        ),
        (
            f"{label}: program exit → written file",
            _ms(g["to_file_s"]),
            f"perf record {_ms(d['to_file_s'])} (perf.data), py-spy --native "
            f"{_ms(n['to_file_s'])}, py-spy {_ms(p['to_file_s'])}",
            str(ratio(g["to_file_s"], d["to_file_s"])),
            "—",
            "—",
        ),
        (
            f"{label}: bytes moved per sample",
            f"≤ {g['record_bytes']:,} B (stack record: header + copy)",
            f"perf dwarf {d['bytes_per_sample']:,} B (perf.data / samples); py-spy --native "
            f"{_bytes(n)}, py-spy {_bytes(p)} (process_vm_readv)",
            str(ratio(g["record_bytes"], d["bytes_per_sample"])),
            "—",
            "—",
        ),
        (
            f"{label}: unwind tables per 100 MB of mapped code ({r['code_mb']} MB mapped)",
            f"{g['tables_mb_per_100mb']} MB (compiled, on disk; client peak RSS "
            f"{g.get('rss_mb', '—')} MB)",
            f"py-spy --native {n['tables_mb_per_100mb']} MB (its RSS over py-spy's); perf "
            f"record none (perf script's RSS {d['script_mb_per_100mb']} MB)",
            str(ratio(g["tables_mb_per_100mb"], n["tables_mb_per_100mb"]))
            if n["tables_mb_per_100mb"] > 0
            else "—",
            "—",
            "—",
        ),
    ]


SECTIONS: dict[str, Callable[[dict[str, Any]], list[Row]]] = {
    "first_data": _first_data,
    "kernel_cost": _kernel_cost,
    "watchers": _watchers,
    "map_reads": _map_reads,
    "ringbuf": _ringbuf,
    "footprint": _footprint,
    "cuda": _cuda,
    "exporter": _exporter,
    "profile": _profile,
    "broker_memory": _broker_memory,
    "python": _python,
    "unwind": _unwind,
    "offcpu": _offcpu,
    "attach": _attach,
    "locks": _locks,
    "memory": _memory,
    "fixed_cost": _fixed_cost,
    "torch": _torch,
}


def missed(doc: dict[str, Any]) -> list[str]:
    """One line per row whose goal was missed: what the run's own figures say
    about why (bench/why.py), or that this run holds no analysis of it."""
    from bench.why import WHY  # it formats with this module's helpers

    lines = []
    for name, result in doc["results"].items():
        for row in _section_rows(name, result):
            if row[5] != "**no**":
                continue
            why, text = WHY.get(name), None
            # A results file from before a figure the analysis uses has none.
            with contextlib.suppress(KeyError, TypeError, ZeroDivisionError):
                text = why(doc["results"], result, row[0]) if why else None
            lines.append(f"{row[0]}: {text or 'no analysis in this run.'}")
    return lines


def _has_figure(cell: str) -> bool:
    return any(c.isdigit() for c in cell)


def _section_rows(name: str, result: dict[str, Any]) -> list[Row]:
    """The section's rows; a row without a figure saying why it has none."""
    try:
        rows = SECTIONS[name](result)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        return [(f"{name}: cannot be formatted ({type(e).__name__}: {e})", "—", *["—"] * 4)]
    return rows or [(f"{name}: no row", "—", *["—"] * 4)]


def missing_figures(doc: dict[str, Any]) -> list[str]:
    """Rows without a figure of gfxbpf's (a measurement that ran but gives no
    row, or whose result cannot be formatted, counts as one). bench/run
    --quick, CI's smoke, fails on any; it judges no figure."""
    return [
        f"{row[0]}: no figure ({row[1]!r})"
        for name, result in doc["results"].items()
        for row in _section_rows(name, result)
        if not _has_figure(row[1])
    ]


def _load(doc: dict[str, Any]) -> str:
    if "load_average" not in doc:  # a results file from before it was kept
        return ""
    start, end = doc["load_average"]
    return f", load average {start} at the start and {end} at the end"


def markdown(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    lines = [
        f"# gfxbpf bench, {doc['date']}",
        "",
        f"Linux {m['kernel']}, {m['cpus']} × {m['cpu']}, {m['memory_gib']} GiB; "
        f"gfxbpf {m['gfxbpf']} ({m['commit']}), {m['bpftrace']}, "
        f"{m['bpftool']}; Python {m['python']}. Made by `sudo bench/run"
        f"{' ' + ' '.join(doc['args']) if doc['args'] else ''}` in {doc['elapsed_s']:.0f} s"
        + _load(doc)
        + ".",
        "",
        "| measure | gfxbpf | peer | ratio | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for name in SECTIONS:
        if name in doc["results"]:
            rows = _section_rows(name, doc["results"][name])
            lines += ["| " + " | ".join(row) + " |" for row in rows]
    why = missed(doc)
    if why:
        lines += ["", "Goals missed, and why (figures of this run):", ""]
        lines += [f"- {w}" for w in why]
    lines += ["", "Notes:", ""] + [f"- {n}" for n in doc["notes"]]
    return "\n".join(lines) + "\n"
