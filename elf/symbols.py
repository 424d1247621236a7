"""Symbol tables (.dynsym, .symtab) read in bulk, of every ELF file the
project reads, BPF objects too: the table's bytes are unpacked with one
precompiled struct, not an object per symbol as pyelftools builds them
(libLLVM's 36,000 functions: 40 ms here, seconds there; offcpu.bpf.o's 204
symbols: 18.6 ms through pyelftools' iter_symbols, 0.3 ms here). The hot
loops of a first uprobe attach (bpf/symbols.py) and of naming addresses
(client/profiles) run on these."""

from __future__ import annotations

import array
import struct
from collections.abc import Iterator
from dataclasses import dataclass

SHN_UNDEF = 0
STT_FUNC, STT_GNU_IFUNC = 2, 10
_FUNC_TYPES = (STT_FUNC, STT_GNU_IFUNC)


class SymbolFormatError(ValueError):
    """A symbol table entry that points outside its string table."""


def layout(is64: bool, order: str) -> tuple[struct.Struct, tuple[int, int, int, int, int, int]]:
    """One symbol entry's struct, and the positions of its name, info, other,
    shndx, value and size fields."""
    if is64:
        return struct.Struct(order + "IBBHQQ"), (0, 1, 2, 3, 4, 5)
    return struct.Struct(order + "IIIBBH"), (0, 3, 4, 5, 1, 2)


# One decoded entry: index, name, value, size, type (STT_*), bind (STB_*),
# visibility (STV_*), section index.
Symbol = tuple[int, str, int, int, int, int, int, int]


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
    other: int = 2  # the position of st_other

    def named(self) -> Iterator[tuple[int, str, tuple[int, ...]]]:
        """(index, name, raw entry) of every symbol with a name."""
        i_name = self.fields[0]
        strings, find = self.strings, self.strings.find
        for i, s in enumerate(self.entry.iter_unpack(self.data)):
            start = s[i_name]
            end = find(b"\0", start) if start else -1
            if end > start:  # else no name, or one running off the table
                yield i, strings[start:end].decode("utf-8", "replace"), s

    def function_ranges(
        self, thumb: bool = False, max_name_bytes: int = 1 << 62
    ) -> set[tuple[int, int, str]]:
        """(address, size, name) of every function defined in this file. The
        same walk as named(), inlined: a generator costs a fifth more on a
        table of 40,000 functions, and a symbolizer reads many tables.
        thumb: an ARM file, whose function addresses carry the Thumb bit.
        Symbols naming one string share it; SymbolFormatError when the names
        decoded take more than max_name_bytes (a crafted table can point
        every symbol at a different place in one long string)."""
        i_name, i_info, i_shndx, i_value, i_size = self.fields
        strings, find = self.strings, self.strings.find
        mask = ~1 if thumb else ~0
        out = set()
        names: dict[int, str] = {}
        left = max_name_bytes
        for s in self.entry.iter_unpack(self.data):
            if s[i_info] & 0xF not in _FUNC_TYPES or s[i_shndx] == SHN_UNDEF:
                continue  # not a function, or imported
            start = s[i_name]
            text = names.get(start)
            if text is None:
                end = find(b"\0", start) if start else -1
                if end <= start:
                    continue
                left -= end - start
                if left < 0:
                    raise SymbolFormatError(f"{self.name}: names over {max_name_bytes} bytes")
                text = names[start] = strings[start:end].decode("utf-8", "replace")
            out.add((s[i_value] & mask, s[i_size], text))
        return out

    def symbols(self) -> list[Symbol]:
        """Every entry, decoded, the unnamed ones too (a BPF object's table,
        small): SymbolFormatError for a name outside the string table."""
        i_name, i_info, i_shndx, i_value, i_size = self.fields
        strings, i_other = self.strings, self.other
        out = []
        for i, s in enumerate(self.entry.iter_unpack(self.data)):
            start = s[i_name]
            if start >= len(strings) and start:
                raise SymbolFormatError(
                    f"symbol #{i}: name offset {start} is past the string table"
                )
            end = strings.find(b"\0", start)
            raw = strings[start : end if end >= 0 else len(strings)]
            info = s[i_info]
            name = raw.decode("utf-8", "replace")
            out.append((i, name, s[i_value], s[i_size], info & 0xF, info >> 4,
                        s[i_other] & 0x3, s[i_shndx]))  # fmt: skip
        return out
