"""A futex word's name: the symbol of the variable that covers it (a global
mutex: `lock_a`; a member of one: `pool+0x28`), else its mapping and offset
(`libfoo.so+0x1c40`, `[heap]+0x2a0`, `[anon]+0x10`).

A global lives in a file's writable segment; its tail (.bss past the file's
last page) is an anonymous mapping right after the file's own, at the same
load bias. The symbols come from the file's .symtab and .dynsym (STT_OBJECT
and STT_TLS are never futex words of a running lock: objects only)."""

from __future__ import annotations

import bisect
import os
import struct
from typing import TYPE_CHECKING

from gfxbpf.elf.reader import ElfError, ElfFile, open_elf
from gfxbpf.elf.symbols import SHN_UNDEF, SymbolFormatError

if TYPE_CHECKING:
    from gfxbpf.client.profiles.procmaps import Mapping, ProcessMaps

STT_OBJECT = 1
PT_LOAD = 1
_TABLES = (".symtab", ".dynsym")


class FileObjects:
    """One ELF file's data symbols by address and its loaded segments."""

    def __init__(self, path: str) -> None:
        self.starts: list[int] = []
        self.symbols: list[tuple[int, int, str]] = []  # (address, size, name), sorted
        self.segments: list[tuple[int, int, int]] = []  # (file offset, size, vaddr)
        try:
            fd, elf = open_elf(path)
        except (OSError, ValueError, struct.error):
            return
        try:
            self._read(elf)
        except (OSError, ValueError, struct.error):
            pass  # what was read so far serves
        finally:
            os.close(fd)

    def _read(self, elf: ElfFile) -> None:
        self.segments = [(s.offset, s.filesz, s.vaddr) for s in elf.loads() if s.type == PT_LOAD]
        found: set[tuple[int, int, str]] = set()
        for table_name in _TABLES:
            try:
                table = elf.symbol_table(table_name)
                entries = table.symbols() if table is not None else []
            except (ElfError, SymbolFormatError):
                continue
            for _i, name, value, size, kind, _bind, _vis, shndx in entries:
                if kind == STT_OBJECT and shndx != SHN_UNDEF and size and name:
                    found.add((value, size, name))
        self.symbols = sorted(found)
        self.starts = [a for a, _, _ in self.symbols]

    def vaddr(self, file_offset: int) -> int | None:
        """The address the file's headers give the byte at file_offset."""
        for off, size, vaddr in self.segments:
            if off <= file_offset < off + max(size, 1):
                return vaddr + file_offset - off
        return None

    def symbol_at(self, vaddr: int) -> str | None:
        """The object covering vaddr, with the offset into it past its start
        (the nearest few below vaddr are looked at: objects rarely overlap)."""
        i = bisect.bisect_right(self.starts, vaddr)
        for start, size, name in reversed(self.symbols[max(0, i - 8) : i]):
            if start <= vaddr < start + size:
                return name if vaddr == start else f"{name}+{vaddr - start:#x}"
        return None


class LockNames:
    """Names futex words of the profiled processes, one file read once."""

    def __init__(self) -> None:
        self._files: dict[str, FileObjects] = {}
        self._names: dict[tuple[int, int], str] = {}

    def name(self, maps: ProcessMaps | None, uaddr: int) -> str:
        """uaddr's name in this process (maps: its /proc/PID/maps snapshot)."""
        if maps is None:
            return f"[process gone]+{uaddr & 0xFFF:#x}"  # its layout is unknown
        key = (maps.pid, uaddr)
        found = self._names.get(key)
        if found is None:
            found = self._names[key] = self._name(maps, uaddr)
        return found

    def _name(self, maps: ProcessMaps, uaddr: int) -> str:
        m = maps.find(uaddr)
        if m is None:
            return "[unmapped]"
        owner = m if m.is_file else _file_before(maps, m)
        if owner is not None:
            named = self._symbol(maps, owner, uaddr)
            if named is not None:
                return named
        if m.is_file:
            return f"{os.path.basename(m.file_path)}+{m.offset + uaddr - m.start:#x}"
        return f"{m.path or '[anon]'}+{uaddr - m.start:#x}"

    def _symbol(self, maps: ProcessMaps, m: Mapping, uaddr: int) -> str | None:
        path = maps.local_path(m)
        objects = self._files.get(path)
        if objects is None:
            objects = self._files[path] = FileObjects(path)
        # The load bias from the file mapping (for .bss past it: the same bias).
        base = objects.vaddr(m.offset)
        if base is None:
            return None
        return objects.symbol_at(base + uaddr - m.start)


def _file_before(maps: ProcessMaps, m: Mapping) -> Mapping | None:
    """The writable file mapping an anonymous one continues (a file's .bss)."""
    before = maps.find(m.start - 1)
    if before is not None and before.is_file and before.end == m.start and "w" in before.perms:
        return before
    return None
