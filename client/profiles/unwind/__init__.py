"""gfxbpf.client.profiles.unwind: complete user stacks without frame pointers.

The BPF program copies the user registers and the top of the user stack (8 KiB
by default, up to 16 KiB: gfxbpf.catalog.stack_copies) from sp upward; the
client unwinds that copy offline by the call-frame information (.eh_frame,
else .debug_frame, also from a separate debug file) of every file the
process maps, as perf's --call-graph dwarf does:

    tables = UnwindTables()                     # one per client run; cached on disk
    maps = procmaps.capture(pid)                # while the process lives
    result = unwind(UserRegs(ip, sp, bp), stack_bytes, maps, tables)
    result.frames   # (ip, return address, ...) innermost first, every one code
    result.stop     # None: reached the thread's first frame; else a Stop reason
    counts = StopCounts(); counts.add(result.stop, weight); counts.notes()
    marker_frame(result.stop)   # "[unwind stopped: no CFI]": the outermost frame

Pure client code: it reads the caller's own files and never the broker.
"""

from __future__ import annotations

from gfxbpf.client.profiles.unwind.result import (
    MAX_FRAMES,
    CopySize,
    Stop,
    StopCounts,
    UnwindResult,
    UserRegs,
    marker_frame,
)
from gfxbpf.client.profiles.unwind.tables import UnwindTables
from gfxbpf.client.profiles.unwind.walk import unwind

__all__ = [
    "MAX_FRAMES",
    "CopySize",
    "Stop",
    "StopCounts",
    "UnwindResult",
    "UnwindTables",
    "UserRegs",
    "marker_frame",
    "unwind",
]
