"""An ELF file's headers, read with struct and pread: the program headers, the
section headers with their names, and a section's bytes on demand.

pyelftools builds objects for every section it meets (the .gnu.hash table of a
large library included), which costs half a second on libLLVM for facts that
take a millisecond here. Nothing is trusted: counts and ranges are checked
against the file's size before anything is read.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

__all__ = ["ElfHeaders", "ElfFormatError", "Section", "open_elf"]

PT_LOAD, PT_NOTE = 1, 4
SHT_NOBITS = 8
_SHN_XINDEX = 0xFFFF
_MAX_HEADERS = 1 << 16  # more section or program headers than this is corrupt


class ElfFormatError(ValueError):
    pass


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    offset: int
    size: int
    link: int
    entsize: int


@dataclass(frozen=True)
class _Layout:
    ehdr: struct.Struct  # after e_ident: e_type .. e_shstrndx
    phdr: struct.Struct
    shdr: struct.Struct


def _layout(is64: bool, order: str) -> _Layout:
    if is64:
        return _Layout(
            struct.Struct(order + "HHIQQQIHHHHHH"),
            struct.Struct(order + "IIQQQQQQ"),
            struct.Struct(order + "IIQQQQIIQQ"),
        )
    return _Layout(
        struct.Struct(order + "HHIIIIIHHHHHH"),
        struct.Struct(order + "IIIIIIII"),
        struct.Struct(order + "IIIIIIIIII"),
    )


class ElfHeaders:
    """Headers of the open file fd (the caller keeps it open while using this)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.size = os.fstat(fd).st_size
        ident = self.read(0, 16)
        if ident[:4] != b"\x7fELF" or ident[4] not in (1, 2) or ident[5] not in (1, 2):
            raise ElfFormatError("not an ELF file")
        self.is64 = ident[4] == 2
        self.order = "<" if ident[5] == 1 else ">"
        lay = _layout(self.is64, self.order)
        e = lay.ehdr.unpack(self.read(16, lay.ehdr.size))
        self.machine = e[1]
        self.segments = self._segments(lay, phoff=e[4], phentsize=e[8], phnum=e[9])
        self.sections = self._sections(lay, shoff=e[5], shentsize=e[10], shnum=e[11], strndx=e[12])

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise ElfFormatError(f"a header points past the end of the file ({offset:#x})")
        data = os.pread(self.fd, length, offset)
        if len(data) != length:
            raise ElfFormatError("short read")
        return data

    def _table(self, offset: int, entsize: int, count: int, entry: struct.Struct) -> list[tuple]:
        if count > _MAX_HEADERS or (count and entsize < entry.size):
            raise ElfFormatError("corrupt header table")
        raw = self.read(offset, entsize * count)
        return [entry.unpack_from(raw, i * entsize) for i in range(count)]

    def _segments(
        self, lay: _Layout, phoff: int, phentsize: int, phnum: int
    ) -> list[tuple[int, int, int, int]]:
        """(p_type, p_offset, p_vaddr, p_filesz) of every program header."""
        out = []
        for p in self._table(phoff, phentsize, phnum, lay.phdr):
            if self.is64:  # type, flags, offset, vaddr, paddr, filesz, ...
                out.append((p[0], p[2], p[3], p[5]))
            else:  # type, offset, vaddr, paddr, filesz, ...
                out.append((p[0], p[1], p[2], p[4]))
        return out

    def _sections(
        self, lay: _Layout, shoff: int, shentsize: int, shnum: int, strndx: int
    ) -> list[Section]:
        if not shoff:
            return []
        if shnum == 0 or strndx == _SHN_XINDEX:  # the real values live in section 0
            first = self._table(shoff, shentsize, 1, lay.shdr)[0]
            shnum = shnum or first[5]
            strndx = first[6] if strndx == _SHN_XINDEX else strndx
        rows = self._table(shoff, shentsize, shnum, lay.shdr)
        # name, type, flags, addr, offset, size, link, info, align, entsize
        names = b""
        if 0 < strndx < len(rows) and rows[strndx][1] != SHT_NOBITS:
            names = self.read(rows[strndx][4], rows[strndx][5])
        return [Section(_cstr(names, r[0]), r[1], r[4], r[5], r[6], r[9]) for r in rows]

    def section(self, name: str) -> Section | None:
        return next((s for s in self.sections if s.name == name), None)

    def data(self, sec: Section) -> bytes:
        if sec.type == SHT_NOBITS:
            return b""
        return self.read(sec.offset, sec.size)


def _cstr(table: bytes, start: int) -> str:
    if not 0 <= start < len(table):
        return ""
    end = table.find(b"\0", start)
    return table[start : end if end >= 0 else len(table)].decode("utf-8", "replace")


def open_elf(path: str) -> tuple[int, ElfHeaders]:
    """(fd, headers); the caller closes fd. Raises OSError or ElfFormatError."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return fd, ElfHeaders(fd)
    except BaseException:
        os.close(fd)
        raise
