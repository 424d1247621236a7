"""Program `cudakernels`' tables: kernels and device nanoseconds per (process,
user, Python chain hash, kernel name hash, launch stack pointer), the kernels' names, and what the
injection library's launch sampling makes of a row.

When launches come faster than the library's launch rate
(GFX_CUPTI_LAUNCH_RATE, 2000 per second), it probes 1 launch in N at random:
a row then holds its sampled kernels and their weight N (estimate()), and
the kernels of launches left out have rows of their own (NOT_SAMPLED), so
the totals per kernel stay exact (Totals).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gfxbpf.client.errors import BrokerError, ClientError, UsageError
from gfxbpf.client.libcuda import mapped_files
from gfxbpf.client.profiles.gpu.maprows import LAUNCH_SEEN, NOT_SAMPLED, sample_weight

if TYPE_CHECKING:
    from gfxbpf.client.broker import Broker
    from gfxbpf.client.handle import Attachment
    from gfxbpf.client.profiles.copies import ProbeCopyReader
    from gfxbpf.client.profiles.model import RawStack

PROGRAM = "cudakernels"
LIBRARY_PREFIX = "libgfxcupti"
KERNEL_KEY = struct.Struct("<IIQQIIQ")  # cudakernels.bpf.c struct kernel_key
KERNEL_STATS = struct.Struct("<QQ")
UNCOUNTED = (1).to_bytes(4, "little")  # cudakernels.bpf.c: lost[1], kernels not counted

# tgid, uid, chain hash, name hash, flags, weight, stack pointer at the launch probe
Row = tuple[int, int, int, int, int, int, int]


def find_injection(pid: int) -> str:
    """The injection library process pid loaded (CUDA_INJECTION64_PATH)."""
    for path in mapped_files(pid):
        if os.path.basename(path).startswith(LIBRARY_PREFIX) and ".so" in path:
            return path
    raise UsageError(
        f"process {pid} has not loaded gfxbpf's CUPTI injection library: start it with "
        "CUDA_INJECTION64_PATH=/opt/gfxbpf/cupti/libgfxcupti-cu13.so (-cu12 for CUDA 12; "
        "README.md, GPU time), or give the file with --library PATH"
    )


def attach_kernels(broker: Broker, what: str, library: str, kw: dict[str, Any]) -> Attachment:
    """cudakernels on library; a refusal says which grant to ask for (what: the command)."""
    try:
        return broker.attach(PROGRAM, library=library, **kw)
    except BrokerError as e:
        if not e.refuses_program:
            raise  # the process's fault (not yours, gone), not the grant's
        if "max_stack_bytes" in (e.rule or ""):
            raise  # granted, but not a copy this large: the broker's words say so
        why = (
            f"{what} needs program {PROGRAM} on {library} (scope {kw['scope']}), "
            f"which the policy does not grant you: ask the administrator for it "
            f"(gfxbpf-admin approve {PROGRAM} --libraries '.../libgfxcupti-cu*.so').\n  "
            f"broker: {e.message}"
        )
        raise BrokerError(e.code, why, e.rule, operation=e.operation) from None


def estimate(row: Row, n: int, ns: int) -> tuple[int, int]:
    """A row's kernels and device ns for its chain: scaled by its weight."""
    weight = sample_weight(row[4], row[5])
    return n * weight, ns * weight


def read_rows(att: Attachment) -> list[tuple[Row, int, int]]:
    """(row, kernels, device ns) of every row of the map `kernels`."""
    out = []
    for k, v in att.map("kernels").raw_items():
        if len(k) != KERNEL_KEY.size or not isinstance(v, bytes) or len(v) != KERNEL_STATS.size:
            raise ClientError(f"{PROGRAM}'s map 'kernels': unexpected sizes (update gfxclient)")
        n, ns = KERNEL_STATS.unpack(v)
        out.append((KERNEL_KEY.unpack(k), n, ns))
    return out


def read_names(att: Attachment) -> dict[int, str]:
    """Kernel name hash -> the name, from the map `names`."""
    out = {}
    for k, v in att.map("names").raw_items():
        if len(k) == 8 and isinstance(v, bytes):
            out[struct.unpack("<Q", k)[0]] = v.split(b"\0", 1)[0].decode(errors="replace")
    return out


@dataclass
class Totals:
    """Exact counts over every row, and how many kernels' launches were left out."""

    kernels: int = 0
    device_ns: int = 0
    not_sampled: int = 0

    @classmethod
    def of(cls, rows: list[tuple[Row, int, int]]) -> Totals:
        t = cls()
        for row, n, ns in rows:
            t.kernels += n
            t.device_ns += ns
            t.not_sampled += n if row[4] & NOT_SAMPLED else 0
        return t

    def note(self) -> str | None:
        if not self.not_sampled:
            return None
        return (
            f"launches came too fast to probe each: {self.not_sampled} of {self.kernels} kernels "
            "were launched unprobed, so counts and times per launching function (~) are "
            "estimates from a random sample; the totals are exact"
        )


def launch_stacks(copies: ProbeCopyReader, att: Attachment) -> tuple[list[RawStack], list[str]]:
    """profile --gpu: each (launch stack, kernel) weighed by its device ns, the
    kernel's name as leaf (sampled launches stand for those left out: their
    estimated ns), and each copy's or memset's the same way with its kind as
    leaf; and the notes: on launch sampling, if it sampled, and on
    why no kernel came, if none did."""
    from gfxbpf.client.profiles.gpu import refusals, transfers

    names = read_names(att)
    rows = read_rows(att)
    raw = [
        copies.chain_stack(
            row[0],
            row[2],
            row[3],
            row[6],
            names.get(row[3], f"[kernel {row[3]:#x}]"),
            estimate(row, n, ns)[1],
        )
        for row, n, ns in rows
        if not row[4] & NOT_SAMPLED
    ]
    launched = transfers.read_launched(att)
    raw += [
        copies.chain_stack(c.pid, c.chain, transfers.COPY_LAUNCH, c.sp, c.leaf(), c.estimated_ns())
        for c in launched
        if c.flags & LAUNCH_SEEN
    ]
    sampled = Totals.of(rows).note()
    moved = transfers.note(transfers.read_transfers(att), launched)
    notes = [n for n in (sampled, moved) if n] + refusals.notes(att)
    if not raw and not notes:
        notes.append(
            "no kernel ran on the GPU while attached (is the process launching, and was it "
            "started with CUDA_INJECTION64_PATH?)"
        )
    return raw, notes
