"""What symbolization needs from an ELF file's headers: its build-id, its
.gnu_debuglink, its loadable segments; and where its separate debug file is.

Only headers and two small notes are read (elfhdr.py), so this costs about a
millisecond even for a 100 MB library; symbol tables are read by elfsyms.py,
once per file (symtab.py caches them).
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass

from gfxbpf.client.profile.elfhdr import PT_LOAD, PT_NOTE, SHT_NOBITS, ElfHeaders, open_elf

__all__ = ["DEBUG_ROOT", "ElfInfo", "debug_file", "read_info"]

DEBUG_ROOT = "/usr/lib/debug"
_NT_GNU_BUILD_ID = 3
_SHT_NOTE = 7


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
            build_id=_build_id(elf),
            debuglink=_debuglink(elf),
            segments=tuple((o, v, n) for t, o, v, n in elf.segments if t == PT_LOAD),
            has_symtab=symtab is not None and symtab.type != SHT_NOBITS,
        )
    except (OSError, ValueError, struct.error):
        return None
    finally:
        os.close(fd)


def _build_id(elf: ElfHeaders) -> str | None:
    """From the PT_NOTE segments (what the loader maps), else the note sections."""
    notes = [(off, size) for t, off, _, size in elf.segments if t == PT_NOTE]
    notes += [(s.offset, s.size) for s in elf.sections if s.type == _SHT_NOTE]
    for off, size in notes:
        if size > 1 << 20:
            continue  # no real note area is this large
        found = _note_build_id(elf.read(off, size), elf.order)
        if found:
            return found
    return None


def _note_build_id(data: bytes, order: str) -> str | None:
    head = struct.Struct(order + "III")  # namesz, descsz, type
    pos = 0
    while pos + head.size <= len(data):
        namesz, descsz, kind = head.unpack_from(data, pos)
        name_at = pos + head.size
        desc_at = name_at + ((namesz + 3) & ~3)
        end = desc_at + ((descsz + 3) & ~3)
        if end > len(data):
            return None
        if kind == _NT_GNU_BUILD_ID and data[name_at : name_at + namesz] == b"GNU\0":
            return data[desc_at : desc_at + descsz].hex() or None
        pos = end
    return None


def _debuglink(elf: ElfHeaders) -> tuple[str, int] | None:
    sec = elf.section(".gnu_debuglink")
    if sec is None or sec.size > 4096:
        return None
    data = elf.data(sec)
    end = data.find(b"\0")
    if end <= 0:
        return None
    crc_at = (end + 4) & ~3  # the name, its NUL, padding to 4, then the CRC
    if len(data) < crc_at + 4:
        return None
    (crc,) = struct.unpack_from(elf.order + "I", data, crc_at)
    return data[:end].decode("utf-8", "replace"), crc


def _crc32(path: str) -> int | None:
    crc = 0
    try:
        with open(path, "rb") as f:
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
