"""Program cudakernels outside the kernel: its catalog entry (USDT attach kind),
gfxclient's grouping of its rows (watch cuda --gpu), the injection library
found in a process's maps, and the exporter's labels (pid, uid, kernel)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import pytest

from gfxbpf.catalog import entries, objects
from gfxbpf.client.cli import cuda_kernels as ck
from gfxbpf.client.errors import UsageError
from gfxbpf.client.humanize import user_name
from gfxbpf.client.profiles.gpu import kernels as gk
from gfxbpf.client.profiles.gpu.maprows import LAUNCH_SEEN, NOT_SAMPLED
from gfxbpf.client.profiles.python.records import MAIN_FRAME
from gfxbpf.exporter import kernels, mapping
from gfxbpf.exporter.mapping import MapShape

GEMM, RELU = 0x1111, 0x2222
A, B = 0xA1, 0xB1  # Python chain hashes


def test_the_catalog_attaches_each_probe_of_the_injection_library() -> None:
    entry = entries.load_catalog().get("cudakernels")
    usdt = {a.program: a.target for a in entry.attach if a.kind == "usdt"}
    assert usdt == {
        "cupti_launch": "gfxcupti:launch",
        "cupti_kernels": "gfxcupti:kernels",
        "cupti_memcpy": "gfxcupti:memcpy",
        "cupti_memset": "gfxcupti:memset",
        "cupti_refused": "gfxcupti:refused",
    }
    assert entry.scopes == ("self", "system")
    assert objects.check_object(entry) == []


def test_a_usdt_attach_needs_a_provider_and_name() -> None:
    text = (entries.DEFAULT_PATH).read_text()
    bad = text.replace('target = "gfxcupti:launch"', 'target = "launch"')
    with pytest.raises(entries.CatalogError, match="not a USDT probe"):
        entries.parse_catalog(bad, directory=entries.DEFAULT_PATH.parent)


def _rows() -> list[tuple[ck.Row, int, int]]:
    return [
        # one kernel of one chain through two native paths (stack pointers): one row of the view
        ((10, 1000, A, GEMM, LAUNCH_SEEN, 1, 0x7FFE0000), 3, 750),
        ((10, 1000, A, GEMM, LAUNCH_SEEN, 1, 0x7FFD6000), 1, 250),
        ((10, 1000, B, GEMM, LAUNCH_SEEN, 1, 0x7FFE0000), 3, 900),
        ((10, 1000, B, RELU, LAUNCH_SEEN, 1, 0x7FFE0000), 3, 120),
        ((10, 1000, 0, RELU, 0, 0, 0), 2, 80),  # launched before attaching
        ((10, 1000, 0xC1, GEMM, LAUNCH_SEEN, 1, 0x7FFE0000), 1, 250),  # chain not copied yet
    ]


def test_rows_group_by_kernel_and_innermost_python_function() -> None:
    chains = {
        (10, A): ("<module> (t.py:9)", "a (t.py:2)"),
        (10, B): ("<module> (t.py:9)", "b (t.py:5)"),
    }
    got = ck.group(_rows(), {GEMM: "gemm", RELU: "relu"}, chains)
    table = {(k.name, k.function): (k.kernels, k.device_ns) for k in got}
    assert table == {
        ("gemm", "a (t.py:2)"): (4, 1000),
        ("gemm", "b (t.py:5)"): (3, 900),
        ("relu", "b (t.py:5)"): (3, 120),
        ("relu", ck.NO_LAUNCH): (2, 80),
        ("gemm", ck.NOT_COPIED): (1, 250),
    }
    assert [k.device_ns for k in got] == sorted((k.device_ns for k in got), reverse=True)
    first = got[0].as_json()
    assert first["mean_ns"] == 250 and first["chains"] == [
        {"chain": ["<module> (t.py:9)", "a (t.py:2)"], "kernels": 4, "device_ns": 1000}
    ]


def test_sampled_launches_stand_for_those_left_out_and_totals_stay_exact() -> None:
    """Launches too fast to probe each: rows of weight 4 scale up; the kernels of
    launches left out have no row of their own in the view but count in the totals."""
    rows: list[tuple[ck.Row, int, int]] = [
        ((10, 1000, A, GEMM, LAUNCH_SEEN, 4, 0x7FFE0000), 25, 2500),
        ((10, 1000, B, GEMM, LAUNCH_SEEN, 4, 0x7FFE0000), 75, 7500),
        ((10, 1000, 0, GEMM, NOT_SAMPLED, 0, 0), 300, 30000),
    ]
    chains = {(10, A): ("a (t.py:2)",), (10, B): ("b (t.py:5)",)}
    got = {k.function: (k.kernels, k.device_ns, k.estimated) for k in ck.group(rows, {}, chains)}
    assert got == {"a (t.py:2)": (100, 10000, True), "b (t.py:5)": (300, 30000, True)}
    totals = gk.Totals.of(rows)
    assert (totals.kernels, totals.device_ns, totals.not_sampled) == (400, 40000, 300)
    assert "300 of 400 kernels" in (totals.note() or "")
    assert gk.Totals.of(_rows()).note() is None


def test_a_threads_launch_names_the_main_threads_frame_as_such() -> None:
    """Autograd's thread runs no Python: its chain is the main thread's frames
    under the marker, and the view says the function is the main thread's."""
    borrowed = (MAIN_FRAME, "<module> (t.py:9)", "backward (t.py:4)")
    rows = [((10, 1000, 0xD1, GEMM, LAUNCH_SEEN, 1, 0x7F000000), 2, 500)]
    (got,) = ck.group(rows, {GEMM: "gemm"}, {(10, 0xD1): borrowed})
    assert got.function == "[main thread] backward (t.py:4)"
    assert got.as_json()["chains"][0]["chain"] == list(borrowed)


def test_an_unnamed_kernel_shows_its_hash() -> None:
    got = ck.group(_rows()[:1], {}, {})
    assert got[0].name == f"[kernel {GEMM:#x}]"


def test_the_injection_library_is_found_in_the_maps(tmp_path: Path, monkeypatch: Any) -> None:
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 0 08:01 5 /usr/lib/libc.so.6\n"
        "7f02-7f03 r-xp 0 08:01 6 /opt/gfxbpf/cupti/libgfxcupti-cu13.so\n"
    )
    monkeypatch.setattr(gk, "mapped_files", lambda pid: [
        ln.split(None, 5)[5] for ln in maps.read_text().splitlines()
    ])  # fmt: skip
    assert gk.find_injection(1) == "/opt/gfxbpf/cupti/libgfxcupti-cu13.so"
    maps.write_text("7f00-7f01 r-xp 0 08:01 5 /usr/lib/libc.so.6\n")
    with pytest.raises(UsageError, match="CUDA_INJECTION64_PATH"):
        gk.find_injection(1)


def test_the_exporter_labels_gpu_time_by_pid_user_and_kernel() -> None:
    shape = MapShape("cudakernels", "kernels", "table", "", "k", ("kernels", "device_ns"))
    raw = [
        ({"tgid": 10, "uid": 1000, "python": 0, "name_hash": GEMM, "flags": 1, "pad": 0},
         {"kernels": 4, "device_ns": 2_000_000_000}),
        ({"tgid": 11, "uid": 0, "python": 0, "name_hash": RELU, "flags": 0, "pad": 0},
         {"kernels": 1, "device_ns": 5_000_000}),
    ]  # fmt: skip
    cut = kernels.cut("k" * 300)
    assert len(cut) == kernels.NAME_MAX and cut.endswith("…")
    built = mapping.build(shape, kernels.relabel(raw, {GEMM: "gemm", RELU: cut}), 100)
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in built.families
        for s in f.samples
    }
    user = user_name(1000)  # a test host may have no such user: then "1000"
    gemm = (("kernel", "gemm"), ("pid", "10"), ("uid", "1000"), ("user", user))
    other = (("kernel", cut), ("pid", "11"), ("uid", "0"), ("user", "root"))
    assert got == {
        ("gfxbpf_cudakernels_kernels_kernels_total", gemm): 4.0,
        ("gfxbpf_cudakernels_kernels_device_seconds_total", gemm): 2.0,
        ("gfxbpf_cudakernels_kernels_kernels_total", other): 1.0,
        ("gfxbpf_cudakernels_kernels_device_seconds_total", other): 0.005,
    }
    # The per-program limit keeps the largest series and counts the rest.
    small = mapping.build(shape, kernels.relabel(raw, {}), 1)
    assert small.dropped == {
        "gfxbpf_cudakernels_kernels_kernels": 1,
        "gfxbpf_cudakernels_kernels_device_seconds": 1,
    }


def test_copies_are_labelled_by_kind_and_user_and_read_by_the_watch() -> None:
    from gfxbpf.client.cli.cuda_kernels import transfer_lines
    from gfxbpf.client.profiles.gpu import transfers as tr

    shape = MapShape("cudakernels", "copies", "table", "", "k", ("copies", "bytes", "device_ns"))
    raw = [
        ({"tgid": 10, "uid": 0, "kind": 1, "pad": 0},
         {"copies": 2, "bytes": 8192, "device_ns": 4_000}),
        ({"tgid": 10, "uid": 0, "kind": 0x100, "pad": 0},
         {"copies": 1, "bytes": 64, "device_ns": 0}),
    ]  # fmt: skip
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in mapping.build(shape, kernels.relabel(raw, {}), 100).families
        for s in f.samples
    }
    htod = (("kind", "htod"), ("pid", "10"), ("uid", "0"), ("user", "root"))
    assert got[("gfxbpf_cudakernels_copies_bytes_total", htod)] == 8192.0
    memset = (("kind", "memset"), ("pid", "10"), ("uid", "0"), ("user", "root"))
    assert got[("gfxbpf_cudakernels_copies_copies_total", memset)] == 1.0

    class Map:
        def raw_items(self) -> list[tuple[bytes, bytes]]:
            return [
                (tr.KEY.pack(7, 0, 0x100, 0), tr.STATS.pack(1, 64, 0)),
                (tr.KEY.pack(7, 0, 2, 0), tr.STATS.pack(3, 3 << 20, 1_000_000)),
                (tr.KEY.pack(7, 0, 99, 0), tr.STATS.pack(1, 1, 5)),
                (b"bad", b""),
            ]

    class Att:
        maps: dict[str, Any] = {"copies": Map()}

    rows = tr.read_transfers(Att())  # type: ignore[arg-type]
    assert [r.kind for r in rows] == ["dtoh", "kind 99", "memset"]  # most device time first
    lines = transfer_lines(rows, 2, False)
    assert lines[2].split() == ["7", "3", "3.00", "MiB", "1.00", "ms", "2.93", "GiB/s", "dtoh"]
    assert lines[3].endswith("kind 99") and lines[4] == "  … 1 more rows"
    assert transfer_lines([], None, True) == []
    assert transfer_lines(rows, 1, True)[2].endswith("dtoh · root")  # scope system: whose
    assert tr.note(rows, []) == (
        f"copies and memsets took GPU time too: {PARTS}; 5 of them (1.00 ms) are not drawn, "
        "as their calls came before the attach, or the process's injection library fires no "
        "launch probe for them (built before 2026-11-29: tools/setup.sh rebuilds it)"
    )
    Att.maps = {}  # a broker whose cudakernels has no such maps
    assert tr.read_transfers(Att()) == [] and tr.read_launched(Att()) == []  # type: ignore[arg-type]


PARTS = "dtoh 3 (3.00 MiB, 1.00 ms), kind 99 1 (1 B, 5 ns), memset 1 (64 B, 0 ns)"


def test_copies_by_launch_are_drawn_and_the_rest_told() -> None:
    """copy_stacks: the rows profile --gpu draws; its note counts what they miss."""
    from gfxbpf.client.profiles.gpu import transfers as tr

    rows = [
        tr.Transfer(7, 0, "dtoh", 3, 3 << 20, 1_000_000),
        tr.Transfer(7, 0, "kind 99", 1, 1, 5),
        tr.Transfer(7, 0, "memset", 1, 64, 0),
    ]

    class Stacks:  # two dtoh seen (weight 2), one left out by the sampling
        def raw_items(self) -> list[tuple[bytes, bytes]]:
            return [
                (tr.STACK_KEY.pack(7, 0, 2, 1, 0xC4A1, 0x7FF0, 2, 0), tr.STATS.pack(2, 2, 600)),
                (tr.STACK_KEY.pack(7, 0, 2, 2, 0, 0, 0, 0), tr.STATS.pack(1, 1, 400_000)),
                (b"short", b""),
            ]

    class Att:
        maps: dict[str, Any] = {"copy_stacks": Stacks()}

    seen, left_out = tr.read_launched(Att())  # type: ignore[arg-type]
    assert (seen.kind, seen.chain, seen.sp, seen.leaf(), seen.estimated_ns()) == (
        "dtoh",
        0xC4A1,
        0x7FF0,
        "[memcpy dtoh]",
        1200,
    )
    assert left_out.flags == NOT_SAMPLED and left_out.estimated_ns() == 400_000
    assert tr.note(rows, [seen, left_out]) == (
        f"copies and memsets took GPU time too: {PARTS}; 2 of them (599 µs) are not drawn, "
        "as their calls came before the attach, or the process's injection library fires no "
        "launch probe for them (built before 2026-11-29: tools/setup.sh rebuilds it)"
    )
    every = [
        tr.LaunchedCopies(7, 0, t.kind, 1, 0, 0, 1, t.copies, t.bytes, t.device_ns) for t in rows
    ]
    assert tr.note(rows, every) == (
        f"copies and memsets are drawn as [memcpy KIND] and [memset] leaves: {PARTS}"
    )
    assert tr.LaunchedCopies(7, 0, "memset", 1, 0, 0, 1, 1, 1, 1).leaf() == "[memset]"
    assert tr.note([], []) is None


def test_the_watch_frame_names_the_python_function_or_in_scope_system_the_user() -> None:
    from gfxbpf.client.profiles.gpu.transfers import Transfer

    class Att:
        id, scope = 3, "self"

        def map(self, name: str) -> None:
            return None

    view = ck.KernelTimes(Att(), None, "/lib/libgfxcupti-cu13.so", 1.0)  # type: ignore[arg-type]
    view.kernels = [ck.Kernel(42, 0, "gemm", "step (train.py:31)", 4, 2_000_000)]
    view.transfers = [Transfer(42, 0, "htod", 2, 4096, 1000)]
    mine = view.frame(200, None, None)
    assert mine[3].endswith("gemm · step (train.py:31)"), mine
    assert mine[-1].endswith("htod"), mine
    Att.scope = "system"
    admins = view.frame(200, None, None)
    assert admins[1].endswith("by process, kernel and user:"), admins
    assert admins[2].endswith("kernel · user") and admins[3].endswith("gemm · root"), admins
    assert admins[-1].endswith("htod · root"), admins


def test_watch_asks_for_the_least_launch_copy() -> None:
    """watch cuda --gpu names rows by their Python records and never unwinds
    the native copy: it asks for one word of it, not the policy's 72 KiB."""

    class Broker:
        kw: dict[str, Any] = {}

        def attach(self, name: str, **kw: Any) -> str:
            self.kw = {"name": name, **kw}
            return "attached"

    broker = Broker()
    args = argparse.Namespace(scope=None, pid=os.getpid(), library="/opt/libgfxcupti-cu13.so")
    assert ck.attach_program(broker, args) == ("attached", args.library)  # type: ignore[arg-type]
    assert broker.kw["name"] == "cudakernels" and broker.kw["scope"] == "self"
    assert broker.kw["stack_bytes"] == ck.WATCH_STACK_BYTES == 8


def test_a_refused_library_is_told_now_and_after() -> None:
    """Map `refused`: another CUPTI client holds CUPTI now (a refusal within
    two polls), held it for a while (the library subscribed since: result 0),
    or the tries stopped (the probe went) while still refused."""
    from gfxbpf.client.profiles.gpu import refusals as rf

    now = 50 * 10**9
    held = rf.Refusal(pid=7, polls=20, last_ns=now - 10**8, result=39, poll_ms=100)
    assert held.current(now) and held.seconds() == 2.0
    assert "collects nothing now (about 2.0 s while attached)" in held.note(now)
    assert "(CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED); it retries" in held.note(now)
    let_go = rf.Refusal(pid=7, polls=20, last_ns=now - 10**8, result=0, poll_ms=100)
    assert not let_go.current(now)
    assert let_go.note(now).endswith("held CUPTI; it collects again since that client let go")
    stale = rf.Refusal(pid=7, polls=20, last_ns=now - 3 * 10**9, result=39, poll_ms=100)
    assert not stale.current(now) and stale.note(now).endswith(
        "(CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)"
    )
    assert stale.as_json(now) == {
        "pid": 7, "polls": 20, "seconds": 2.0, "result": 39, "current": False
    }  # fmt: skip


def test_refusals_are_read_from_the_map_if_the_program_has_it() -> None:
    from gfxbpf.client.profiles.gpu import refusals as rf

    class Map:
        def raw_items(self) -> list[tuple[bytes, bytes]]:
            return [(rf.KEY.pack(9), rf.REFUSAL.pack(3, 5, 39, 100)), (b"bad", b"")]

    class Att:
        maps: dict[str, Any] = {"refused": Map()}

    assert rf.read_refusals(Att()) == [rf.Refusal(9, 3, 5, 39, 100)]  # type: ignore[arg-type]
    Att.maps = {}  # a broker whose cudakernels has no such map
    assert rf.read_refusals(Att()) == []  # type: ignore[arg-type]


def test_the_watch_names_the_function_that_made_each_copy() -> None:
    """Scope self: copies per innermost Python function, the sampled rows
    scaled by their weight, and what the exact totals hold beyond every row
    (calls made before the attach) under [launch not seen]."""
    from gfxbpf.client.cli.cuda_kernels import NO_LAUNCH, group_copies, transfer_lines
    from gfxbpf.client.profiles.gpu import transfers as tr

    totals = [
        tr.Transfer(7, 0, "htod", 10, 10 << 20, 10_000),
        tr.Transfer(7, 0, "dtoh", 1, 4, 500),
    ]
    launched = [  # 2 htod seen at weight 4, 6 left out by the sampling, 1 dtoh
        tr.LaunchedCopies(7, 0, "htod", LAUNCH_SEEN, 0xA, 0x10, 4, 2, 2 << 20, 2_000),
        tr.LaunchedCopies(7, 0, "htod", NOT_SAMPLED, 0, 0, 0, 6, 6 << 20, 6_000),
        tr.LaunchedCopies(7, 0, "dtoh", LAUNCH_SEEN, 0xB, 0x20, 1, 1, 4, 500),
    ]
    chains = {(7, 0xA): ("<module> (t.py:3)", "load (t.py:9)"), (7, 0xB): ("step (t.py:20)",)}
    sites = group_copies(totals, launched, chains)
    got = [(s.kind, s.function, s.copies, s.bytes, s.device_ns, s.estimated) for s in sites]
    assert got == [
        ("htod", "load (t.py:9)", 8, 8 << 20, 8_000, True),
        ("htod", NO_LAUNCH, 2, 2 << 20, 2_000, False),
        ("dtoh", "step (t.py:20)", 1, 4, 500, False),
    ]
    lines = transfer_lines(totals, 2, False, sites)
    assert lines[1].endswith("rate  kind · python function"), lines
    assert lines[2].split()[:6] == ["7", "~8", "~8.00", "MiB", "~8.00", "µs"], lines
    assert lines[2].endswith("htod · load (t.py:9)") and lines[3].endswith(f"htod · {NO_LAUNCH}")
    assert lines[4] == "  … 1 more rows"
    # Without rows (scope system, or a broker without copy_stacks): per process and kind.
    assert transfer_lines(totals, None, False, [])[2].endswith("  htod")
