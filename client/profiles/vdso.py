"""Names for [vdso] frames (clock_gettime, gettimeofday, ...).

The vDSO is an ELF image the kernel maps into every process; it is the same
image for every process on the machine, so the client reads its own copy
(/proc/self/mem over its own [vdso] range) and uses it for the target's.
"""

from __future__ import annotations

import io

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from gfxbpf.client.profiles.procmaps import parse_maps
from gfxbpf.client.profiles.symtab import SymbolTable

__all__ = ["own_vdso_image", "own_vdso_table"]

_FUNC_TYPES = ("STT_FUNC", "STT_LOOS")


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
    except Exception:  # pyelftools on odd input
        return None


def _table(image: bytes) -> SymbolTable | None:
    elf = ELFFile(io.BytesIO(image))
    segments = tuple(
        (seg["p_offset"], seg["p_vaddr"], seg["p_filesz"])
        for seg in elf.iter_segments()
        if seg["p_type"] == "PT_LOAD"
    )
    dynsym = elf.get_section_by_name(".dynsym")
    if not isinstance(dynsym, SymbolTableSection) or not segments:
        return None
    funcs = {
        (sym["st_value"], sym["st_size"], sym.name)
        for sym in dynsym.iter_symbols()
        if sym["st_info"]["type"] in _FUNC_TYPES and sym.name and sym["st_shndx"] != "SHN_UNDEF"
    }
    return SymbolTable.build(segments, sorted(funcs))
