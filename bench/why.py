"""Why a bench goal is missed, from the figures of the same run: one function
per section, given the run's results, the section's and the missed row's
measure, returning a sentence (report.missed() writes them under the table)."""

from __future__ import annotations

import os
import re
import statistics
from collections.abc import Callable
from typing import Any

from bench.report import _s, _share

# Why a goal is missed, from the figures of the same run: section -> fn(results
# of the run, result of the section, the missed row's measure) -> a sentence.
Why = Callable[[dict[str, Any], dict[str, Any], str], str | None]


def _why_first_data(_doc: dict[str, Any], r: dict[str, Any], measure: str) -> str | None:
    view, bt = r["gfxclient_first_view_s"], r["bpftrace_s"]
    if "(1 s interval)" in measure:
        return _why_first_data_interval(r)
    if "interval 0.1" not in measure:
        return None
    text = (
        f"`--once --interval 0.1` is the first view ({_s(view)}: Python's start, imports, "
        f"connect, attach, first read) plus the 0.1 s interval; against bpftrace's {_s(bt)}, "
        f"0.4x leaves {_s(0.4 * bt - 0.1)} for the first view."
    )
    floor = r.get("python_protobuf_floor_s")
    if floor is None:  # a results file from before the floor was measured here
        return text
    fresh = r["client_attach_ms"]["fresh"]["p50"]
    return text + (
        f" Of the first view, {_s(floor)} is a Python that only loads the protobuf runtime "
        f"and the wire's messages (the floor of a Python client); the other {_s(view - floor)} "
        f"are gfxclient's own imports and parser, connect, the attach (a fresh load: "
        f"{fresh:.0f} ms p50 at the client in this run), the first read and its output."
    )


def _why_kernel_cost(doc: dict[str, Any], r: dict[str, Any], measure: str) -> str | None:
    if "execsnoop vs bpftrace" in measure:
        return _why_execsnoop(r)
    if "clonecount vs bpftrace" in measure:
        return _why_clonecount_bpftrace(r)
    if "clonecount vs an empty" not in measure:
        return None
    ns = r["clonecount"]["ns_per_event"]
    sys_ns = r.get("syscount", {}).get("ns_per_event", {})
    extra = ns["gfxbpf"] - ns["empty"]
    return (
        f"clonecount's own work is {extra:.0f} ns per event over the empty program's "
        f"{ns['empty']:.0f} ns: the comm copied into a zeroed 16-byte key, hashed and looked "
        "up in a hash map, then an atomic add; 1.5x leaves it "
        f"{0.5 * ns['empty']:.0f} ns. syscount, a per-CPU array indexed by the syscall "
        f"number (no hash), costs {sys_ns.get('gfxbpf', 0):.0f} ns against its floor's "
        f"{sys_ns.get('empty', 0):.0f} ns. A count per command name needs the hash lookup; "
        "meeting the goal would take counting by a small id (a per-CPU array) and naming the "
        "ids apart, a redesign not made in this round."
    )


def _why_map_reads(_doc: dict[str, Any], r: dict[str, Any], measure: str) -> str | None:
    bt, raw, dec = r["bpftool_dump_ms"], r["fd_batch_raw_ms"], r["fd_batch_decoded_ms"]
    if "through gRPC" in measure:
        return _why_grpc_read(r)
    if measure.startswith("4 read"):
        return (
            f"the batch read through the kernel alone (raw bytes) took {raw:.1f} ms "
            f"({bt / raw:.1f}x faster than bpftool), read and decoded with BTF in Python (a "
            f"dict and a str per row) {dec:.1f} ms for {r['entries']['fd']} rows; 12x needs "
            f"the whole under {bt / 12:.1f} ms."
        )
    if "whole command" in measure and "python_start_ms" in r:
        return _dump_parts(r)
    if "whole command" in measure and "gfxclient_start_ms" in r:
        return (
            f"of gfxclient's {r['gfxclient_dump_cmd_ms']:.0f} ms, "
            f"{r['gfxclient_start_ms']:.0f} ms are Python's start and the imports of `dump` "
            "before any work (`gfxclient dump --help`, timed the same way); bpftool is one C "
            "process that reads entry by entry." + _python_floor(r)
        )
    return None


def _dump_parts(r: dict[str, Any]) -> str:
    """Where gfxclient dump's time goes, each part the difference of two
    commands timed in the same rounds (medians)."""
    cmd, start = r["gfxclient_dump_cmd_ms"], r["gfxclient_start_ms"]
    floor, bare = r["python_protobuf_floor_ms"], r["python_start_ms"]
    return (
        f"of gfxclient's {cmd:.0f} ms, {bare:.0f} ms are Python's own start (`python -c "
        f"pass`), {floor - bare:.0f} ms the protobuf runtime and the wire's messages (`python "
        f"-c 'import gfxbpf.proto.gfxbpf_pb2'`), {start - floor:.0f} ms the rest of `dump`'s "
        f"imports and parser (`gfxclient dump --help`) and {cmd - start:.0f} ms its work "
        f"(connect, attach, read and decode {r['entries']['gfxclient_dump']} rows, JSON, "
        f"exit), each timed in the same rounds; bpftool, one C process, took "
        f"{r['bpftool_dump_ms']:.0f} ms." + _python_floor(r)
    )


def _python_floor(r: dict[str, Any]) -> str:
    floor = r.get("python_protobuf_floor_ms")
    if floor is None:  # a results file from before the floor was measured
        return ""
    bt = r["bpftool_dump_ms"]
    text = (
        f" A Python that only loads the protobuf runtime and the wire's messages takes "
        f"{floor:.0f} ms ({floor / bt:.2f}x bpftool)"
    )
    if floor >= bt:
        return text + (
            ": a Python client that speaks protobuf cannot reach 1.0x; that needs a client "
            "whose start loads no protobuf runtime (a compiled `dump`, or the session's few "
            "messages read without it)."
        )
    return text + (
        f": 1.0x leaves {bt - floor:.0f} ms for all of `dump`'s own imports, parser and work, "
        f"which take {r['gfxclient_dump_cmd_ms'] - floor:.0f} ms."
    )


def _why_ringbuf(doc: dict[str, Any], r: dict[str, Any], measure: str) -> str | None:
    g = r["gfxbpf"]
    n = g["events"] or 1
    per_call = r["untraced_s"] / n * 1e9
    added = (g["workload_s"] - r["untraced_s"]) / n * 1e9
    floor = doc.get("kernel_cost", {}).get("syscount", {}).get("ns_per_event", {}).get("empty")
    floor_txt = f"; an empty program on sys_enter alone costs {floor:.0f} ns" if floor else ""
    if "gfxbpf_wake_each" not in r:  # runs before the parts were measured
        return _why_ringbuf_before(r, measure, per_call, added, floor_txt)
    alone = (r["gfxbpf_no_reader_s"] - r["untraced_s"]) / n * 1e9
    woken = (r["gfxbpf_wake_each"]["workload_s"] - r["untraced_s"]) / n * 1e9
    prog = r.get("program_ns_per_record")
    prog_txt = (
        f" (the program's own run, timed by kernel.bpf_stats in a round of its own, "
        f"{prog:.0f} ns with the stats' clock reads)"
        if prog
        else ""
    )
    parts = (
        f"getppid takes {per_call:.0f} ns untraced; a record reserved and submitted per call "
        f"adds {added:.0f} ns with the reader on the other CPU, {alone:.0f} ns with no "
        f"reader at all{prog_txt}{floor_txt}, {woken:.0f} ns with the reader woken per "
        "record (no suppression)"
    )
    if p := r.get("gfxbpf_periodic"):
        parts += (
            f", {(p['workload_s'] - r['untraced_s']) / n * 1e9:.0f} ns with the reader reading "
            f"once per {r['periodic_read_s'] * 1000:g} ms"
        )
    if "slowdown" in measure:
        verdict = "is past it" if alone > 0.5 * per_call else "is within it, the reader's share not"
        return (
            f"{parts}. 1.5x allows {0.5 * per_call:.0f} ns added per call: the kernel's side "
            f"alone {verdict}; a record per system call this cheap needs the counting done "
            "in the kernel (the catalog's counting programs)."
        )
    # The last record read this long after the workload's end: the reader's lag.
    lag = n / max(1, g["delivered_per_s"]) - g["workload_s"]
    if lag > 0.1 * g["workload_s"]:
        reader = (
            f"the reader fell behind: its last record came {lag * 1000:.0f} ms after the "
            f"workload's end; it spends {g['reader_ns_per_record']:.0f} ns of CPU per record"
        )
    else:
        reader = (
            f"the reader is not the bound: it spends {g['reader_ns_per_record']:.0f} ns of CPU "
            "per record (decoded in runs; polling while caught up included) and its last "
            f"record came {lag * 1000:.0f} ms after the workload's end ({n:,} records in "
            f"{g['workload_s'] * 1000:.0f} ms), so records "
            "arrive as fast as the traced workload makes them"
        )
    room = (
        f"{250 - per_call:.0f} ns over the untraced one"
        if per_call < 250
        else "less than an untraced call took in this run"
    )
    return f"{reader}. {parts}. 4 M/s is 250 ns per traced call, {room}."


def _why_ringbuf_before(
    r: dict[str, Any], measure: str, per_call: float, added: float, floor_txt: str
) -> str:
    if "slowdown" in measure:
        return (
            f"getppid takes {per_call:.0f} ns untraced; tracing it (a record reserved and "
            f"submitted per call, the reader on the other CPU) adds {added:.0f} ns{floor_txt}: "
            f"1.5x allows {0.5 * per_call:.0f} ns added per call, a bound that a record per "
            "system call this cheap cannot meet."
        )
    return (
        f"the Python reader takes {1e9 / max(1, r['gfxbpf']['delivered_per_s']):.0f} ns per "
        "record (a bytes object each, read from the shared pages by gfxbpf.bpf.RingBuffer); "
        "4 M/s is 250 ns per record, which needs the records decoded in batches in C, or "
        "counted in the kernel instead of sent (what the catalog's counting programs do)."
    )


def _why_profile(_doc: dict[str, Any], r: dict[str, Any], measure: str) -> str | None:
    hz = "999" if "999 Hz" in measure else "99"
    t = r["hz"][hz]
    diff = t["gfxbpf_s"] - t["perf_s"]
    text = _medians(hz, t["gfxbpf_s"], "perf record -g", t["perf_s"], r["untraced_s"])
    if "rounds_s" not in t:  # a results file from before the rounds were kept
        return text + " on a VM shared with other work; not analysed further in this run."
    each = t["rounds_s"]
    runs = {"untraced": r["untraced_rounds_s"], "gfxclient": each["gfxbpf"]}
    return text + _against_spread(
        diff,
        runs | {"perf record -g": each["perf"]},
        "the sampling program (`profile`) records frame-pointer stacks in the kernel and "
        "the client reads the maps once a second",
    )


def _medians(hz: str, ours: float, peer: str, theirs: float, plain: float) -> str:
    return (
        f"at {hz} Hz the workload ran {ours:.3f} s under gfxclient and {theirs:.3f} s under "
        f"{peer} ({(ours - theirs) * 1000:+.0f} ms; untraced {plain:.3f} s), medians of the rounds"
    )


def _against_spread(diff: float, runs: dict[str, list[float]], cost: str) -> str:
    """The medians' difference weighed against the spread of each tool's own
    rounds (untraced included): the noise of the machine they ran on."""
    spread = {name: max(r) - min(r) for name, r in runs.items()}
    each = ", ".join(f"{name} {r}" for name, r in runs.items())
    widest = max(spread, key=lambda name: spread[name])
    text = f". Each round (s): {each}; the {widest} rounds alone spread over "
    text += f"{spread[widest] * 1000:.0f} ms"
    if abs(diff) <= spread[widest]:
        return text + (
            f", more than the medians' difference: on this shared 2-CPU VM the difference is "
            f"inside the rounds' noise, not a measured cost ({cost})."
        )
    return text + f", less than the medians' difference ({cost})."


def _why_unwind(_doc: dict[str, Any], r: dict[str, Any], measure: str) -> str | None:
    found = re.match(r"11 (.+): workload at (\d+) Hz", measure)
    if found is None:
        return None
    w = r["workloads"][found[1]]
    c = w["hz"][found[2]]
    g, d = c["gfxclient"], c["perf_dwarf"]
    diff = g["s"] - d["s"]
    text = _medians(found[2], g["s"], "perf --call-graph dwarf", d["s"], w["untraced_s"])
    text += f"; its own CPU time ×{g['cpu_slowdown']} against ×{d['cpu_slowdown']}"
    if "rounds" not in c:  # a results file from before the rounds were kept
        return text + "; not analysed further in this run."
    each = c["rounds"]
    cpu = (
        f"the client used {each['gfxclient']['tool_cpu_s']} s of CPU per round (reading and "
        f"unwinding the copies as they come), perf record {each['perf_dwarf']['tool_cpu_s']} s "
        "(writing them out, unwound after the run by perf script); on 2 CPUs that CPU competes "
        "with the workload and with other sessions' work"
    )
    runs = {t: each[k]["s"] for t, k in (("untraced", "untraced"), ("gfxclient", "gfxclient"))}
    return text + _against_spread(diff, runs | {"perf dwarf": each["perf_dwarf"]["s"]}, cpu)


def _why_python(_doc: dict[str, Any], r: dict[str, Any], measure: str) -> str | None:
    if "gfxbpf_cut_in_script" not in r:  # a results file from before these counts
        return None
    cut, spy = r["gfxbpf_cut_in_script"], r["pyspy_cut_in_script"]
    ours, theirs = [c[0] for c in cut], [c[0] for c in spy]
    apart = abs(statistics.median(ours) - statistics.median(theirs))
    change = max(max(ours) - min(ours), max(theirs) - min(theirs))
    text = (
        f"in the script gfxclient's samples without the whole chain per round were {ours} of "
        f"{[c[1] for c in cut]} (the commonest ends {cut[0][2] or '-'}), py-spy's {theirs} of "
        f"{[c[1] for c in spy]}: medians {apart:g} sample(s) apart, "
        + ("within" if apart <= change else "beyond")
        + f" the {change} by which one tool's count changed between rounds"
    )
    if "whole chain" in measure:
        text += (
            f"; and {r['gfxbpf_outside_script']} samples per round hold no frame of loop.py "
            "(gfxclient samples the interpreter from exec: its start-up before the script's "
            "first line and its shutdown after the last), where no chain can be"
        )
    return text + "."


def _why_fixed_cost(_doc: dict[str, Any], r: dict[str, Any], measure: str) -> str | None:
    t = r["python3 -c pass" if "python3" in measure else "true"]
    part = t.get("gfxclient_summary") or {}
    after = (part.get("read_s") or 0) + (part.get("output_s") or 0)
    return (
        f"gfxclient took {t['gfxclient_s'] * 1000:.0f} ms, of which {after * 1000:.0f} ms "
        "after the command ended (maps read, frames named, the flame graph written); the rest "
        "is Python's start and imports, connecting, and the attach that must be live before "
        "the command runs. py-spy is one native process that starts the command at once."
    )


def _why_torch(_doc: dict[str, Any], r: dict[str, Any], measure: str) -> str | None:
    g, n = r["gfxclient"], r["pyspy_native"]
    if "whole native chains" in measure:
        return (
            f"gfxclient (program {g['program']}) {_share(g['whole'])} whole; its cut samples "
            f"under the step, all rounds: {g.get('cut')}; py-spy --native "
            f"{_share(n['whole'])} of the samples it kept, and {n.get('errors', 0)} (median) "
            "it could not take are not in its file, so a whole share of 100% there does not "
            "count them."
        )
    runs = r["rounds_steps_per_s"]
    each = {
        t: [round(u / x, 2) for u, x in zip(runs["untraced"], runs[t], strict=True)]
        for t in ("gfxclient", "perf_dwarf", "pyspy")
    }
    spread = [min(runs["untraced"]), max(runs["untraced"])]
    return (
        f"each round's slowdown (untraced over traced steps/s): {each}; untraced alone moved "
        f"from {spread[0]} to {spread[1]} steps/s between rounds on 2 CPUs shared with other "
        "work (the loop, its 2 DataLoader workers and the profiler compete for them), so the "
        "medians' difference is inside the rounds' spread, not a measured cost."
    )


# execsnoop.bpf.c struct exec_event: pid, tgid, uid, gid, comm[16], filename[256]
EXEC_RECORD_BYTES = 4 * 4 + 16 + 256


def _why_first_data_interval(r: dict[str, Any]) -> str:
    bt = r["bpftrace_s"]
    return (
        f"`watch --once` shows its one view after one interval, 1 s by default: the interval "
        f"alone is {1.0 / bt:.1f}x bpftrace's {_s(bt)}, so no start-up can meet 0.5x with it; "
        "the two rows below time the start apart from the interval."
    )


def _why_execsnoop(r: dict[str, Any]) -> str:
    ns = r["execsnoop"]["ns_per_event"]
    extra = ns["gfxbpf"] - ns["empty"]
    goal = 0.1 * ns["bpftrace"]
    return (
        f"execsnoop's own work is {extra:.0f} ns per exec over the empty program's "
        f"{ns['empty']:.0f} ns: a {EXEC_RECORD_BYTES}-byte record reserved in the ring buffer, "
        "zeroed, its uid, pids and comm filled and up to 256 bytes of file name copied, then "
        f"committed without a wake-up. 0.1x bpftrace is {goal:.0f} ns, "
        f"{goal - ns['empty']:.0f} ns beyond the empty program for all of that; bpftrace's "
        f"{ns['bpftrace']:.0f} ns formats its printf record in the kernel and sends it through "
        "a perf buffer. Sending the file name is the program's purpose; this run did not "
        "measure how the rest splits between the ring's reserve and commit and the copies."
    )


def _why_clonecount_bpftrace(r: dict[str, Any]) -> str:
    ns = r["clonecount"]["ns_per_event"]
    return (
        f"clonecount and bpftrace's `@[comm] = count()` do the same work per clone, a hash "
        f"map updated under the zero-padded comm: {ns['gfxbpf']:.0f} ns against "
        f"{ns['bpftrace']:.0f} ns ({ns['gfxbpf'] - ns['bpftrace']:+.0f} ns), over an empty "
        f"program's {ns['empty']:.0f} ns. bpftrace's count() keeps a map per CPU; clonecount "
        "keeps one map, updated with an atomic add, that its readers take whole through a "
        "frozen fd. This run keeps no per-round figures to tell that difference from noise."
    )


def _why_grpc_read(r: dict[str, Any]) -> str:
    dec, grpc = r["fd_batch_decoded_ms"], r["grpc_decoded_ms"]
    n = r["entries"]["grpc"]
    return (
        f"the fd read is the batch lookup and the decode in this process ({dec:.1f} ms for "
        f"{n} rows); through gRPC the broker does the same batch read, then encodes the {n} "
        f"rows as one protobuf reply that crosses HTTP/2 on a Unix socket and is decoded here: "
        f"{grpc - dec:.1f} ms more, where 1.5x allows {0.5 * dec:.1f} ms. The fd session "
        "exists for this: a client that can take the map's fd reads it directly."
    )


def _why_watchers(_doc: dict[str, Any], r: dict[str, Any], measure: str) -> str | None:
    counts = sorted((int(k) for k in r if k.isdigit()), key=int)
    last = r[str(counts[-1])]
    one = r[str(counts[0])]
    cpu = last.get("gfxclient_watchers_cpu_per_s")
    text = (
        f"all {counts[-1]} watchers share one syscount instance in the kernel "
        f"({last['shared_joins_so_far'] - one['shared_joins_so_far']} joins since the first), "
        f"so the program's cost per system call does not grow with them; the workload ran "
        f"{last['gfxbpf_s']:.1f} s against {one['gfxbpf_s']:.1f} s under one watcher."
    )
    if cpu is None:  # a results file from before the watchers' CPU was measured
        return text
    return text + (
        f" The {counts[-1]} gfxclient processes used {cpu:.2f} CPU-seconds per second of "
        f"the workload's rounds ({cpu / counts[-1] * 1000:.1f} ms each), the broker "
        f"{last['broker_cpu_per_s']:.2f}, on a machine of {os.cpu_count()} CPUs: what is "
        "left over is the workload's."
    )


WHY: dict[str, Why] = {
    "watchers": _why_watchers,
    "first_data": _why_first_data,
    "kernel_cost": _why_kernel_cost,
    "map_reads": _why_map_reads,
    "ringbuf": _why_ringbuf,
    "profile": _why_profile,
    "python": _why_python,
    "unwind": _why_unwind,
    "fixed_cost": _why_fixed_cost,
    "torch": _why_torch,
}
