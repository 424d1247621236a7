"""One ELF file -> its FileTable: the CFI sections found (.eh_frame, else
.debug_frame, else the separate debug file's .debug_frame), parsed by cfi.py
and compiled into sorted rows."""

from __future__ import annotations

from gfxbpf.client.profile.elfinfo import ElfInfo, read_info
from gfxbpf.client.profile.unwind.table import FileTable

__all__ = ["compile_file", "file_facts"]


def file_facts(path: str) -> ElfInfo | None:
    """build-id, debuglink and segments (None: unreadable or not ELF)."""
    return read_info(path)


def compile_file(path: str, info: ElfInfo, debug_root: str) -> FileTable | None:
    """The file's table; one with no rows if it has no CFI at all (frame
    pointers are then the only way through it); None if it cannot be read."""
    raise NotImplementedError("the CFI parser lands in the next commit")
