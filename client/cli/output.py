"""What gfxclient commands share in their output: JSON lines, escaped text,
and map keys as people know them (syscall and function names, DRM clients).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, TextIO

from gfxbpf.client.cli.connecting import CUDA_PROGRAM
from gfxbpf.client.cli.display import format_key, json_line
from gfxbpf.client.drmclients import DrmClientNames
from gfxbpf.client.handle import Attachment, ClientMap
from gfxbpf.client.mapdata import MapData
from gfxbpf.client.printable import printable
from gfxbpf.client.syscalls import syscall_name


def load_cuda_view() -> ModuleType:
    from gfxbpf.client.cli import cuda_view

    return cuda_view


def key_formatter(
    att: Attachment,
    cmap: ClientMap | MapData,
    functions: list[str],
    drm_clients: DrmClientNames | None = None,
) -> Any:
    """Keys as people know them: syscall numbers as names, function indexes as
    names, DRM client ids with the caller's own processes that hold them."""
    label = cmap.key_label
    if att.program == CUDA_PROGRAM:
        return load_cuda_view().key_text

    def fmt(key: Any) -> str:
        if label == DRM_CLIENT_LABEL and drm_clients is not None:
            if isinstance(key, str) and key.isdigit():  # a histogram's group label
                key = int(key)
            if isinstance(key, int):
                return drm_clients.label(key)
        if isinstance(key, int) and not isinstance(key, bool):
            if label == "syscall":
                return syscall_name(key)
            if label == "function" and 0 <= key < len(functions):
                return functions[key]
        return format_key(key)

    return fmt


# The catalog's key_label of maps keyed by a DRM client id (drmsched).
DRM_CLIENT_LABEL = "DRM client id"


def dump_json(obj: Any, out: TextIO) -> None:
    out.write(json_line(obj) + "\n")
    out.flush()


def write_lines(out: TextIO, lines: list[str], end: str = "\n") -> None:
    """Text for a terminal, escaped where it leaves (printable): other users'
    strings in it were escaped where they were formatted, this holds for all."""
    out.write("\n".join(printable(ln) for ln in lines) + end)
