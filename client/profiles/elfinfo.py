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

__all__ = ["DEBUG_ROOT", "DebugFile", "ElfInfo", "open_debug_file", "read_info"]

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


def _crc32(fd: int) -> int | None:
    """The CRC-32 of the open file, read through fd (never reopened by path)."""
    crc, at = 0, 0
    try:
        while chunk := os.pread(fd, 1 << 20, at):
            crc, at = zlib.crc32(chunk, crc), at + len(chunk)
    except OSError:
        return None
    return crc


@dataclass(frozen=True)
class DebugFile:
    """A separate debug file, open: read it through fd (open_regular_path),
    never by path again (another user could swap the path for a FIFO after
    the check). The caller closes fd."""

    fd: int
    path: str


def _open_checked(cand: str, crc: int | None) -> DebugFile | None:
    """cand opened without blocking or following its last link (fileid.open_regular),
    if it is a regular file (and its CRC-32 is crc, when given)."""
    try:
        fd, _ = open_regular(os.path.realpath(cand))
    except OSError:
        return None
    if crc is None or _crc32(fd) == crc:
        return DebugFile(fd, cand)
    os.close(fd)
    return None


def open_debug_file(path: str, info: ElfInfo, debug_root: str = DEBUG_ROOT) -> DebugFile | None:
    """The separate debug file for the ELF file at path, if one is installed,
    opened: by build-id first (/usr/lib/debug/.build-id/ab/cdef….debug), then
    by .gnu_debuglink next to the file, in its .debug/ folder, and under
    /usr/lib/debug/<its folder>/ (a debuglink match needs the right CRC). The
    file checked is the file returned: every open is non-blocking and
    no-follow, and the CRC is read through the descriptor handed back."""
    if info.build_id and len(info.build_id) > 2:
        bid = info.build_id
        cand = os.path.join(debug_root, ".build-id", bid[:2], bid[2:] + ".debug")
        found = _open_checked(cand, None) if os.path.lexists(cand) else None
        if found is not None:
            return found
    if info.debuglink is None:
        return None
    name, crc = info.debuglink
    folder = os.path.dirname(os.path.realpath(path))
    for cand in (
        os.path.join(folder, name),
        os.path.join(folder, ".debug", name),
        os.path.join(debug_root, folder.lstrip("/"), name),
    ):
        if os.path.realpath(cand) == os.path.realpath(path):
            continue
        found = _open_checked(cand, crc)
        if found is not None:
            return found
    return None
