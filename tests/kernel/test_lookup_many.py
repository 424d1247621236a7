"""Map.lookup_many (many single lookups with one set of buffers, for maps
without batch ops such as a stack table) against the real kernel."""

from __future__ import annotations

import struct

import pytest

from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.consts import MapType
from gfxbpf.bpf.maps import Map

pytestmark = pytest.mark.kernel


def u32(n: int) -> bytes:
    return struct.pack("<I", n)


def test_lookup_many_returns_present_keys_in_order() -> None:
    with Map.from_fd(bpfsys.map_create(MapType.HASH, 4, 16, 64, name="t_many")) as m:
        for k in (3, 1, 7):
            m.update(k, bytes([k]) * 16)
        got = m.lookup_many([u32(7), u32(2), 1, u32(3)])
        assert got == [(u32(7), b"\7" * 16), (u32(1), b"\1" * 16), (u32(3), b"\3" * 16)]
        assert m.lookup_many([]) == []
        with pytest.raises(ValueError, match="key_size"):
            m.lookup_many([b"\0\0"])


def test_lookup_many_per_cpu_splits_values() -> None:
    ncpu = bpfsys.possible_cpus()
    with Map.from_fd(bpfsys.map_create(MapType.PERCPU_HASH, 4, 8, 8, name="t_many_pc")) as m:
        m.update(5, 9)
        assert m.lookup_many([u32(5), u32(6)]) == [(u32(5), [struct.pack("<Q", 9)] * ncpu)]


def test_lookup_many_reports_other_errors() -> None:
    # A queue map has no keys: lookup by key is refused, not taken as "absent".
    fd = bpfsys.map_create(MapType.STACK, 0, 8, 4, name="t_many_q")
    with Map.from_fd(fd) as m, pytest.raises(OSError):
        m.lookup_many([b""])
