"""What symbolization needs from an ELF file's headers: its build-id, its
.gnu_debuglink, its loadable segments; and where its separate debug file is.

Only headers and two small sections are read, so this is cheap even for a
96 MB library; the symbol tables are read (once) by symtab.py.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import NoteSection

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
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return None
            f.seek(0)
            elf = ELFFile(f)
            segments = tuple(
                (seg["p_offset"], seg["p_vaddr"], seg["p_filesz"])
                for seg in elf.iter_segments()
                if seg["p_type"] == "PT_LOAD"
            )
            symtab = elf.get_section_by_name(".symtab")
            return ElfInfo(
                build_id=_build_id(elf),
                debuglink=_debuglink(elf),
                segments=segments,
                has_symtab=symtab is not None and symtab["sh_type"] != "SHT_NOBITS",
            )
    except Exception:  # pyelftools raises many types on corrupt input
        return None


def _build_id(elf: ELFFile) -> str | None:
    for sec in elf.iter_sections():
        if not isinstance(sec, NoteSection):
            continue
        for note in sec.iter_notes():
            if note["n_type"] == "NT_GNU_BUILD_ID" and note["n_name"] == "GNU":
                desc = note["n_desc"]
                return desc if isinstance(desc, str) else bytes(desc).hex()
    return None


def _debuglink(elf: ELFFile) -> tuple[str, int] | None:
    sec = elf.get_section_by_name(".gnu_debuglink")
    if sec is None:
        return None
    data = sec.data()
    end = data.find(b"\0")
    if end <= 0:
        return None
    crc_at = (end + 4) & ~3  # the name, its NUL, padding to 4, then the CRC
    if len(data) < crc_at + 4:
        return None
    order = "<" if elf.little_endian else ">"
    (crc,) = struct.unpack_from(order + "I", data, crc_at)
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
