"""A shared library or executable: its header, section and program headers,
notes, symbol tables and the bytes of any section (.eh_frame for the
unwinder). The fast path of the ELF layer, for the files a uprobe attach and
a profile read, some of them 100 MB; a BPF object is read with pyelftools
(relocatable.py).

These are measured, so they stay hand-written structs, not pyelftools:
- headers: pyelftools parses one section header in ~12 us, libc's 64 in
  0.8 ms; the struct reads them in 0.02 ms, a 100 MB library's in 0.1 ms;
- the build-id (notes.py): pyelftools 8.3 ms for libc, 6.1 ms for
  libstdc++, 92 ms for libLLVM-14 (its ELFFile and segment walk); this file
  0.55, 0.40 and 0.31 ms. A profile reads one per mapped library;
- symbol tables: symbols.py;
- importing pyelftools costs a process ~2.6 MiB of RSS and 20-70 ms.
Other bytes (.eh_frame for the unwinder) are read by pread, or sliced out
of an image in memory, only where asked for.
Nothing is trusted: every range is checked against the file's size before
it is read, and any violation is an ElfError naming the file and what was
wrong. It only reads files, so the client may import it.
"""

from __future__ import annotations

import array
import os
import stat
import struct
import sys
from dataclasses import dataclass

from gfxbpf.elf import notes
from gfxbpf.elf.symbols import SHN_UNDEF, STT_FUNC, STT_GNU_IFUNC, SymbolTable, layout

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
SHT_PROGBITS, SHT_SYMTAB, SHT_NOTE, SHT_NOBITS, SHT_REL = 1, 2, 7, 8, 9
SHT_GNU_VERSYM = 0x6FFFFFFF
_MAX_READ = 512 << 20  # no real table comes near this; a corrupt size might
_MAX_NOTE = 1 << 20  # no real note area is this large


SHN_XINDEX = 0xFFFF


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
    index: int = 0
    flags: int = 0
    info: int = 0


@dataclass(frozen=True)
class Segment:
    """One program header: what the loader maps from where."""

    type: int
    offset: int
    vaddr: int
    filesz: int
    flags: int = 0  # PF_X 1, PF_W 2, PF_R 4


def _ehdr(is64: bool, order: str) -> struct.Struct:
    """The ELF header after e_ident: type, machine, version, entry, phoff, shoff,
    flags, ehsize, phentsize, phnum, shentsize, shnum, shstrndx."""
    return struct.Struct(order + "16xHHI" + ("QQQ" if is64 else "III") + "IHHHHHH")


@dataclass(frozen=True)
class _Tables:
    """The section and program header structs of one ELF class and byte order."""

    shdr: struct.Struct  # name, type, flags, addr, offset, size, link, info, align, entsize
    phdr: struct.Struct


def _tables(is64: bool, order: str) -> _Tables:
    if is64:
        return _Tables(struct.Struct(order + "IIQQQQIIQQ"), struct.Struct(order + "IIQQQQQQ"))
    return _Tables(struct.Struct(order + "IIIIIIIIII"), struct.Struct(order + "IIIIIIII"))


def _cstr(table: bytes, start: int) -> str:
    end = table.find(b"\0", start)
    if start >= len(table) or end < 0:
        return ""
    return table[start:end].decode("utf-8", "replace")


class ElfFile:
    """The headers of an ELF file: the open file fd (the caller keeps it open
    while using this) or an image in memory (bytes). path names it in messages."""

    def __init__(self, source: int | bytes, path: str) -> None:
        self.path = path
        self.fd = source if isinstance(source, int) else -1
        self._image = source if isinstance(source, bytes) else b""
        self.size = os.fstat(self.fd).st_size if self.fd >= 0 else len(self._image)
        ident = self.read(0, 16, "ELF header") if self.size >= 16 else b""
        if ident[:4] != b"\x7fELF":
            raise ElfError(f"{path} is not an ELF file")
        if ident[4] not in (1, 2) or ident[5] not in (1, 2):
            raise ElfError(f"{path} is not a valid ELF file: bad class or byte order")
        self.is64 = ident[4] == 2
        self.order = "<" if ident[5] == 1 else ">"
        ehdr = _ehdr(self.is64, self.order)
        eh = ehdr.unpack(self.read(0, ehdr.size, "ELF header"))
        _, machine, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum, shstrndx = eh
        self.machine: int = machine
        self._lay = _tables(self.is64, self.order)
        self.sections = self._read_sections(shoff, shentsize, shnum, shstrndx)
        self.segments = self._read_segments(phoff, phentsize, phnum)

    def read(self, offset: int, length: int, what: str) -> bytes:
        """length bytes at offset, all inside the file (else ElfError)."""
        if offset < 0 or length < 0 or offset + length > self.size or length > _MAX_READ:
            raise ElfError(f"{self.path}: truncated or corrupt {what} (outside the file)")
        if self.fd < 0:
            return self._image[offset : offset + length]
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
        rows = [shdr.unpack_from(data, i * shentsize) for i in range(shnum)]
        names = b""
        if 0 < strndx < len(rows) and rows[strndx][1] != SHT_NOBITS:
            names = self.read(rows[strndx][4], rows[strndx][5], "section names")
        return [
            Section(_cstr(names, h[0]), h[1], h[3], h[4], h[5], h[6], h[9], i, h[2], h[7])
            for i, h in enumerate(rows)
        ]

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
                out.append(Segment(p[0], p[2], p[3], p[5], p[1]))
            else:  # type, offset, vaddr, paddr, filesz, memsz, flags, ...
                out.append(Segment(p[0], p[1], p[2], p[4], p[6]))
        return out

    # ------------------------------------------------------------ sections

    def section(self, name: str) -> Section | None:
        return next((s for s in self.sections if s.name == name), None)

    def data(self, sec: Section) -> bytes:
        """A section's bytes (b"" for NOBITS): e.g. .eh_frame for the unwinder."""
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
        return self.symbols_of(sec)

    def symbols_of(self, sec: Section) -> SymbolTable:
        """The symbol table in section sec, read and checked."""
        entry, pos = layout(self.is64, self.order)
        if sec.entsize != entry.size or sec.size % entry.size:
            raise ElfError(f"{self.path}: corrupt {sec.name} section")
        if not 0 <= sec.link < len(self.sections):
            raise ElfError(f"{self.path}: corrupt {sec.name} section (string table)")
        strsec = self.sections[sec.link]
        strings = self.read(strsec.offset, strsec.size, f"{sec.name} strings")
        data = self.read(sec.offset, sec.size, sec.name)
        versions = self._versym() if sec.name == ".dynsym" else array.array("H")
        fields = (pos[0], pos[1], pos[3], pos[4], pos[5])
        return SymbolTable(sec.name, data, strings, entry, fields, versions, pos[2])

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

    def notes(self, section: str) -> list[notes.Note]:
        """The notes of a note section (e.g. .note.stapsdt); [] if it has none."""
        sec = self.section(section)
        if sec is None or sec.type == SHT_NOBITS or sec.size > _MAX_NOTE:
            return []
        return list(notes.iter_notes(self.data(sec), self.order))

    def build_id(self) -> str | None:
        """The GNU build-id (hex) from the PT_NOTE segments (what the loader
        maps), else from the note sections."""
        areas = [(p.offset, p.filesz) for p in self.segments if p.type == PT_NOTE]
        areas += [(s.offset, s.size) for s in self.sections if s.type == SHT_NOTE]
        for off, size in areas:
            if size > _MAX_NOTE:
                continue
            found = notes.build_id(self.read(off, size, "note"), self.order)
            if found:
                return found
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
    """(fd, the file's headers); the caller closes fd. Raises OSError or ElfError.
    The open never blocks (a FIFO planted at path is refused, not waited on)
    and only a regular file is read."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ElfError(f"{path} is not a regular file")
        return fd, ElfFile(fd, path)
    except BaseException:
        os.close(fd)
        raise
