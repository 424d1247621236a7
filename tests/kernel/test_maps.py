"""Map access against the real kernel: element ops, iteration, batch, per-CPU,
and a process without capabilities reading an fd it was handed."""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Iterator

import pytest

from gfxbpf.bpf import maps as mapsmod
from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.btf.facade import Btf
from gfxbpf.bpf.consts import BPF_EXIST, BPF_F_NO_PREALLOC, BPF_F_RDONLY, BPF_NOEXIST, MapType
from gfxbpf.bpf.maps import Map, sum_percpu, sum_percpu_u64s
from tests.kernel.sysmaps_util import ChildError, map_fd_by_id, run_unprivileged

NCPU = bpfsys.possible_cpus()


def u32(n: int) -> bytes:
    return struct.pack("<I", n)


def u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def make(map_type: int, key_size: int, value_size: int, max_entries: int, **kw: object) -> Map:
    fd = bpfsys.map_create(map_type, key_size, value_size, max_entries, **kw)  # type: ignore[arg-type]
    return Map.from_fd(fd)


@pytest.fixture
def hash_map() -> Iterator[Map]:
    with make(MapType.HASH, 4, 8, 64, name="t_hash") as m:
        yield m


def test_hash_update_lookup_delete(hash_map: Map) -> None:
    m = hash_map
    assert m.lookup(1) is None
    m.update(1, u64(111))
    m[2] = 222
    assert m.lookup(u32(1)) == u64(111)
    assert m[2] == u64(222)
    # NOEXIST on an existing key and EXIST on a missing one fail with the kernel's errno.
    with pytest.raises(bpfsys.BpfError) as ei:
        m.update(1, 5, BPF_NOEXIST)
    assert ei.value.errno == errno.EEXIST and ei.value.command == "BPF_MAP_UPDATE_ELEM"
    with pytest.raises(bpfsys.BpfError) as ei:
        m.update(3, 5, BPF_EXIST)
    assert ei.value.errno == errno.ENOENT
    assert m.delete(1) is True
    assert m.delete(1) is False
    assert m.lookup(1) is None
    assert list(m.keys()) == [u32(2)]
    assert list(m.items()) == [(u32(2), u64(222))]
    with pytest.raises(KeyError):
        m[1]
    with pytest.raises(ValueError, match="key_size"):
        m.lookup(b"\0\0")
    with pytest.raises(ValueError, match="value_size"):
        m.update(5, b"short")


def test_map_info_and_names() -> None:
    fd = bpfsys.map_create(
        MapType.HASH, 8, 16, 32, flags=BPF_F_NO_PREALLOC, name="abcdefghij.klmnopq"
    )
    try:
        info = bpfsys.map_info(fd)
        assert (info.type, info.key_size, info.value_size, info.max_entries) == (1, 8, 16, 32)
        assert info.map_flags == BPF_F_NO_PREALLOC
        assert info.name == "abcdefghij.klmn"  # truncated to 15 characters
        assert info.id > 0
        m = Map.from_fd(fd)
        assert (m.name, m.map_type, m.key_size, m.value_size) == ("abcdefghij.klmn", 1, 8, 16)
    finally:
        os.close(fd)
    with pytest.raises(ValueError, match="letters, digits"):
        bpfsys.map_create(MapType.HASH, 4, 4, 1, name="bad-name")


def test_array_map() -> None:
    with make(MapType.ARRAY, 4, 12, 5, name="t_array") as m:
        # Every index exists from the start, zero-filled.
        assert [m.lookup(i) for i in range(5)] == [bytes(12)] * 5
        assert m.lookup(5) is None
        m.update(3, b"hello world!")
        assert list(m.keys()) == [u32(i) for i in range(5)]
        items = m.batch_items()
        assert items == [(u32(i), b"hello world!" if i == 3 else bytes(12)) for i in range(5)]
        with pytest.raises(bpfsys.BpfError) as ei:
            m.delete(3)
        assert ei.value.errno == errno.EINVAL


@pytest.mark.parametrize("map_type", [MapType.PERCPU_ARRAY, MapType.PERCPU_HASH])
def test_percpu_values(map_type: int) -> None:
    # value_size 4 is padded to 8 per CPU in the syscall buffer.
    with make(map_type, 4, 4, 8, name="t_percpu") as m:
        assert m.percpu and m.ncpus == NCPU and m.buf_size == 8 * NCPU
        per_cpu = [u32(100 + cpu) for cpu in range(NCPU)]
        m.update(2, per_cpu)
        assert m.lookup(2) == per_cpu
        assert m.sum_values(2) == sum(100 + cpu for cpu in range(NCPU))
        m.update(5, 7)  # one value is written to every CPU's slot
        assert m.lookup(5) == [u32(7)] * NCPU
        assert sum_percpu(m.lookup(5)) == 7 * NCPU  # type: ignore[arg-type]
        items = dict(m.batch_items())
        assert items[u32(2)] == per_cpu and items[u32(5)] == [u32(7)] * NCPU
        with pytest.raises(ValueError, match="one per possible CPU"):
            m.update(1, [u32(1)] * (NCPU + 1))


def test_sum_percpu_u64s() -> None:
    assert sum_percpu_u64s([u64(1) + u64(10), u64(2) + u64(20)]) == [3, 30]
    assert sum_percpu([b"\xff\xff\xff\xff"] * 2, signed=True) == -2


def test_lru_hash_evicts() -> None:
    with make(MapType.LRU_HASH, 4, 8, 128, name="t_lru") as m:
        for i in range(1000):
            m.update(i, i)
        keys = list(m.keys())
        assert 0 < len(keys) <= 128
        assert len(set(keys)) == len(keys)
        # The newest key always survives eviction.
        assert m.lookup(999) == u64(999)
        batch = dict(m.batch_items())
        assert set(batch) <= {u32(i) for i in range(1000)}
        assert all(v == u64(struct.unpack("<I", k)[0]) for k, v in batch.items())


def test_batch_10000_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 10_000
    with make(MapType.HASH, 4, 8, n, name="t_batch") as m:
        for i in range(n):
            m.update(i, i * 7 + 3)
        items = m.batch_items()
        assert len(items) == n
        assert dict(items) == {u32(i): u64(i * 7 + 3) for i in range(n)}
        # Small chunks: many calls, each resuming from the previous token.
        calls = []
        real = bpfsys.map_lookup_batch

        def counting(*a: object) -> tuple[bytes, bytes, int, bytes | None]:
            calls.append(a)
            return real(*a)  # type: ignore[arg-type]

        monkeypatch.setattr(mapsmod, "BATCH_BYTES", 12 * 97)
        monkeypatch.setattr(bpfsys, "map_lookup_batch", counting)
        items = m.batch_items()
        assert len(calls) > n // 97
        assert len(items) == n and dict(items) == {u32(i): u64(i * 7 + 3) for i in range(n)}
        assert [k for k, _ in m.items()] and sorted(m.keys()) == sorted(u32(i) for i in range(n))


def pages(m: Map, size: int) -> tuple[list[tuple[bytes, object]], int]:
    """Every pair by Map.read_page, following the cursor; and how many pages."""
    out: list[tuple[bytes, object]] = []
    cursor, n = b"", 0
    while True:
        page = m.read_page(size, cursor)
        out.extend(page.items)
        n += 1
        if not page.cursor:
            return out, n
        cursor = page.cursor


def test_read_page_follows_the_cursor(monkeypatch: pytest.MonkeyPatch) -> None:
    with make(MapType.PERCPU_HASH, 4, 4, 1000, name="t_pages") as m:
        for i in range(1000):
            m.update(i, u32(i))
        items, n = pages(m, 97)
        assert n > 1000 // 97 and dict(items) == {u32(i): [u32(i)] * NCPU for i in range(1000)}
        assert len(items) == 1000
        with pytest.raises(mapsmod.CursorError):
            m.read_page(10, b"X" + bytes(8))
        with pytest.raises(mapsmod.CursorError):
            m.read_page(10, b"B" + bytes(3))  # a batch token is at least 8 bytes

        # Without batch lookup the walk goes by GET_NEXT_KEY, with a key cursor.
        def no_batch(*a: object) -> None:
            raise bpfsys.BpfError(errno.EINVAL, "BPF_MAP_LOOKUP_BATCH")

        monkeypatch.setattr(bpfsys, "map_lookup_batch", no_batch)
        first = m.read_page(97)
        assert len(first.items) == 97 and first.cursor[:1] == b"K"
        items, _ = pages(m, 97)
        assert dict(items) == {u32(i): [u32(i)] * NCPU for i in range(1000)}


def test_read_decodes_with_btf_stand_in() -> None:
    class StandIn:  # the btf.Btf interface Map uses: decode(type_id, data)
        def decode(self, type_id: int, data: bytes) -> object:
            return ("k" if type_id == 1 else "v", int.from_bytes(data, "little"))

    fd = bpfsys.map_create(MapType.HASH, 4, 8, 4, name="t_decode")
    with Map.from_fd(fd, btf=StandIn(), key_type_id=1, value_type_id=2) as m:  # type: ignore[arg-type]
        m.update(9, 90)
        assert m.read() == [(("k", 9), ("v", 90))]
    with make(MapType.HASH, 4, 8, 4) as raw:
        raw.update(9, 90)
        assert raw.read() == [(u32(9), u64(90))]


def test_read_decodes_with_kernel_btf() -> None:
    # One BTF type: INT "int" (4 bytes, signed). The kernel checks the ids.
    strings = b"\0int\0"
    types = struct.pack("<IIII", 1, 1 << 24, 4, (1 << 24) | 32)
    hdr = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strings))
    data = hdr + types + strings
    btf_fd = bpfsys.btf_load(data)
    try:
        fd = bpfsys.map_create(
            MapType.PERCPU_HASH, 4, 4, 4, btf_fd=btf_fd, btf_key_type_id=1, btf_value_type_id=1
        )
    finally:
        os.close(btf_fd)
    with Map.from_fd(fd, btf=Btf.parse(data)) as m:
        assert (m.key_type_id, m.value_type_id) == (1, 1)  # taken from map_info
        m.update(-3, [u32(cpu + 1) for cpu in range(NCPU)])
        assert m.read() == [(-3, [cpu + 1 for cpu in range(NCPU)])]
        assert m.decode_key(m.batch_items()[0][0]) == -3


def test_fds_are_close_on_exec(hash_map: Map) -> None:
    assert not os.get_inheritable(hash_map.fileno())


def test_keys_survive_deleting_the_current_key(hash_map: Map) -> None:
    m = hash_map
    for i in range(40):
        m.update(i, i)
    seen = []
    for k in m.keys():
        seen.append(k)
        m.delete(k)  # the next GET_NEXT_KEY restarts from the first key
    assert len(seen) == len(set(seen)) == 40
    assert list(m.keys()) == []


def test_batch_falls_back_for_types_without_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    # Stack-trace maps have lookup and GET_NEXT_KEY but no batch lookup.
    fd = bpfsys.map_create(MapType.STACK_TRACE, 4, 8 * 8, 16, name="t_stack")
    with Map.from_fd(fd) as m:
        with pytest.raises(bpfsys.BpfError) as ei:
            bpfsys.map_lookup_batch(fd, 4, 64, 4, None)
        assert ei.value.errno in (errno.EINVAL, errno.EOPNOTSUPP, bpfsys.ENOTSUPP)
        assert m.batch_items() == []  # the error is not raised: items() answered

    # The same fallback, with data, on a map whose batch lookup is made to fail.
    def no_batch(*a: object) -> None:
        raise bpfsys.BpfError(bpfsys.ENOTSUPP, "BPF_MAP_LOOKUP_BATCH")

    with make(MapType.HASH, 4, 8, 8) as h:
        h.update(1, 10)
        h.update(2, 20)
        monkeypatch.setattr(bpfsys, "map_lookup_batch", no_batch)
        assert sorted(h.batch_items()) == [(u32(1), u64(10)), (u32(2), u64(20))]


def test_freeze_blocks_syscall_writes() -> None:
    with make(MapType.ARRAY, 4, 8, 1) as m:
        m.update(0, 5)
        bpfsys.map_freeze(m.fileno())
        with pytest.raises(bpfsys.BpfError) as ei:
            m.update(0, 6)
        assert ei.value.errno == errno.EPERM
        assert m.lookup(0) == u64(5)


def test_rdonly_map_refuses_updates_even_to_root() -> None:
    with make(MapType.HASH, 4, 8, 4, flags=BPF_F_RDONLY) as m:
        with pytest.raises(bpfsys.BpfError) as ei:
            m.update(1, 1)
        assert ei.value.errno == errno.EPERM
        assert "EPERM" in str(ei.value) and "BPF_MAP_UPDATE_ELEM" in str(ei.value)


def _child_reads(fd: int, percpu_fd: int, rdonly_created_fd: int, rdonly_fd: int) -> dict:
    """Runs as uid 65534 with no capabilities."""
    out: dict = {"uid": os.getuid()}
    try:
        bpfsys.map_create(MapType.HASH, 4, 4, 1)
        out["create"] = "allowed"
    except bpfsys.BpfError as e:
        out["create"] = e.errno
    m = Map.from_fd(fd)
    out["lookup"] = m.lookup(7)
    out["missing"] = m.lookup(10_000)
    out["keys"] = sorted(m.keys())
    out["batch"] = sorted(m.batch_items())
    out["percpu"] = Map.from_fd(percpu_fd).lookup(0)
    for name, f in (("update_rdonly_created", rdonly_created_fd), ("update_rdonly_fd", rdonly_fd)):
        try:
            Map.from_fd(f).update(1, 1)
            out[name] = "allowed"
        except bpfsys.BpfError as e:
            out[name] = e.errno
    out["rdonly_fd_batch"] = sorted(Map.from_fd(rdonly_fd).batch_items())
    return out


def test_unprivileged_holder_reads() -> None:
    with (
        make(MapType.HASH, 4, 8, 256, name="t_shared") as m,
        make(MapType.PERCPU_ARRAY, 4, 8, 1) as pc,
        make(MapType.HASH, 4, 8, 4, flags=BPF_F_RDONLY) as ro,
    ):
        for i in range(100):
            m.update(i, i * i)
        pc.update(0, [u64(cpu + 1) for cpu in range(NCPU)])
        ro_fd = map_fd_by_id(bpfsys.map_info(m.fileno()).id, BPF_F_RDONLY)
        try:
            out = run_unprivileged(_child_reads, m.fileno(), pc.fileno(), ro.fileno(), ro_fd)
        finally:
            os.close(ro_fd)
    expected = sorted((u32(i), u64(i * i)) for i in range(100))
    assert out["uid"] == 65534
    assert out["create"] == errno.EPERM  # really unprivileged
    assert out["lookup"] == u64(49) and out["missing"] is None
    assert out["keys"] == [k for k, _ in expected]
    assert out["batch"] == expected
    assert out["percpu"] == [u64(cpu + 1) for cpu in range(NCPU)]
    assert out["update_rdonly_created"] == errno.EPERM
    assert out["update_rdonly_fd"] == errno.EPERM
    assert out["rdonly_fd_batch"] == expected


def test_child_errors_are_reported() -> None:
    def fail() -> None:
        bpfsys.map_create(MapType.HASH, 4, 4, 1)

    with pytest.raises(ChildError) as ei:
        run_unprivileged(fail)
    assert ei.value.type_name == "BpfError" and ei.value.errno == errno.EPERM
