"""The GPU's own time in copies and memsets: program `cudakernels`' map
`copies`, which the injection library's memcpy and memset records fill per
(process, user, kind) with their count, bytes and device nanoseconds; and, in
scope self, `copy_stacks`, the same per launch (Python chain and stack
pointer at the copy or memset call), which profile --gpu draws."""

from __future__ import annotations

import struct
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from gfxbpf.catalog.cupti_kinds import copy_kind
from gfxbpf.client.humanize import humanize_bytes, humanize_ns
from gfxbpf.client.profiles.gpu.maprows import sample_weight, struct_rows

if TYPE_CHECKING:
    from gfxbpf.client.handle import Attachment

MAP = "copies"
KEY = struct.Struct("<IIII")  # cudakernels.bpf.c struct copy_key: tgid, uid, kind, pad
STATS = struct.Struct("<QQQ")  # struct copy_stats: copies, bytes, device_ns
STACK_MAP = "copy_stacks"
# struct copy_stack_key: tgid, uid, kind, flags, Python chain, stack pointer, weight, pad
STACK_KEY = struct.Struct("<IIIIQQII")
COPY_LAUNCH = 1  # gfx_cupti.h GFX_CUPTI_COPY_LAUNCH: the kernel a copy's stack copy carries


@dataclass(frozen=True)
class Transfer:
    pid: int
    uid: int
    kind: str  # htod, dtoh, dtod, ..., memset (gfxbpf.catalog.cupti_kinds)
    copies: int
    bytes: int
    device_ns: int

    def as_json(self) -> dict[str, object]:
        return asdict(self)


def read_transfers(att: Attachment) -> list[Transfer]:
    """The map's rows, most device time first ([] from a program without it)."""
    rows = struct_rows(att, MAP, KEY, STATS)
    out = [Transfer(pid, uid, copy_kind(kind), *v) for (pid, uid, kind, _pad), v in rows]
    return sorted(out, key=lambda t: (-t.device_ns, t.pid, t.kind))


@dataclass(frozen=True)
class LaunchedCopies:
    """A row of `copy_stacks`: the copies of one kind from one launch path."""

    pid: int
    uid: int
    kind: str
    flags: int
    chain: int
    sp: int
    weight: int
    copies: int
    bytes: int
    device_ns: int

    def leaf(self) -> str:
        """The flame graph's leaf, where a kernel has its name."""
        return "[memset]" if self.kind == "memset" else f"[memcpy {self.kind}]"

    def scale(self) -> int:
        """How many copies each one counted stands for: a sampled launch, `weight`."""
        return sample_weight(self.flags, self.weight)

    def estimated_ns(self) -> int:
        """Its device time for its chain."""
        return self.device_ns * self.scale()


def read_launched(att: Attachment) -> list[LaunchedCopies]:
    """The rows of `copy_stacks` ([] from a broker whose program lacks it)."""
    rows = struct_rows(att, STACK_MAP, STACK_KEY, STATS)
    return [
        LaunchedCopies(pid, uid, copy_kind(kind), flags, chain, sp, weight, *v)
        for (pid, uid, kind, flags, chain, sp, weight, _pad), v in rows
    ]


def note(transfers: list[Transfer], launched: list[LaunchedCopies]) -> str | None:
    """profile --gpu's word on them: their GPU time by kind, and how much of
    it the flame graph leaves out: copies whose launch the program did not
    see (made before the attach, or by an older injection library)."""
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
    total = sum(t.copies for t in transfers)
    unseen = total - sum(c.copies for c in launched)
    unseen_ns = sum(t.device_ns for t in transfers) - sum(c.device_ns for c in launched)
    if unseen <= 0:
        return f"copies and memsets are drawn as [memcpy KIND] and [memset] leaves: {parts}"
    return (
        f"copies and memsets took GPU time too: {parts}; {unseen} of them "
        f"({humanize_ns(max(unseen_ns, 0))}) are not drawn, as their calls came before the "
        "attach, or the process's injection library fires no launch probe for them (built "
        "before 2026-11-29: tools/setup.sh rebuilds it)"
    )
