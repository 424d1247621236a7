"""The GPU's own time in copies and memsets: program `cudakernels`' map
`copies`, which the injection library's memcpy and memset records fill per
(process, user, kind) with their count, bytes and device nanoseconds."""

from __future__ import annotations

import struct
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from gfxbpf.catalog.cupti_kinds import copy_kind
from gfxbpf.client.humanize import humanize_bytes, humanize_ns
from gfxbpf.client.profiles.gpu.maprows import struct_rows

if TYPE_CHECKING:
    from gfxbpf.client.handle import Attachment

MAP = "copies"
KEY = struct.Struct("<IIII")  # cudakernels.bpf.c struct copy_key: tgid, uid, kind, pad
STATS = struct.Struct("<QQQ")  # struct copy_stats: copies, bytes, device_ns


@dataclass(frozen=True)
class Transfer:
    pid: int
    uid: int
    kind: str  # htod, dtoh, dtod, ..., memset (gfxbpf.catalog.cupti_kinds)
    copies: int
    bytes: int
    device_ns: int

    def bandwidth(self) -> float | None:
        """Bytes per second of device time (None: no time measured)."""
        return self.bytes * 1e9 / self.device_ns if self.device_ns else None

    def as_json(self) -> dict[str, object]:
        return asdict(self)


def read_transfers(att: Attachment) -> list[Transfer]:
    """The map's rows, most device time first ([] from a program without it)."""
    rows = struct_rows(att, MAP, KEY, STATS)
    out = [Transfer(pid, uid, copy_kind(kind), *v) for (pid, uid, kind, _pad), v in rows]
    return sorted(out, key=lambda t: (-t.device_ns, t.pid, t.kind))


def note(transfers: list[Transfer]) -> str | None:
    """profile --gpu's word on them: their GPU time by kind, which the flame
    graph leaves out (the program keeps no launch stack for a copy)."""
    if not transfers:
        return None
    kinds: dict[str, list[int]] = {}
    for t in transfers:
        k = kinds.setdefault(t.kind, [0, 0, 0])
        k[0] += t.copies
        k[1] += t.bytes
        k[2] += t.device_ns
    parts = ", ".join(
        f"{kind} {n} ({humanize_bytes(b)}, {humanize_ns(ns)})"
        for kind, (n, b, ns) in sorted(kinds.items(), key=lambda kv: -kv[1][2])
    )
    return (
        f"copies and memsets took GPU time too, not drawn above (no launch stack is kept "
        f"for them): {parts}"
    )
