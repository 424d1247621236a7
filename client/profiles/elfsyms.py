"""Every function symbol of an ELF file by address, for naming addresses.

bpf/symbols.py answers the uprobe question (a name -> its file offset, one
symbol per name, and it refuses a file whose symbols lie outside its contents).
Symbolization asks the other way round and must read what that refuses: a
separate debug file (objcopy --only-keep-debug) has a .symtab but no code, and
two static functions of one name in different source files are two functions.
Both read the tables with gfxbpf.elf (one struct per table): libLLVM's
36,000 exported functions take about 0.1 s.
"""

from __future__ import annotations

import os
import struct

from gfxbpf.elf.reader import ElfError, ElfFile, open_elf

__all__ = ["function_ranges"]

_TABLES = (".dynsym", ".symtab")
_EM_ARM = 40


def function_ranges(path: str) -> list[tuple[int, int, str]]:
    """(address, size, name) of every defined function in the file's .dynsym and
    .symtab, sorted by address; [] if the file cannot be read as ELF."""
    try:
        fd, elf = open_elf(path)
    except (OSError, ValueError, struct.error):
        return []
    out: set[tuple[int, int, str]] = set()
    try:
        for name in _TABLES:
            out.update(_table(elf, name))
    except (OSError, ValueError, struct.error):
        pass  # keep what the readable tables gave
    finally:
        os.close(fd)
    return sorted(out)


def _table(elf: ElfFile, name: str) -> set[tuple[int, int, str]]:
    try:
        table = elf.symbol_table(name)
    except ElfError:
        return set()  # a corrupt table: the other one may still serve
    if table is None:
        return set()
    return table.function_ranges(thumb=elf.machine == _EM_ARM)
