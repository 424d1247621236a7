"""An ELF file read with struct and pread: its header, section and program
headers, notes (build-id, .gnu_debuglink) and symbol tables.

The one ELF reader of the project. The broker's uprobe symbol index
(bpf/symbols.py: a function name -> its file offset) and the client's
symbolizer (client/profiles: an address -> a function name, build-ids for its
cache) both sit on it. Only the bytes asked for are read, so the headers of
a 100 MB library cost well under a millisecond; a symbol table is read whole
and unpacked with one precompiled struct. Nothing is trusted: every range is
checked against the file's size before it is read, and any violation is an
ElfError naming the file and what was wrong. It only reads files, so the
client may import it.
"""

from __future__ import annotations

import array
import os
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "PT_LOAD",
    "PT_NOTE",
    "SHN_UNDEF",
    "SHT_NOBITS",
    "STT_FUNC",
    "STT_GNU_IFUNC",
    "ElfError",
    "ElfFile",
    "Section",
    "Segment",
    "SymbolTable",
    "open_elf",
]

PT_LOAD, PT_NOTE = 1, 4
SHT_NOTE, SHT_NOBITS, SHT_GNU_VERSYM = 7, 8, 0x6FFFFFFF
SHN_UNDEF, SHN_XINDEX = 0, 0xFFFF
STT_FUNC, STT_GNU_IFUNC = 2, 10
_FUNC_TYPES = (STT_FUNC, STT_GNU_IFUNC)
_NT_GNU_BUILD_ID = 3
_MAX_READ = 512 << 20  # no real table comes near this; a corrupt size might
_MAX_NOTE = 1 << 20  # no real note area is this large


class ElfError(ValueError):
    """The file is not ELF, or a header or table in it is corrupt."""


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    addr: int
    offset: int
    size: int
    link: int
    entsize: int


@dataclass(frozen=True)
class Segment:
    """One program header: what the loader maps from where."""

    type: int
    offset: int
    vaddr: int
    filesz: int


@dataclass(frozen=True)
class _Layout:
    """The struct formats of one ELF class and byte order."""

    ehdr: struct.Struct  # e_type .. e_shstrndx (after e_ident)
    shdr: struct.Struct
    phdr: struct.Struct
    sym: struct.Struct
    sym_fields: tuple[int, int, int, int, int]  # positions of name, info, shndx, value, size


def _layout(is64: bool, order: str) -> _Layout:
    if is64:
        return _Layout(
            struct.Struct(order + "HHIQQQIHHHHHH"),
            struct.Struct(order + "IIQQQQIIQQ"),
            struct.Struct(order + "IIQQQQQQ"),
            struct.Struct(order + "IBBHQQ"),
            (0, 1, 3, 4, 5),
        )
    return _Layout(
        struct.Struct(order + "HHIIIIIHHHHHH"),
        struct.Struct(order + "IIIIIIIIII"),
        struct.Struct(order + "IIIIIIII"),
        struct.Struct(order + "IIIBBH"),
        (0, 3, 5, 1, 2),
    )


@dataclass(frozen=True)
class SymbolTable:
    """One symbol table's raw entries and strings, checked but not yet parsed:
    callers loop over entry.iter_unpack(data) themselves (the hot loop of a
    first uprobe attach), picking fields by the positions in `fields`."""

    name: str  # ".dynsym" or ".symtab"
    data: bytes
    strings: bytes
    entry: struct.Struct
    fields: tuple[int, int, int, int, int]  # name, info, shndx, value, size
    versions: array.array[int]  # .gnu.version of .dynsym (u16 per symbol), or empty

    def named(self) -> Iterator[tuple[int, str, tuple[int, ...]]]:
        """(index, name, raw entry) of every symbol with a name."""
        i_name = self.fields[0]
        strings, find = self.strings, self.strings.find
        for i, s in enumerate(self.entry.iter_unpack(self.data)):
            start = s[i_name]
            end = find(b"\0", start) if start else -1
            if end > start:  # else no name, or one running off the table
                yield i, strings[start:end].decode("utf-8", "replace"), s

    def function_ranges(self, thumb: bool = False) -> set[tuple[int, int, str]]:
        """(address, size, name) of every function defined in this file. The
        same walk as named(), inlined: a generator costs a fifth more on a
        table of 40,000 functions, and a symbolizer reads many tables.
        thumb: an ARM file, whose function addresses carry the Thumb bit."""
        i_name, i_info, i_shndx, i_value, i_size = self.fields
        strings, find = self.strings, self.strings.find
        mask = ~1 if thumb else ~0
        out = set()
        for s in self.entry.iter_unpack(self.data):
            if s[i_info] & 0xF not in _FUNC_TYPES or s[i_shndx] == SHN_UNDEF:
                continue  # not a function, or imported
            start = s[i_name]
            end = find(b"\0", start) if start else -1
            if end > start:
                text = strings[start:end].decode("utf-8", "replace")
                out.add((s[i_value] & mask, s[i_size], text))
        return out


def _cstr(table: bytes, start: int) -> str:
    end = table.find(b"\0", start)
    if start >= len(table) or end < 0:
        return ""
    return table[start:end].decode("utf-8", "replace")


class ElfFile:
    """The headers of the open file fd (the caller keeps it open while using
    this); path only names the file in messages."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd, self.path = fd, path
        self.size = os.fstat(fd).st_size
        ident = self.read(0, 16, "ELF header") if self.size >= 16 else b""
        if ident[:4] != b"\x7fELF":
            raise ElfError(f"{path} is not an ELF file")
        if ident[4] not in (1, 2) or ident[5] not in (1, 2):
            raise ElfError(f"{path} is not a valid ELF file: bad class or byte order")
        self.is64 = ident[4] == 2
        self.order = "<" if ident[5] == 1 else ">"
        self._lay = _layout(self.is64, self.order)
        eh = self._lay.ehdr.unpack(self.read(16, self._lay.ehdr.size, "ELF header"))
        self.machine: int = eh[1]
        self.sections = self._read_sections(shoff=eh[5], shentsize=eh[10], shnum=eh[11],
                                            strndx=eh[12])  # fmt: skip
        self.segments = self._read_segments(phoff=eh[4], phentsize=eh[8], phnum=eh[9])

    def read(self, offset: int, length: int, what: str) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size or length > _MAX_READ:
            raise ElfError(f"{self.path}: corrupt {what} (outside the file)")
        data = os.pread(self.fd, length, offset)
        if len(data) != length:
            raise ElfError(f"{self.path}: short read of {what}")
        return data

    def _read_sections(self, shoff: int, shentsize: int, shnum: int, strndx: int) -> list[Section]:
        shdr = self._lay.shdr
        if not shoff:
            return []
        if shentsize < shdr.size:
            raise ElfError(f"{self.path}: corrupt section headers")
        first = shdr.unpack(self.read(shoff, shdr.size, "section headers"))
        shnum = shnum or first[5]  # e_shnum 0: the count is in section 0's size
        if strndx == SHN_XINDEX:
            strndx = first[6]
        data = self.read(shoff, shnum * shentsize, "section headers")
        # name, type, flags, addr, offset, size, link, info, align, entsize
        rows = [shdr.unpack_from(data, i * shentsize) for i in range(shnum)]
        names = b""
        if 0 < strndx < len(rows) and rows[strndx][1] != SHT_NOBITS:
            names = self.read(rows[strndx][4], rows[strndx][5], "section names")
        return [Section(_cstr(names, h[0]), h[1], h[3], h[4], h[5], h[6], h[9]) for h in rows]

    def _read_segments(self, phoff: int, phentsize: int, phnum: int) -> list[Segment]:
        phdr = self._lay.phdr
        if not (phoff and phnum):
            return []
        if phentsize < phdr.size:
            raise ElfError(f"{self.path}: corrupt program headers")
        data = self.read(phoff, phnum * phentsize, "program headers")
        out = []
        for i in range(phnum):
            p = phdr.unpack_from(data, i * phentsize)
            if self.is64:  # type, flags, offset, vaddr, paddr, filesz, ...
                out.append(Segment(p[0], p[2], p[3], p[5]))
            else:  # type, offset, vaddr, paddr, filesz, ...
                out.append(Segment(p[0], p[1], p[2], p[4]))
        return out

    # ------------------------------------------------------------ sections

    def section(self, name: str) -> Section | None:
        return next((s for s in self.sections if s.name == name), None)

    def data(self, sec: Section) -> bytes:
        if sec.type == SHT_NOBITS:
            return b""
        return self.read(sec.offset, sec.size, sec.name or "section")

    def loads(self) -> list[Segment]:
        """The PT_LOAD segments, in file order."""
        return [p for p in self.segments if p.type == PT_LOAD]

    def symbol_table(self, name: str) -> SymbolTable | None:
        """The table called name (".dynsym" or ".symtab"), read and checked;
        None if the file has none (or only a NOBITS placeholder)."""
        sec = self.section(name)
        if sec is None or sec.type == SHT_NOBITS:
            return None
        lay = self._lay
        if sec.entsize != lay.sym.size or sec.size % sec.entsize:
            raise ElfError(f"{self.path}: corrupt {name} section")
        if not 0 <= sec.link < len(self.sections):
            raise ElfError(f"{self.path}: corrupt {name} section (string table)")
        strsec = self.sections[sec.link]
        strings = self.read(strsec.offset, strsec.size, f"{name} strings")
        data = self.read(sec.offset, sec.size, name)
        versions = self._versym() if name == ".dynsym" else array.array("H")
        return SymbolTable(name, data, strings, lay.sym, lay.sym_fields, versions)

    def _versym(self) -> array.array[int]:
        """The .gnu.version table (one u16 per .dynsym symbol), or empty."""
        out = array.array("H")
        for v in self.sections:
            if v.type == SHT_GNU_VERSYM:
                try:
                    raw = self.read(v.offset, v.size - v.size % 2, ".gnu.version")
                except ElfError:
                    return out  # versions only rank duplicates: do without
                out.frombytes(raw)
                if (self.order == "<") != (sys.byteorder == "little"):
                    out.byteswap()
                return out
        return out

    # --------------------------------------------------------------- notes

    def build_id(self) -> str | None:
        """The GNU build-id (hex) from the PT_NOTE segments (what the loader
        maps), else from the note sections."""
        notes = [(p.offset, p.filesz) for p in self.segments if p.type == PT_NOTE]
        notes += [(s.offset, s.size) for s in self.sections if s.type == SHT_NOTE]
        for off, size in notes:
            if size > _MAX_NOTE:
                continue
            found = self._note_build_id(self.read(off, size, "note"))
            if found:
                return found
        return None

    def _note_build_id(self, data: bytes) -> str | None:
        head = struct.Struct(self.order + "III")  # namesz, descsz, type
        pos = 0
        while pos + head.size <= len(data):
            namesz, descsz, kind = head.unpack_from(data, pos)
            name_at = pos + head.size
            desc_at = name_at + ((namesz + 3) & ~3)
            end = desc_at + ((descsz + 3) & ~3)
            if end > len(data):
                return None
            if kind == _NT_GNU_BUILD_ID and data[name_at : name_at + namesz] == b"GNU\0":
                return data[desc_at : desc_at + descsz].hex() or None
            pos = end
        return None

    def debuglink(self) -> tuple[str, int] | None:
        """(file name, CRC-32) from .gnu_debuglink: where the separate debug file is."""
        sec = self.section(".gnu_debuglink")
        if sec is None or sec.size > 4096:
            return None
        data = self.data(sec)
        end = data.find(b"\0")
        if end <= 0:
            return None
        crc_at = (end + 4) & ~3  # the name, its NUL, padding to 4, then the CRC
        if len(data) < crc_at + 4:
            return None
        (crc,) = struct.unpack_from(self.order + "I", data, crc_at)
        return data[:end].decode("utf-8", "replace"), crc


def open_elf(path: str) -> tuple[int, ElfFile]:
    """(fd, the file's headers); the caller closes fd. Raises OSError or ElfError."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return fd, ElfFile(fd, path)
    except BaseException:
        os.close(fd)
        raise
