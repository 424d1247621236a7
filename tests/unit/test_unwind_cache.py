"""Unwind tables in memory and on disk: keyed by build-id and file identity,
kept only for files of the caller or root, only in a folder private to the
caller, and read through the process's root like the symbolizer does."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

import pytest

from gfxbpf.client.profiles.elfinfo import read_info
from gfxbpf.client.profiles.elfsyms import function_ranges
from gfxbpf.client.profiles.fileid import cache_key
from gfxbpf.client.profiles.procmaps import Mapping, ProcessMaps
from gfxbpf.client.profiles.unwind import Stop, UnwindTables, cache
from gfxbpf.client.profiles.unwind.compiled import CFA_NONE, NO_RULE, FileTable

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"


@pytest.fixture
def lib(tmp_path: Path) -> Path:
    """A copy of libc: a real ELF file this test may touch and chown."""
    if not os.path.exists(LIBC):
        pytest.skip(f"{LIBC} is not on this machine")
    copy = tmp_path / "files" / "libc.so.6"
    copy.parent.mkdir()
    shutil.copy(LIBC, copy)
    return copy


def _cached(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_the_format_round_trips_and_refuses_damage(lib: Path, tmp_path: Path) -> None:
    table = UnwindTables(cache_dir=str(tmp_path / "c")).file_table(str(lib))
    assert table is not None and len(table.starts) > 10_000
    data = cache.encode(table)
    back = cache.decode(data)
    assert back == table
    for bad in (data[:-1], data[:100], b"GFXUNW1\n" + data[8:], b""):  # 1: older format
        assert cache.decode(bad) is None


def test_a_second_run_loads_instead_of_parsing(lib: Path, tmp_path: Path) -> None:
    folder = tmp_path / "c"
    first = UnwindTables(cache_dir=str(folder))
    a = first.file_table(str(lib))
    assert (first.parsed, first.cache_hits) == (1, 0)
    st = os.stat(lib)
    assert _cached(folder) == [cache_key(first_build_id(lib), st)]
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    second = UnwindTables(cache_dir=str(folder))
    b = second.file_table(str(lib))
    assert (second.parsed, second.cache_hits) == (0, 1)
    assert a == b
    # In memory: the same object, no second load.
    assert second.file_table(str(lib)) is b and second.cache_hits == 1


def first_build_id(path: Path) -> str | None:
    from gfxbpf.client.profiles.elfinfo import read_info

    info = read_info(str(path))
    return info.build_id if info else None


def test_a_changed_file_is_parsed_again(lib: Path, tmp_path: Path) -> None:
    folder = tmp_path / "c"
    UnwindTables(cache_dir=str(folder)).file_table(str(lib))
    later = time.time() + 5
    os.utime(lib, (later, later))  # same build-id, another identity
    again = UnwindTables(cache_dir=str(folder))
    again.file_table(str(lib))
    assert (again.parsed, again.cache_hits) == (1, 0)
    assert len(_cached(folder)) == 2


def test_another_users_file_is_parsed_but_never_cached(lib: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    os.chown(lib, 65534, 65534)
    folder = tmp_path / "c"
    tables = UnwindTables(cache_dir=str(folder))
    assert tables.file_table(str(lib)) is not None and tables.parsed == 1
    assert _cached(folder) == []


def test_a_cache_folder_others_may_write_is_not_used(lib: Path, tmp_path: Path) -> None:
    folder = tmp_path / "c"
    good = UnwindTables(cache_dir=str(folder)).file_table(str(lib))
    assert good is not None and len(_cached(folder)) == 1
    folder.chmod(0o777)  # anyone could have planted what is in it
    tables = UnwindTables(cache_dir=str(folder))
    tables.file_table(str(lib))
    assert (tables.parsed, tables.cache_hits) == (1, 0)
    folder.chmod(0o700)
    if os.geteuid() == 0:  # a planted file of another user in a private folder
        (entry,) = folder.iterdir()
        os.chown(entry, 65534, 65534)
        again = UnwindTables(cache_dir=str(folder))
        again.file_table(str(lib))
        assert (again.parsed, again.cache_hits) == (1, 0)


def test_memory_is_bounded(lib: Path, tmp_path: Path) -> None:
    other = lib.parent / "libc-copy.so.6"
    shutil.copy(lib, other)
    tables = UnwindTables(cache_dir=str(tmp_path / "c"), memory_limit=1)
    tables.file_table(str(lib))
    tables.file_table(str(other))
    assert len(tables._files) == 1  # the older one was dropped


def _maps(root: str, path: str, inode: int, offset: int = 0x26000) -> ProcessMaps:
    return ProcessMaps(
        pid=99,
        mappings=[
            Mapping(0x7F00_0000_0000, 0x7F00_0010_0000, "r-xp", offset, "00:00", inode, path)
        ],
        root=root,
    )


def _function_in(lib: Path) -> tuple[int, int]:
    """(a page-aligned file offset to map lib's code at, the offset of an exported
    function's first byte from there): the layout differs between libc builds."""
    info = read_info(str(lib))
    assert info is not None
    for vaddr, _, _name in function_ranges(str(lib)):
        for off, seg_vaddr, size in info.segments:
            if seg_vaddr <= vaddr < seg_vaddr + size:
                file_off = vaddr - seg_vaddr + off
                return file_off & ~0xFFF, file_off & 0xFFF
    raise AssertionError(f"no function found in {lib}")


def test_files_are_read_through_the_process_root(lib: Path, tmp_path: Path) -> None:
    # A process in a container sees /lib/libc.so.6 inside its root.
    root = tmp_path / "root"
    (root / "lib").mkdir(parents=True)
    shutil.copy(lib, root / "lib" / "libc.so.6")
    ino = os.stat(root / "lib" / "libc.so.6").st_ino
    tables = UnwindTables(cache_dir=str(tmp_path / "c"))
    offset, inside = _function_in(lib)
    maps = _maps(str(root), "/lib/libc.so.6", ino, offset)
    pc = 0x7F00_0000_0000 + inside
    where = tables.resolver(maps)(pc)
    assert where is not None and where[2] is None and where[0] is not None
    assert where[0].rule(pc + where[1]).cfa != CFA_NONE


def test_a_replaced_file_is_not_trusted(lib: Path, tmp_path: Path) -> None:
    tables = UnwindTables(cache_dir=str(tmp_path / "c"))
    maps = _maps("", str(lib), os.stat(lib).st_ino + 1)  # mapped, then replaced
    assert tables.resolver(maps)(0x7F00_0000_0100) == (None, 0, Stop.NO_FILE)
    assert "replaced" in tables.problems[str(lib)]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # never blocks the client
    assert tables.file_table(str(fifo)) is None


def test_prepare_builds_every_executable_mapping(lib: Path, tmp_path: Path) -> None:
    ino = os.stat(lib).st_ino
    maps = _maps("", str(lib), ino)
    maps.mappings.append(
        Mapping(0x7F00_0020_0000, 0x7F00_0030_0000, "r--p", 0, "00:00", ino, str(lib))
    )
    tables = UnwindTables(cache_dir=str(tmp_path / "c"))
    tables.prepare(maps)
    assert tables.parsed == 1 and len(tables._files) == 1


def test_the_symbolizer_marks_and_counts_stopped_stacks(tmp_path: Path) -> None:
    from gfxbpf.client.profiles.model import RawStack
    from gfxbpf.client.profiles.procmaps import capture
    from gfxbpf.client.profiles.symbolize import Symbolizer

    maps = capture(os.getpid())
    assert maps is not None
    code = next(m for m in maps.mappings if m.executable and m.is_file)
    sym = Symbolizer(cache_dir=str(tmp_path / "sym"))
    sym.add_process(os.getpid(), maps)
    addr = code.start + 0x10
    raw = [
        RawStack(os.getpid(), (addr,), False, 5, comm="me", unwind_stop="truncated"),
        RawStack(os.getpid(), (addr,), False, 95, comm="me"),
    ]
    prof = sym.symbolize(raw, "samples")
    stopped = [k for k in prof.stacks if "[unwind stopped: stack copy too short]" in k]
    assert len(stopped) == 1 and stopped[0][1] == "[unwind stopped: stack copy too short]"
    assert prof.stacks[stopped[0]] == 5
    assert any(n.startswith("5.0% of the user stacks stop early") for n in prof.notes), prof.notes


def test_a_large_file_is_served_by_its_search_table_while_compiled_aside(
    lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gfxbpf.client.profiles.unwind import lazy

    monkeypatch.setattr(lazy, "LAZY_MIN_BYTES", 0)  # libc stands in for libtorch
    full = UnwindTables(cache_dir=str(tmp_path / "full"), lazy=False).file_table(str(lib))
    folder = tmp_path / "c"
    tables = UnwindTables(cache_dir=str(folder))
    quick = tables.file_table(str(lib))
    assert isinstance(quick, lazy.LazyTable) and isinstance(full, FileTable)
    # Every row of the whole table, and the byte before and after it, agree.
    for vaddr in full.starts:
        for probe in (vaddr - 1, vaddr, vaddr + 1):
            assert quick.rule(probe) == full.rule(probe), hex(probe)
    for start, end in zip(full.func_starts, full.func_ends, strict=True):
        assert quick.function(start) == full.function(start) == (start, end)
    tables.wait(60)
    assert isinstance(tables.file_table(str(lib)), FileTable)  # swapped in once compiled
    again = UnwindTables(cache_dir=str(folder))
    assert isinstance(again.file_table(str(lib)), FileTable) and again.cache_hits == 1


def test_a_file_past_the_whole_table_limits_is_served_by_its_search_table_only(
    lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PyTorch 2.13's libtorch_cpu.so holds 18 MB of .eh_frame and 335,000 FDEs,
    past what build.py compiles whole: a file of root's or the caller's is
    served FDE by FDE (never compiled whole, never cached); another user's is
    still refused whole."""
    from gfxbpf.client.profiles.unwind import build, lazy
    from gfxbpf.client.profiles.unwind import tables as tables_module

    full = UnwindTables(cache_dir=str(tmp_path / "full"), lazy=False).file_table(str(lib))
    assert isinstance(full, FileTable)
    monkeypatch.setattr(lazy, "LAZY_MIN_BYTES", 0)
    monkeypatch.setattr(build, "MAX_CFI_BYTES", 1024)  # libc stands in for libtorch
    tables = UnwindTables(cache_dir=str(tmp_path / "c"))
    quick = tables.file_table(str(lib))
    assert isinstance(quick, lazy.LazyTable) and not quick.whole()
    assert tables.compiling == [] and not (tmp_path / "c").exists()
    for vaddr in full.starts[:: max(1, len(full.starts) // 500)]:
        assert quick.rule(vaddr) == full.rule(vaddr), hex(vaddr)
    monkeypatch.setattr(tables_module, "may_cache", lambda st: False)  # another user's file
    other = UnwindTables(cache_dir=str(tmp_path / "o"))
    assert other.file_table(str(lib)) is None and str(lib) in other.bad


def test_remembered_steps_are_the_lookups_and_follow_the_mappings(
    lib: Path, tmp_path: Path
) -> None:
    tables = UnwindTables(cache_dir=str(tmp_path / "c"))
    offset, inside = _function_in(lib)
    maps = _maps("", str(lib), os.stat(lib).st_ino, offset)
    step, resolve = tables.stepper(maps), tables.resolver(maps)
    for pc in (0x7F00_0000_0000 + inside, 0x7F00_0000_0000 + inside + 1, 0x1000):
        where = resolve(pc)
        for exact in (True, False):
            want = where[0].rule(pc + where[1] - (not exact)) if where and where[0] else NO_RULE
            assert step(pc, exact) == (where, want)
            assert step(pc, exact) == (where, want), "remembered: the same answer"
    code = maps.mappings[0]
    # Remapped lower (same pid, new snapshot): the old steps no longer hold.
    moved = ProcessMaps(pid=99, mappings=[replace(code, start=code.start >> 1, end=code.end >> 1)])
    assert tables.stepper(moved)(0x7F00_0000_0000 + inside, True) == (None, NO_RULE)
    first = resolve(0x7F00_0000_0000 + inside)
    got, rule = tables.stepper(moved)((code.start >> 1) + inside, True)
    assert first is not None and first[0] is not None and got is not None
    assert got[0] is first[0] and rule == first[0].rule(0x7F00_0000_0000 + inside + first[1])
