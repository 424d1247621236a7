"""The CUDA driver library of a process, and the names of the cuda program's keys.

Library code shared by `gfxclient watch cuda` (client/cli/cuda_view.py) and the
exporter: where a process maps libcuda, and which function of the table
(gfxbpf.catalog.cuda_api) a map key names. The broker attaches by the same table,
and a key's function member is its index.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from gfxbpf.catalog import cuda_api
from gfxbpf.catalog.function_tables import TableFunction
from gfxbpf.client import family
from gfxbpf.client.errors import UsageError

PROGRAM = "cuda"
FUNCTION_NAMES = tuple(f.name for f in cuda_api.FUNCTIONS)


class NoLibcudaYet(UsageError):
    """The process runs but maps no libcuda (yet): asking again later may find it."""


def is_libcuda(path: str) -> bool:
    """libcuda.so, libcuda.so.1, libcuda.so.580.159.04 — not libcudart or libcudnn."""
    base = os.path.basename(path)
    return base == "libcuda.so" or base.startswith("libcuda.so.")


def mapped_files(pid: int, maps_path: str | None = None) -> list[str]:
    """The files process pid maps, from its /proc/PID/maps (" (deleted)" kept).

    Reading another user's maps fails (the kernel's ptrace check), which is
    also what the broker would say: only your own processes.
    """
    path = maps_path or f"/proc/{pid}/maps"
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise UsageError(f"no process {pid}") from None
    except PermissionError:
        raise UsageError(
            f"cannot read /proc/{pid}/maps: process {pid} is not yours (gfxclient "
            "traces only your own processes)"
        ) from None
    except OSError as e:
        raise UsageError(f"cannot read /proc/{pid}/maps: {e.strerror}") from None
    parts = (line.split(None, 5) for line in lines)
    return [p[5] for p in parts if len(p) == 6 and p[5].startswith("/")]


def find_libcuda(pid: int, maps_path: str | None = None) -> str:
    """The libcuda file process pid has mapped, from its /proc/PID/maps."""
    deleted = None
    for mapped in mapped_files(pid, maps_path):
        if mapped.endswith(" (deleted)"):
            if is_libcuda(mapped[: -len(" (deleted)")]):
                deleted = mapped
            continue
        if is_libcuda(mapped):
            return mapped
    if deleted:
        raise UsageError(
            f"process {pid} maps {deleted}: the file was replaced since it was loaded "
            "(a driver update?); restart the process, or give --library"
        )
    raise NoLibcudaYet(
        f"process {pid} has no libcuda mapped: it has not initialised CUDA yet (the "
        "driver library loads at the first CUDA call), or it uses no NVIDIA GPU. "
        "Start watching after its CUDA setup, or give the file with --library PATH"
    )


def find_libcuda_in_tree(pid: int, children: bool) -> str:
    """find_libcuda in pid or, with children, the first of its descendants that
    maps it (a launcher whose workers use the GPU)."""
    try:
        return find_libcuda(pid)
    except NoLibcudaYet:
        if not children:
            raise
        for child in sorted(family.descendants([pid])):
            with contextlib.suppress(UsageError):
                return find_libcuda(child)
        raise


def function_of(key: Any) -> TableFunction | None:
    """The table entry a key names: its function member, a bare index, or a
    histogram's label text; None when it names none."""
    idx = key.get("function", key) if isinstance(key, dict) else key
    if isinstance(idx, str) and idx.isdigit():
        idx = int(idx)
    if isinstance(idx, int) and not isinstance(idx, bool) and 0 <= idx < len(FUNCTION_NAMES):
        return cuda_api.FUNCTIONS[idx]
    return None
