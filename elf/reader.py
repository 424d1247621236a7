"""An ELF file: its header, section and program headers, notes, symbol
tables and the bytes of any section (.eh_frame for the unwinder), for every
module of the project that reads one: the one ELF layer.

pyelftools, the project's ELF library, parses the headers; the bulk data is
read with pread (or sliced out of an image in memory) only where asked for,
so the headers of a 100 MB library cost about a millisecond, and a symbol
table is read whole and unpacked with one precompiled struct (symbols.py).
Nothing is trusted: every range is checked against the file's size before
it is read, and any violation, or anything pyelftools refuses, is an
ElfError naming the file and what was wrong. It only reads files, so the
client may import it.
"""

from __future__ import annotations

import array
import io
import os
import struct
import sys
from dataclasses import dataclass
from typing import Any

from elftools.common.utils import struct_parse
from elftools.elf import enums
from elftools.elf.elffile import ELFFile

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


def _numbers(prefix: str) -> dict[str, int]:
    """pyelftools' names of one header field's values (every architecture's),
    back to their numbers: it decodes sh_type, p_type and e_machine to names."""
    out: dict[str, int] = {}
    for name, table in vars(enums).items():
        if name.startswith(prefix) and isinstance(table, dict):
            out.update((k, v) for k, v in table.items() if isinstance(v, int))
    return out


_SH_TYPES = _numbers("ENUM_SH_TYPE")
_P_TYPES = _numbers("ENUM_P_TYPE")
_MACHINES = _numbers("ENUM_E_MACHINE")


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


def _number(value: Any, names: dict[str, int]) -> int:
    if isinstance(value, int):
        return value
    return names.get(value, -1)


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
        stream = io.BytesIO(self._image) if self.fd < 0 else open(self.fd, "rb", closefd=False)
        try:
            self._parse_headers(ELFFile(stream), stream)
        except ElfError:
            raise
        except Exception as e:  # pyelftools raises assorted types on hostile input
            raise ElfError(f"{path}: corrupt ELF headers ({type(e).__name__}: {e})") from None
        finally:
            stream.close()

    def _parse_headers(self, elf: ELFFile, stream: Any) -> None:
        self.is64 = elf.elfclass == 64
        self.order = "<" if elf.little_endian else ">"
        self.machine: int = _number(elf["e_machine"], _MACHINES)
        self.sections = self._read_sections(elf, stream)
        self.segments = self._read_segments(elf, stream)

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

    def _table(self, elf: ELFFile, stream: Any, what: str, count: int) -> list[Any]:
        """The count rows of the section (what "section") or program header table."""
        shdr = what == "section"
        row = elf.structs.Elf_Shdr if shdr else elf.structs.Elf_Phdr
        start = elf["e_shoff"] if shdr else elf["e_phoff"]
        step = elf["e_shentsize"] if shdr else elf["e_phentsize"]
        if not (start and count):
            return []
        if step < row.sizeof():
            raise ElfError(f"{self.path}: corrupt {what} headers")
        self.read(start, count * step, f"{what} headers")  # all inside the file
        return [struct_parse(row, stream, start + i * step) for i in range(count)]

    def _read_sections(self, elf: ELFFile, stream: Any) -> list[Section]:
        rows = self._table(elf, stream, "section", elf.num_sections() if elf["e_shoff"] else 0)
        strndx = elf.get_shstrndx() if rows else 0
        names = b""
        if 0 < strndx < len(rows) and _number(rows[strndx]["sh_type"], _SH_TYPES) != SHT_NOBITS:
            names = self.read(rows[strndx]["sh_offset"], rows[strndx]["sh_size"], "section names")
        return [
            Section(
                _cstr(names, h["sh_name"]),
                _number(h["sh_type"], _SH_TYPES),
                h["sh_addr"],
                h["sh_offset"],
                h["sh_size"],
                h["sh_link"],
                h["sh_entsize"],
                i,
                h["sh_flags"],
                h["sh_info"],
            )  # fmt: skip
            for i, h in enumerate(rows)
        ]

    def _read_segments(self, elf: ELFFile, stream: Any) -> list[Segment]:
        rows = self._table(elf, stream, "program", elf["e_phnum"])
        return [
            Segment(_number(p["p_type"], _P_TYPES), p["p_offset"], p["p_vaddr"], p["p_filesz"])
            for p in rows
        ]

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
    """(fd, the file's headers); the caller closes fd. Raises OSError or ElfError."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return fd, ElfFile(fd, path)
    except BaseException:
        os.close(fd)
        raise
