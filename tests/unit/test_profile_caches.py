"""The caches that let gfxclient profile name stacks while sampling: a maps
snapshot that adds nothing keeps the names found; one that changes a mapping
drops them; warm() names stacks ahead of symbolize(); the depth note follows
the stack table's depth; the count rows parse the same in bulk; a polled
process's maps are parsed again only when what they are read from changed."""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gfxbpf.client.profiles import procmaps
from gfxbpf.client.profiles import read as profile_read
from gfxbpf.client.profiles.engine import snapshots
from gfxbpf.client.profiles.model import RawStack
from gfxbpf.client.profiles.procmaps import Mapping, PerfMapEntry, ProcessMaps
from gfxbpf.client.profiles.stackcheck import StackCheck, classify
from gfxbpf.client.profiles.symbolize import Symbolizer

HEAP = Mapping(0x1000, 0x2000, "rw-p", 0, "00:00", 0, "[heap]")
STACK = Mapping(0x5000, 0x6000, "rw-p", 0, "00:00", 0, "[stack]")


def _maps(*mappings: Mapping, perf: tuple[PerfMapEntry, ...] = ()) -> ProcessMaps:
    return ProcessMaps(pid=7, mappings=list(mappings), perf_map=list(perf), comm="prog")


def test_merge_says_whether_a_snapshot_changed_anything() -> None:
    m = _maps(HEAP)
    assert m.merge(_maps(HEAP)) is False
    assert m.merge(_maps(HEAP, STACK)) is True and m.find(0x5800) == STACK
    assert m.merge(_maps(STACK)) is False, "a range seen before is kept, not new"
    jit = PerfMapEntry(0x1100, 0x10, "jitted")
    assert m.merge(_maps(perf=(jit,))) is True and m.find_perf(0x1104) == jit


def test_merge_drops_earlier_mappings_a_later_snapshot_overlaps() -> None:
    """A mapping gone since an earlier snapshot (memory unmapped, then a library
    mapped over its range; the loader's steps while it maps one) was kept
    beside its replacement: find() took the one starting last below an
    address, and a leftover starting inside a library's text hid the rest of
    that text ("not code")."""
    libc_text = Mapping(0x7000, 0x9000, "r-xp", 0x26000, "00:02", 17, "/lib/libc.so.6")
    held = [
        Mapping(0x7400, 0x7800, "rw-p", 0, "00:00", 0, ""),  # inside libc's text later
        Mapping(0x6000, 0x7100, "r-xp", 0, "00:02", 30, "/lib/libgrpc.so"),  # straddles it
        Mapping(0xC000, 0xD000, "r-xp", 0, "00:02", 31, "/lib/libold.so"),  # overlapped by none
    ]
    m = _maps(*held)
    assert m.merge(_maps(HEAP, libc_text)) is True
    assert m.find(0x7500) == libc_text and m.find(0x8F00) == libc_text
    assert m.find(0x6800) is None, "the straddling mapping was replaced"
    assert m.find(0xC800) == held[2], "a mapping nothing replaced still names older samples"
    pairs = itertools.pairwise(m.mappings)
    assert all(a.end <= b.start for a, b in pairs), "find() needs sorted ranges that do not overlap"


def test_warm_names_ahead_and_a_changed_snapshot_renames() -> None:
    sym = Symbolizer(cache_dir="/nonexistent")
    sym.add_process(7, _maps(HEAP))
    sym.warm(7, [(0x1800,)])
    assert sym._users and sym._frames  # named while sampling
    sym.add_process(7, _maps(HEAP))  # the usual snapshot: nothing new
    assert sym._users, "an unchanged snapshot keeps the names found"
    prof = sym.symbolize([RawStack(7, (0x5800,), False, 2)], "samples")
    assert prof.stacks == {("prog", "[unknown]"): 2}
    sym.add_process(7, _maps(HEAP, STACK))  # a new mapping: names may change
    assert not sym._users and not sym._frames
    prof = sym.symbolize([RawStack(7, (0x5800,), False, 2)], "samples")
    assert prof.stacks == {("prog", "[stack]"): 2}


def test_depth_note_follows_the_stack_tables_depth() -> None:
    sym = Symbolizer(cache_dir="/nonexistent")
    sym.stack_depth = 32
    sym.add_process(7, _maps(HEAP))
    deep = tuple(range(0x1000, 0x1000 + 32 * 8, 8))
    prof = sym.symbolize([RawStack(7, deep, False, 1)], "samples")
    assert any("are 32 frames or deeper" in n for n in prof.notes), prof.notes


def test_add_kind_counts_as_add_does() -> None:
    frames = [("_start", "/bin/x"), ("main", "/bin/x"), ("f", "/lib/y.so")]
    cut = [("g", "/lib/y.so"), ("f", "/lib/y.so")]
    a, b = StackCheck(max_depth=3), StackCheck(max_depth=3)
    for fr, w in ((frames, 2), (cut, 5), (cut * 2, 1)):
        a.add(fr, w)
        b.add_kind(classify(fr, 3), w)
    assert a == b
    assert (a.complete, a.cut["/lib/y.so"], a.too_deep) == (2, 5, 1)
    assert a.objects == {"/bin/x", "/lib/y.so"}


def test_count_rows_parse_in_bulk_as_one_by_one() -> None:
    stacks = {3: (0x401000, 0x402000), 9: (0x403000,)}
    rows = [
        (profile_read.SAMPLE_KEY.pack(7, 3, 0, b"prog"), profile_read.U64.pack(4)),
        (profile_read.SAMPLE_KEY.pack(7, 9, 1, b"prog"), profile_read.U64.pack(1)),
        (profile_read.SAMPLE_KEY.pack(8, -17, 0, b"other"), profile_read.U64.pack(2)),
        (profile_read.SAMPLE_KEY.pack(7, 5, 0, b"prog"), profile_read.U64.pack(6)),
    ]
    assert profile_read.stack_ids(rows) == {3, 9, 5}
    got = profile_read.profile_stacks(rows, stacks, [7])
    assert [(r.pid, r.user, r.kernel, r.weight, r.comm, r.user_error) for r in got] == [
        (7, (0x401000, 0x402000), False, 4, "prog", None),
        (7, (0x403000,), True, 1, "prog", None),
        (7, (), False, 6, "prog", "stack not in the table when read"),
    ]
    (lost,) = profile_read.profile_stacks(rows[2:3], stacks)
    assert lost.user_error == "stack table collision (another stack holds its slot)"


# Waits on stdin; a line maps 1 MiB more (and answers), the next ends it.
_MAPPER = "import mmap,sys; input(); m=mmap.mmap(-1,1<<20); print(1,flush=True); input()"


@contextlib.contextmanager
def _idle_child() -> Iterator[subprocess.Popen[str]]:
    """A process whose maps stay put until told to map more (this one's own
    heap moves as the test allocates)."""
    with subprocess.Popen([sys.executable, "-c", _MAPPER], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as child:  # fmt: skip
        try:
            yield child
        finally:
            child.kill()


def _map_more(child: subprocess.Popen[str]) -> None:
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write("\n")
    child.stdin.flush()
    assert child.stdout.readline() == "1\n"


def test_snapshot_state_changes_with_the_maps_and_the_perf_map(tmp_path: Path) -> None:
    with _idle_child() as child:
        time.sleep(0.2)  # its interpreter started
        before = procmaps.snapshot_state(child.pid, str(tmp_path))
        assert before is not None and before == procmaps.snapshot_state(child.pid, str(tmp_path))
        perf = tmp_path / f"perf-{child.pid}.map"
        perf.write_text("1000 10 jitted\n")
        with_perf = procmaps.snapshot_state(child.pid, str(tmp_path))
        st = perf.stat()
        assert with_perf is not None and with_perf[1] == (st.st_size, st.st_mtime_ns)
        _map_more(child)
        after = procmaps.snapshot_state(child.pid, str(tmp_path))
        assert after is not None and after[0] != before[0]
    assert procmaps.snapshot_state(2**22 + 1, str(tmp_path)) is None  # no such pid


def test_polled_maps_are_parsed_only_when_they_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[int] = []
    real = procmaps.capture

    def counting(pid: int, perf_map_dir: str = "/tmp", text: str | None = None) -> Any:
        parsed.append(pid)
        return real(pid, perf_map_dir, text)

    monkeypatch.setattr(snapshots, "capture", counting)
    maps = snapshots.Maps(Symbolizer(cache_dir="/nonexistent"))
    with _idle_child() as child:
        time.sleep(0.2)
        for _ in range(3):
            maps.capture([child.pid])
        assert parsed == [child.pid], "an unchanged process is parsed once"
        _map_more(child)
        maps.capture([child.pid])
        assert parsed == [child.pid] * 2 and child.pid in maps.procs


_LOADER = (
    "import mmap,os,sys; input(); fd=os.open('/bin/true',os.O_RDONLY);"
    "m=mmap.mmap(fd,0,prot=mmap.PROT_READ|mmap.PROT_EXEC); print(1,flush=True); input()"
)


def test_the_watcher_keeps_maps_the_sampling_loop_was_too_slow_to_read() -> None:
    """The sampling loop can be held up for seconds (a large file's first unwind
    tables on a slow machine): a process that mapped its libraries and exited
    meanwhile was named from its snapshot before them ("not code" above
    Py_BytesMain in a guest on Linux 6.1). The thread read them while it lived."""
    maps = snapshots.Maps(Symbolizer(cache_dir="/nonexistent"))
    with subprocess.Popen([sys.executable, "-c", _LOADER], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as child:  # fmt: skip
        time.sleep(0.2)
        maps.watched = (child.pid,)
        maps.capture([child.pid])  # before the "library"
        first = maps.procs[child.pid]
        assert not any(m.path == os.path.realpath("/bin/true") for m in first.mappings)
        maps.watch()
        try:
            _map_more(child)  # now it maps it ...
            deadline = time.monotonic() + 30  # ... while this loop is busy elsewhere
            while not maps._waiting.get(child.pid) and time.monotonic() < deadline:
                time.sleep(snapshots.WATCH_S)
            assert child.stdin is not None
            child.stdin.close()
            child.wait()  # ... and is gone before the loop looks again
            maps.capture([child.pid])
        finally:
            maps.stop_watching()
    true = os.path.realpath("/bin/true")
    assert any(m.path == true and m.executable for m in maps.procs[child.pid].mappings)
    assert maps.procs[child.pid] is first, "merged into the picture the unwinder holds"


def test_the_watcher_stays_idle_while_the_loop_polls() -> None:
    """No second read of every target while the sampling loop keeps up (a
    family of hundreds of processes would pay it twice)."""
    maps = snapshots.Maps(Symbolizer(cache_dir="/nonexistent"))
    with _idle_child() as child:
        time.sleep(0.2)
        maps.poll([child.pid])
        maps.polled_at = time.monotonic() + 3600  # a loop that has just polled, always
        maps.watch()
        try:
            _map_more(child)
            time.sleep(4 * snapshots.WATCH_S)
            assert not maps._waiting.get(child.pid), "read while the loop keeps up"
            maps.polled_at = 0.0  # the loop stalls
            deadline = time.monotonic() + 30
            while not maps._waiting.get(child.pid) and time.monotonic() < deadline:
                time.sleep(snapshots.WATCH_S)
            assert maps._waiting.get(child.pid), "the watcher reads once the loop stalls"
        finally:
            maps.stop_watching()
