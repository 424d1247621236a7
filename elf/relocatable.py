"""A relocatable ELF object (ET_REL, what clang writes for a BPF program):
its header and section table read with pyelftools, each section with its
bytes; its symbol table and REL entries unpacked in bulk.

pyelftools checks what it does well: the ELF header, the section header
table (e_shnum and e_shstrndx escapes included), section names and the
links between sections (a symbol table must link a string table, a REL
section has 16-byte entries). It is imported on first use, never at module
import: it costs ~2.4 MiB of RSS and 20-145 ms, which a process that reads no
object (the idle broker, gfxclient) never pays (bench/object_read.py).

The tables are not read through it, for measured reasons (offcpu.bpf.o,
204 symbols and 1,586 relocations, 2 CPUs under load): its iter_symbols
took 18.6 ms and its iter_relocations 40.1 ms, where unpacked in bulk here
(symbols.py, the one reader of every ELF file's symbols; one struct for
Elf64_Rel) they take under a millisecond. With them read so, an object's
read costs 1-2 ms more than with no pyelftools (syscount 0.6-0.9 -> 2.7 ms,
cudakernels 4.3-4.6 -> 5.8 ms), its section table's headers; read through
pyelftools whole it took 12-98 ms (offcpu 5 -> 79 ms).

Nothing is trusted: pyelftools reads short where a range runs past the end,
so every range is checked here, and anything it raises on a malformed file
becomes an ElfError.
"""

from __future__ import annotations

import array
import io
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gfxbpf.elf.reader import ElfError
from gfxbpf.elf.symbols import Symbol, SymbolFormatError, SymbolTable, layout

__all__ = ["ObjSection", "Relocatable", "read_relocatable"]

SHT_SYMTAB, SHT_NOBITS, SHT_REL = 2, 8, 9
_REL = struct.Struct("<QQ")  # Elf64_Rel: r_offset, r_info (a BPF object is 64-bit LE)


@dataclass(frozen=True)
class ObjSection:
    """One section header and its bytes (b"" for NOBITS and the null section)."""

    index: int
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int
    entsize: int
    data: bytes


@dataclass(frozen=True)
class Relocatable:
    """What an ET_REL object holds: machine (e_machine), its class and byte
    order, every section, and the symbols of its one symbol table."""

    machine: int
    is64: bool
    little_endian: bool
    sections: list[ObjSection]
    symbols: list[Symbol]  # (index, name, value, size, STT_*, STB_*, STV_*, shndx)

    def rels(self, sec: ObjSection) -> list[tuple[int, int, int]]:
        """(offset, symbol index, type) of each entry of REL section sec."""
        if sec.size % _REL.size:
            raise ElfError(f"relocation section {sec.name!r} has a partial entry")
        return [(off, info >> 32, info & 0xFFFFFFFF) for off, info in _REL.iter_unpack(sec.data)]


def _number(value: Any, names: Mapping[str, int]) -> int:
    """pyelftools gives known enum values as names, unknown ones as numbers."""
    return value if isinstance(value, int) else int(names[value])


def read_relocatable(data: bytes, path: str) -> Relocatable:
    """Parse an ELF object image; ElfError (naming path) for anything malformed."""
    from elftools.common.exceptions import ELFError as LibError

    try:
        return _Reader(data, path).read()
    except ElfError:
        raise
    except (LibError, ValueError, KeyError, IndexError, ZeroDivisionError) as e:
        raise ElfError(f"{path}: corrupt ELF object: {e}") from None
    except Exception as e:  # pyelftools' construct errors on truncated headers
        raise ElfError(f"{path}: corrupt ELF object: {type(e).__name__}: {e}") from None


class _Reader:
    """One parse: pyelftools' ELFFile over the image, checked range by range."""

    def __init__(self, data: bytes, path: str) -> None:
        from elftools.elf import enums
        from elftools.elf.elffile import ELFFile

        self.data, self.path, self.enums = data, path, enums
        self.elf = ELFFile(io.BytesIO(data))

    def read(self) -> Relocatable:
        header = self.elf.header
        machine = _number(header["e_machine"], self.enums.ENUM_E_MACHINE)
        sections = [self._section(i) for i in range(self.elf.num_sections())]
        little = self.elf.little_endian
        is64 = self.elf.elfclass == 64
        symtab = next((s for s in sections if s.type == SHT_SYMTAB), None)
        symbols = self._symbols(symtab, sections, is64, little) if symtab else []
        return Relocatable(machine, is64, little, sections, symbols)

    def _section(self, index: int) -> ObjSection:
        """Section index's header, checked by pyelftools as it builds the section
        (a symbol table must link a string table, a REL section 16-byte entries)."""
        sec = self.elf.get_section(index)
        h, name = sec.header, sec.name
        kind = _number(h["sh_type"], self.enums.ENUM_SH_TYPE_BASE)
        size, offset = h["sh_size"], h["sh_offset"]
        body = b""
        if index and kind != SHT_NOBITS:
            if offset + size > len(self.data):
                raise ElfError(f"{self.path}: section {name!r} runs past the end of the file")
            # The stored bytes, as the loader uses them: pyelftools' data() would
            # inflate an SHF_COMPRESSED section, a zlib bomb in a hostile upload.
            body = self.data[offset : offset + size]
        return ObjSection(index, name, kind, h["sh_flags"], offset, size, h["sh_link"],
                          h["sh_info"], h["sh_entsize"], body)  # fmt: skip

    def _symbols(
        self, symtab: ObjSection, sections: list[ObjSection], is64: bool, little: bool
    ) -> list[Symbol]:
        """Every entry, the unnamed ones too, through the one symbol-table reader."""
        entry, pos = layout(is64, "<" if little else ">")
        if symtab.entsize != entry.size or symtab.size % entry.size:
            raise ElfError(f"{self.path}: corrupt symbol table")
        strings = sections[symtab.link].data  # pyelftools checked the link
        fields = (pos[0], pos[1], pos[3], pos[4], pos[5])
        table = SymbolTable(
            ".symtab", symtab.data, strings, entry, fields, array.array("H"), pos[2]
        )
        try:
            return table.symbols()
        except SymbolFormatError as e:
            raise ElfError(str(e)) from None
