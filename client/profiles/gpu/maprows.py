"""A cudakernels map's rows, unpacked by the struct layouts the program
writes (cudakernels.bpf.c): the reader the smaller maps share, and the row
flags and sampling weight that `kernels` and `copy_stacks` share."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gfxbpf.client.handle import Attachment

LAUNCH_SEEN = 1  # a row's flags: its launch was probed (chain, stack pointer, weight known)
NOT_SAMPLED = 2  # a row's flags: the library's sampling left its launch out


def sample_weight(flags: int, weight: int) -> int:
    """How many launches each one a row counted stands for: its sampling
    weight if its launch was probed, else 1."""
    return weight if flags & LAUNCH_SEEN and weight > 1 else 1


def struct_rows(
    att: Attachment, name: str, key: struct.Struct, value: struct.Struct
) -> list[tuple[tuple[Any, ...], tuple[Any, ...]]]:
    """A map's (key, value) rows unpacked, rows of other sizes left out ([]
    from a program without the map: a broker older than the client)."""
    m = att.maps.get(name)
    if m is None:
        return []
    return [
        (key.unpack(k), value.unpack(v))
        for k, v in m.raw_items()
        if len(k) == key.size and isinstance(v, bytes) and len(v) == value.size
    ]
