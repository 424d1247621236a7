"""The rows of program memstacks as stacks: bytes allocated (--memory) or
bytes still held at the end (--memory-live) per allocating stack."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from gfxbpf.catalog import memory_api
from gfxbpf.client.errors import ProtocolError

if TYPE_CHECKING:
    from gfxbpf.client.profiles.copies import ProbeCopyReader
    from gfxbpf.client.profiles.model import RawStack

SITES = "sites"  # the program's rows
# struct call_key (memstacks.bpf.c): tgid, function, caller, Python chain hash,
# path hash (ustackcopy's rows, less the profile's start); the copies carry
# the path hash as ustackcopy's do
MEM_KEY = struct.Struct("<IIQQQ")
# struct mem_row (memstacks.bpf.c): allocations, bytes, live bytes, frees, untracked
MEM_ROW = struct.Struct("<QQQQQ")
NAMES = tuple(f.name for f in memory_api.FUNCTIONS)


def memory_stacks(
    reader: ProbeCopyReader, rows: Iterable[tuple[bytes, Any]], live: bool
) -> list[RawStack]:
    """One RawStack per row with bytes: allocated, or live (still held) when live."""
    out = []
    reader.python.resolve(final=True)
    for key, value in rows:
        if len(key) != MEM_KEY.size or len(value) != MEM_ROW.size:
            raise ProtocolError("memstacks' map 'sites': unexpected sizes (update gfxclient)")
        row = MEM_KEY.unpack(key)
        allocated, held = MEM_ROW.unpack(value)[1:3]
        weight = held if live else allocated
        if weight <= 0 or weight >= 1 << 63:  # a free racing its allocation's count
            continue
        function = row[1]
        leaf = NAMES[function] if function < len(NAMES) else f"[function {function}]"
        out.append(reader.row_stack(row, leaf, weight))
    return out


def totals(rows: Iterable[tuple[bytes, Any]]) -> dict[str, int]:
    """The sums of every row: allocations, bytes allocated, bytes live, frees
    matched, allocations whose frees could not be matched."""
    sums = [0] * 5
    for _key, value in rows:
        if len(value) == MEM_ROW.size:
            for i, v in enumerate(MEM_ROW.unpack(value)):
                sums[i] += v
    names = ("allocations", "bytes", "live_bytes", "frees", "untracked")
    return dict(zip(names, sums, strict=True))


def notes(
    library: str, live: bool, cuda: bool, sample_bytes: int = 0, untracked: int = 0
) -> list[str]:
    """What a memory profile's numbers are, for its report."""
    what = "still held at the end" if live else "allocated"
    out = [f"bytes {what} per allocating stack, probed in {library}"]
    if untracked and live:
        out.append(
            f"{untracked} allocations were left out of the bytes held: more were live at once "
            "than the broker's table of addresses holds, so their frees could not be matched "
            "(use --sample-bytes, which tracks only the allocations it records)"
        )
    if sample_bytes:
        out.append(
            f"sampled: about one allocation recorded per {sample_bytes} bytes, each weighed "
            "by the bytes it stands for; stacks that allocate little may be missing"
        )
    if cuda:
        out.append(
            "device memory as the CUDA driver allocated it: PyTorch's caching allocator "
            "(and other pools) asks for whole segments (2 MiB and up, or its expandable "
            "segments through cuMemCreate) and hands out tensors inside them, so a stack "
            "here is the one that grew the pool, weighed by the segment's size; "
            "torch.cuda.memory_stats() counts the tensors"
        )
    return out
