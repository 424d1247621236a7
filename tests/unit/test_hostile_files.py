"""An administrator's client against files another user built to hurt it
(issue 35 items 2 to 4), each file crafted here (tests/hostile_elf.py):

- 2: an FDE with a ~4 GiB range raised OverflowError in the table build
  and lost the profile: now the file's table is refused and the stack ends
  in a "[unwind stopped: bad table in FILE]" frame;
- 3: a stripped file's .gnu_debuglink names a file the attacker swaps for a
  FIFO between the check and the read: the read hung in a blocking open;
  now the file checked is read through the descriptor that was checked;
- 4: a large .eh_frame of many small FDEs and no .eh_frame_hdr: bounded per
  file (build.MAX_CFI_BYTES, MAX_FDES) and per run for other users' files
  (tables.FOREIGN_CFI_BYTES).

The kernel half (mallory's process mapping the crafted file, root's system
profile) is tests/kernel/test_client_attacks.py.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from gfxbpf.client.profiles import elfinfo, elfsyms, fileid, symbolize
from gfxbpf.client.profiles.procmaps import Mapping, ProcessMaps
from gfxbpf.client.profiles.unwind import UserRegs, build, marker_frame, unwind
from gfxbpf.client.profiles.unwind import tables as tables_module
from gfxbpf.client.profiles.unwind.result import Stop, stop_text
from gfxbpf.client.profiles.unwind.tables import UnwindTables
from tests import hostile_elf

BASE = 0x7F00_0000_0000


def _tables(tmp_path: Path) -> UnwindTables:
    return UnwindTables(cache_dir=str(tmp_path / "cache"), lazy=False)


def _maps(path: Path) -> ProcessMaps:
    st = os.stat(path)
    code = Mapping(BASE, BASE + 0x3000, "r-xp", 0, "00:00", st.st_ino, str(path))
    stack = Mapping(0x7FFF_0000_0000, 0x7FFF_0001_0000, "rw-p", 0, "00:00", 0, "[stack]")
    return ProcessMaps(pid=7, mappings=[code, stack], comm="victim")


def test_a_4gib_fde_ends_the_stack_in_a_marker_frame(tmp_path: Path) -> None:
    # Sorted by start, the huge FDE comes first and a small one last: the
    # rows' top looked 32-bit while an FDE's end was not (main: OverflowError).
    fdes = [(hostile_elf.CODE_OFFSET, 0xFFFF_FFF0, b""), (hostile_elf.CODE_OFFSET + 16, 4, b"")]
    evil = tmp_path / "libevil.so"
    evil.write_bytes(hostile_elf.shared_object(hostile_elf.eh_frame(fdes)))
    tables = _tables(tmp_path)
    assert tables.file_table(str(evil)) is None
    assert str(evil) in tables.bad and "past the end" in tables.problems[str(evil)]
    maps = _maps(evil)
    regs = UserRegs(BASE + hostile_elf.CODE_OFFSET + 2, 0x7FFF_0000_8000, 0x7FFF_0000_8010)
    stack = struct.pack("<4Q", 0, 0, 0x7FFF_0000_8100, BASE + hostile_elf.CODE_OFFSET + 5)
    result = unwind(regs, stack, maps, tables)
    assert result.stop is Stop.BAD_TABLE and result.frames == (regs.ip,)
    text = stop_text(result.stop, result.where)
    assert marker_frame(text) == f"[unwind stopped: bad table in {evil}]"


def test_fdes_of_discarded_code_are_dropped_not_refused(tmp_path: Path) -> None:
    # A linker's tombstone (start past what the file loads) is no attack.
    fdes = [(hostile_elf.CODE_OFFSET, 6, b""), (0xFFFF_FF00, 0x10, b"")]
    ok = tmp_path / "libok.so"
    ok.write_bytes(hostile_elf.shared_object(hostile_elf.eh_frame(fdes)))
    table = _tables(tmp_path).file_table(str(ok))
    assert table is not None and list(table.func_starts) == [hostile_elf.CODE_OFFSET]


SWAP_AND_BUILD = """
import os, sys
from gfxbpf.client.profiles import elfinfo, elfsyms, fileid, symbolize
from gfxbpf.client.profiles.unwind import build
path, debug = sys.argv[1], sys.argv[2]
checked = elfinfo._crc32
def check_then_swap(*args):
    # The attacker wins the race: right after the check, the path is a FIFO.
    crc = checked(*args)
    os.unlink(debug)
    os.mkfifo(debug)
    return crc
elfinfo._crc32 = check_then_swap
info = elfinfo.read_info(path)
table = build.compile_file(path, info, "/nonexistent")
print("built", table is not None)
"""


def test_a_debug_file_swapped_for_a_fifo_after_its_check_is_never_opened(tmp_path: Path) -> None:
    folder = tmp_path / "mallory"
    folder.mkdir()
    debug = folder / "evil.debug"
    debug.write_bytes(hostile_elf.shared_object(hostile_elf.eh_frame([])))
    crc = zlib.crc32(debug.read_bytes())
    stripped = bytearray(hostile_elf.shared_object(hostile_elf.eh_frame([]), "evil.debug"))
    at = stripped.index(b"evil.debug\0") + 12  # the name, NUL, padding, then the CRC
    stripped[at : at + 4] = struct.pack("<I", crc)
    evil = folder / "libevil.so"
    evil.write_bytes(bytes(stripped))
    info = elfinfo.read_info(str(evil))
    assert info is not None and info.debuglink == ("evil.debug", crc) and not info.has_symtab
    try:
        r = subprocess.run(
            [sys.executable, "-c", SWAP_AND_BUILD, str(evil), str(debug)],
            capture_output=True, text=True, timeout=20,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("the table build hung opening the FIFO swapped in for the debug file")
    assert r.returncode == 0 and "built True" in r.stdout, r.stderr
    assert debug.is_fifo()  # the swap happened: what was read came through the checked fd


def test_a_large_crafted_eh_frame_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Bounds scaled down so the test stays fast: the same code paths as the
    # real limits (16 MiB per file, 300,000 FDEs, 16 MiB per run of others' files).
    monkeypatch.setattr(build, "MAX_CFI_BYTES", 64 << 10)
    monkeypatch.setattr(build, "MAX_FDES", 2000)
    monkeypatch.setattr(tables_module, "may_cache", lambda st: False)  # another user's files
    monkeypatch.setattr(tables_module, "FOREIGN_CFI_BYTES", 1 << 30)
    big = tmp_path / "libbig.so"
    big.write_bytes(hostile_elf.shared_object(hostile_elf.eh_frame(hostile_elf.many_fdes(4000))))
    tables = _tables(tmp_path)
    assert tables.file_table(str(big)) is None
    assert "more than 65536" in tables.problems[str(big)]
    many = tmp_path / "libmany.so"
    many.write_bytes(hostile_elf.shared_object(hostile_elf.eh_frame(hostile_elf.many_fdes(2001))))
    assert tables.file_table(str(many)) is None
    assert "more than 2000 FDEs" in tables.problems[str(many)]
    # The caller's own and root's files are not capped: libtorch_cpu.so's
    # .eh_frame is 18 MB with ~335,000 FDEs, and a refused table cut every
    # PyTorch stack on a GPU host.
    monkeypatch.setattr(tables_module, "may_cache", lambda st: True)
    trusted = _tables(tmp_path)
    assert trusted.file_table(str(big)) is not None and trusted.file_table(str(many)) is not None


def test_other_users_files_share_one_budget_per_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eh = hostile_elf.eh_frame(hostile_elf.many_fdes(100))
    monkeypatch.setattr(tables_module, "may_cache", lambda st: False)  # another user's files
    monkeypatch.setattr(tables_module, "FOREIGN_CFI_BYTES", len(eh) + 10)
    tables = _tables(tmp_path)
    paths = []
    for i in range(2):
        p = tmp_path / f"lib{i}.so"
        p.write_bytes(hostile_elf.shared_object(eh))
        paths.append(str(p))
    assert tables.file_table(paths[0]) is not None
    assert tables.file_table(paths[1]) is None  # the run's budget is spent
    assert "left to parse" in tables.problems[paths[1]]
    # Root's and the caller's own files are not counted against it.
    monkeypatch.setattr(tables_module, "may_cache", lambda st: True)
    assert _tables(tmp_path).file_table(paths[1]) is not None


def test_a_symbol_table_built_to_fill_memory_is_left_out(tmp_path: Path) -> None:
    # 4,000 functions named at different offsets of one 64 KiB string: 128 MB
    # of names from a 160 KB file (main decoded them all).
    bomb = tmp_path / "libbomb.so"
    bomb.write_bytes(hostile_elf.symbol_bomb(4000, 1 << 16))
    assert elfsyms.function_ranges(str(bomb)) == []
    # The same file within a larger allowance: every function, each name decoded once.
    assert len(elfsyms.function_ranges(str(bomb), 256 << 20)) == 4000


def test_other_users_function_names_share_one_budget_per_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fileid, "may_cache", lambda st: False)  # another user's files
    monkeypatch.setattr(symbolize, "FOREIGN_NAME_BYTES", 1 << 20)
    sym = symbolize.Symbolizer(cache_dir=str(tmp_path / "cache"))
    names = []
    for i in range(2):
        lib = tmp_path / f"lib{i}.so"
        lib.write_bytes(hostile_elf.symbol_bomb(100, 12_000))  # ~600 KB of names each
        fd, st = fileid.open_regular(str(lib))
        try:
            table = sym._load_or_parse(str(lib), fd, st)
        finally:
            os.close(fd)
        assert table is not None
        names.append(len(table.ends))
    assert names == [100, 0], names  # the second would pass the run's 1 MiB
    assert sym.foreign_names < 1 << 19
