"""The results as a markdown table: figures, the peer's, ratios, targets."""

from __future__ import annotations

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


def _offcpu(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    base, gfx = r["untraced_s"], r["gfxbpf_s"]
    what = f"11 ping-pong slowdown, --off-cpu (untraced {_s(base)}, {r['round_trips']} round trips)"
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
    return rows


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
    "offcpu": _offcpu,
}


def markdown(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    lines = [
        f"# gfxbpf bench, {doc['date']}",
        "",
        f"Linux {m['kernel']}, {m['cpus']} × {m['cpu']}, {m['memory_gib']} GiB; "
        f"gfxbpf {m['gfxbpf']} ({m['commit']}), {m['bpftrace']}, "
        f"{m['bpftool']}; Python {m['python']}. Made by `sudo bench/run"
        f"{' ' + ' '.join(doc['args']) if doc['args'] else ''}` in {doc['elapsed_s']:.0f} s.",
        "",
        "| measure | gfxbpf | peer | ratio | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for name, fmt in SECTIONS.items():
        if name in doc["results"]:
            lines += ["| " + " | ".join(row) + " |" for row in fmt(doc["results"][name])]
    lines += ["", "Notes:", ""] + [f"- {n}" for n in doc["notes"]]
    return "\n".join(lines) + "\n"
