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
from gfxbpf.elf.symbols import SymbolFormatError

__all__ = ["MAX_NAME_BYTES", "function_ranges"]

_TABLES = (".dynsym", ".symtab")
# The names of one file's functions, decoded (libLLVM's: about 10 MB).
MAX_NAME_BYTES = 64 << 20
_EM_ARM = 40


def function_ranges(path: str, max_name_bytes: int = MAX_NAME_BYTES) -> list[tuple[int, int, str]]:
    """(address, size, name) of every defined function in the file's .dynsym and
    .symtab, sorted by address; [] if the file cannot be read as ELF. A table
    whose names would take more than what is left of max_name_bytes is left
    out (the file may be another user's, crafted to fill our memory)."""
    try:
        fd, elf = open_elf(path)
    except (OSError, ValueError, struct.error):
        return []
    out: set[tuple[int, int, str]] = set()
    left = max_name_bytes
    try:
        for name in _TABLES:
            got = _table(elf, name, left)
            left -= sum(len(n) for _, _, n in got)
            out.update(got)
    except (OSError, ValueError, struct.error):
        pass  # keep what the readable tables gave
    finally:
        os.close(fd)
    return sorted(out)


def _table(elf: ElfFile, name: str, max_name_bytes: int) -> set[tuple[int, int, str]]:
    try:
        table = elf.symbol_table(name)
        if table is None:
            return set()
        got = table.function_ranges(elf.machine == _EM_ARM, max(max_name_bytes, 0))
    except (ElfError, SymbolFormatError):
        return set()  # a corrupt or oversized table: the other one may still serve
    return {(at, size, _unversioned(n)) for at, size, n in got}


def _unversioned(name: str) -> str:
    """A .symtab names each version of a symbol with it ("clock_gettime@GLIBC_2.2.5",
    "clock_gettime@@GLIBC_2.17"; 862 in glibc's debug file): a profile names the
    function, as .dynsym does. No C, C++, Rust or Go symbol holds '@' otherwise."""
    base, at, _ = name.partition("@")
    return base if at and base else name
