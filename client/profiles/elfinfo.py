"""What symbolization needs from an ELF file's headers: its build-id, its
.gnu_debuglink, its loadable segments; and where its separate debug file is.

Only headers and two small notes are read (gfxbpf.elf, the project's one
ELF layer), so this costs about a millisecond even for a 100 MB library;
symbol tables are read by elfsyms.py, once per file (symtab.py caches them).
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass

from gfxbpf.client.profiles.fileid import open_regular
from gfxbpf.elf.reader import SHT_NOBITS, open_elf

__all__ = ["DEBUG_ROOT", "ElfInfo", "debug_file", "read_info"]

DEBUG_ROOT = "/usr/lib/debug"


@dataclass(frozen=True)
class ElfInfo:
    build_id: str | None  # hex
    debuglink: tuple[str, int] | None  # (file name, CRC-32 of the debug file)
    # PT_LOAD segments: (p_offset, p_vaddr, p_filesz), to turn file offsets into addresses.
    segments: tuple[tuple[int, int, int], ...]
    has_symtab: bool


def read_info(path: str) -> ElfInfo | None:
    """The headers' facts, or None if the file is unreadable or not ELF."""
    try:
        fd, elf = open_elf(path)
    except (OSError, ValueError, struct.error):
        return None
    try:
        symtab = elf.section(".symtab")
        return ElfInfo(
            build_id=elf.build_id(),
            debuglink=elf.debuglink(),
            segments=tuple((p.offset, p.vaddr, p.filesz) for p in elf.loads()),
            has_symtab=symtab is not None and symtab.type != SHT_NOBITS,
        )
    except (OSError, ValueError, struct.error):
        return None
    finally:
        os.close(fd)


def _crc32(path: str) -> int | None:
    crc = 0
    try:
        fd, _ = open_regular(path)  # a FIFO planted as a debug file must not hang us
        with open(fd, "rb") as f:
            while chunk := f.read(1 << 20):
                crc = zlib.crc32(chunk, crc)
    except OSError:
        return None
    return crc


def debug_file(path: str, info: ElfInfo, debug_root: str = DEBUG_ROOT) -> str | None:
    """The separate debug file for the ELF file at path, if one is installed:
    by build-id first (/usr/lib/debug/.build-id/ab/cdef….debug), then by
    .gnu_debuglink next to the file, in its .debug/ folder, and under
    /usr/lib/debug/<its folder>/ (a debuglink match needs the right CRC)."""
    if info.build_id and len(info.build_id) > 2:
        bid = info.build_id
        cand = os.path.join(debug_root, ".build-id", bid[:2], bid[2:] + ".debug")
        if os.path.isfile(cand):
            return cand
    if info.debuglink is None:
        return None
    name, crc = info.debuglink
    folder = os.path.dirname(os.path.realpath(path))
    for cand in (
        os.path.join(folder, name),
        os.path.join(folder, ".debug", name),
        os.path.join(debug_root, folder.lstrip("/"), name),
    ):
        if os.path.realpath(cand) == os.path.realpath(path) or not os.path.isfile(cand):
            continue
        if _crc32(cand) == crc:
            return cand
    return None
