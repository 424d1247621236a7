"""Names for [vdso] frames (clock_gettime, gettimeofday, ...).

The vDSO is an ELF image the kernel maps into every process; it is the same
image for every process on the machine, so the client reads its own copy
(/proc/self/mem over its own [vdso] range) and uses it for the target's.
"""

from __future__ import annotations

import struct

from gfxbpf.client.profiles.procmaps import parse_maps
from gfxbpf.client.profiles.symtab import SymbolTable
from gfxbpf.elf.reader import ElfError, ElfFile

__all__ = ["own_vdso_image", "own_vdso_table"]

_EM_ARM = 40


def own_vdso_image() -> bytes | None:
    """The bytes of this process's vDSO (an ELF image), or None."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            vdso = next((m for m in parse_maps(f.read()) if m.path == "[vdso]"), None)
        if vdso is None:
            return None
        with open("/proc/self/mem", "rb", buffering=0) as mem:
            mem.seek(vdso.start)
            return mem.read(vdso.end - vdso.start)
    except OSError:
        return None


def own_vdso_table() -> SymbolTable | None:
    """This process's vDSO as a table keyed by offset into the mapping, or None."""
    image = own_vdso_image()
    if image is None:
        return None
    try:
        return _table(image)
    except (ElfError, struct.error):
        return None


def _table(image: bytes) -> SymbolTable | None:
    elf = ElfFile(image, "[vdso]")
    segments = tuple((p.offset, p.vaddr, p.filesz) for p in elf.loads())
    dynsym = elf.symbol_table(".dynsym")
    if dynsym is None or not segments:
        return None
    funcs = dynsym.function_ranges(thumb=elf.machine == _EM_ARM)
    return SymbolTable.build(segments, sorted(funcs))
