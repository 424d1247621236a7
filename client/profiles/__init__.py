"""gfxbpf.client.profiles: turn raw stacks from the broker into named profiles.

    maps = procmaps.capture(pid)            # while the process lives
    sym = Symbolizer(); sym.add_process(pid, maps)
    profile = sym.symbolize(raw_stacks, unit="samples", period_ns=10_101_010)
    write_profile(profile, "svg", "out.svg"); print(format_top(profile, 10))

Everything here runs as the user, reads only the user's own files and never
imports the broker. Kernel frames arrive as one flag (RawStack.kernel), never
as addresses, so no output can leak one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gfxbpf.bpf.lazy import lazy_exports

if TYPE_CHECKING:
    from gfxbpf.client.profiles.model import Profile, RawStack
    from gfxbpf.client.profiles.procmaps import Mapping, ProcessMaps, capture, snapshot_state
    from gfxbpf.client.profiles.symbolize import Symbolizer
    from gfxbpf.client.profiles.writers import (
        FORMATS,
        format_of,
        format_top,
        top_functions,
        write_profile,
    )

# Imported on first use: the symbolizer pulls in the ELF and unwind readers, and every
# gfxclient command imports profile_cmd to build its parser (issue #15).
_HOMES = {
    "Profile": "model",
    "RawStack": "model",
    "Mapping": "procmaps",
    "ProcessMaps": "procmaps",
    "capture": "procmaps",
    "snapshot_state": "procmaps",
    "Symbolizer": "symbolize",
    "FORMATS": "writers",
    "format_of": "writers",
    "format_top": "writers",
    "top_functions": "writers",
    "write_profile": "writers",
}


__getattr__ = lazy_exports(__name__, _HOMES, globals())


__all__ = [
    "FORMATS",
    "Mapping",
    "ProcessMaps",
    "Profile",
    "RawStack",
    "Symbolizer",
    "capture",
    "format_of",
    "format_top",
    "snapshot_state",
    "top_functions",
    "write_profile",
]
