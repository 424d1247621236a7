"""Every function symbol of an ELF file by address, for naming addresses.

bpf/symbols.py answers the uprobe question (a name -> its file offset, one
symbol per name, and it refuses a file whose symbols lie outside its contents).
Symbolization asks the other way round and must read what that refuses: a
separate debug file (objcopy --only-keep-debug) has a .symtab but no code, and
two static functions of one name in different source files are two functions.
The tables are unpacked with one struct per table (elfhdr.py finds them):
libLLVM's 36,000 exported functions take about 0.1 s.
"""

from __future__ import annotations

import os
import struct

from gfxbpf.client.profile.elfhdr import SHT_NOBITS, ElfHeaders, open_elf

__all__ = ["function_ranges"]

_FUNC_TYPES = (2, 10)  # STT_FUNC, STT_GNU_IFUNC
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


def _table(elf: ElfHeaders, name: str) -> set[tuple[int, int, str]]:
    sec = elf.section(name)
    entry = struct.Struct(elf.order + ("IBBHQQ" if elf.is64 else "IIIBBH"))
    if sec is None or sec.type == SHT_NOBITS or sec.entsize != entry.size:
        return set()
    if not 0 < sec.link < len(elf.sections):
        return set()
    data = elf.data(sec)
    strings = elf.data(elf.sections[sec.link])
    thumb = elf.machine == _EM_ARM
    out = set()
    for fields in entry.iter_unpack(data[: len(data) - len(data) % entry.size]):
        if elf.is64:
            name_at, info, _other, shndx, value, size = fields
        else:
            name_at, value, size, info, _other, shndx = fields
        if info & 0xF not in _FUNC_TYPES or shndx == 0 or not 0 < name_at < len(strings):
            continue  # not a function, undefined (imported), or nameless
        end = strings.find(b"\0", name_at)
        text = strings[name_at : end if end >= 0 else len(strings)].decode("utf-8", "replace")
        out.add((value & ~1 if thumb else value, size, text))
    return out
