"""GPU kernel time per user, process and kernel: program cudakernels' keys as labels.

cudakernels (catalog/programs/cudakernels.bpf.c) keys its `kernels` table by
(tgid, uid, Python chain hash, kernel name hash, flags, sampling weight, launch
stack pointer); the names live
in its `names` map. For the exporter (scope system: no chain) a series is
labelled pid, uid, user (the uid's name, so a dashboard groups by people)
and kernel: the kernel's name demangled and cut to NAME_MAX characters, so
that label values stay bounded too (series whose names agree in those
characters add up). The `copies` table's kind is named (htod, dtoh, ...,
memset) as gfxclient names it. How many series a metric keeps at all is the
exporter's per-program `limit`, the largest first.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from gfxbpf.catalog.cupti_kinds import copy_kind
from gfxbpf.client import Attachment
from gfxbpf.client.humanize import user_name
from gfxbpf.client.profiles.demangle import demangle

PROGRAM = "cudakernels"
NAME_MAX = 120
# Key members that name no series: padding, the chain (0 in scope system),
# the join flag, the launch sampling's weight and the launch path's stack
# pointer (0 in scope system) (a row counts what it saw: summed over them, a
# kernel's series is exact); the name hash becomes the kernel's name.
DROPPED = frozenset({"pad", "python", "flags", "weight", "sp"})


def kernel_names(att: Attachment) -> dict[int, str]:
    """name hash -> the kernel's name as a label value."""
    raw = {}
    for key, value in att.map("names").raw_items():
        if len(key) == 8 and isinstance(value, bytes):
            raw[struct.unpack("<Q", key)[0]] = value.split(b"\0", 1)[0].decode(errors="replace")
    readable = demangle(raw.values())
    return {h: cut(readable.get(n, n)) for h, n in raw.items()}


def cut(name: str) -> str:
    """At most NAME_MAX characters (a label value)."""
    return name if len(name) <= NAME_MAX else name[: NAME_MAX - 1] + "…"


def relabel(entries: Sequence[tuple[Any, Any]], names: dict[int, str]) -> list[tuple[Any, Any]]:
    """A cudakernels table's decoded entries with keys as labels: `kernels` by
    pid, uid, user and kernel; `copies` by pid, uid, user and kind."""
    out = []
    for key, value in entries:
        if not isinstance(key, dict):
            out.append((key, value))
            continue
        labels = {k: v for k, v in key.items() if k not in DROPPED and k != "name_hash"}
        if isinstance(labels.get("uid"), int):
            labels["user"] = user_name(labels["uid"])
        if isinstance(labels.get("kind"), int):
            labels["kind"] = copy_kind(labels["kind"])
        if "name_hash" in key:
            h = key["name_hash"]
            labels["kernel"] = names.get(h, f"{h:#x}") if isinstance(h, int) else str(h)
        out.append((labels, value))
    return out
