"""btf_index.LazyTable: the same types and lookups as a full parse, from the raw bytes.

Compared type by type with btf_parse over real objects' BTF; names found by
searching the bytes (flavours, names inside longer strings, many of them);
the decoded-type cache stays bounded; corrupt blobs are clear errors.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

import pytest

from gfxbpf.bpf.btf import index as btf_index
from gfxbpf.bpf.btf.facade import Btf
from gfxbpf.bpf.btf.index import LazyTable
from gfxbpf.bpf.btf.kinds import (
    INT_SIGNED,
    KIND_INT,
    KIND_STRUCT,
    KIND_TYPEDEF,
    BtfError,
    Int,
    Struct,
    Typedef,
    Void,
)
from gfxbpf.bpf.btf.parse import parse_blob
from gfxbpf.bpf.core.relo import essential_name
from gfxbpf.bpf.kernel import vmlinux as kernel_btf
from gfxbpf.bpf.object import ObjectSpec

DATA = Path(__file__).resolve().parents[1] / "data"


def _blobs() -> list[bytes]:
    objs = sorted((DATA / "core").glob("*.bpf.o")) or sorted(DATA.rglob("*.bpf.o"))
    out = [ObjectSpec.from_file(str(p)).btf_bytes for p in objs[:6]]
    return [b for b in out if b]


def test_every_type_decodes_as_the_full_parse_does() -> None:
    blobs = _blobs()
    assert blobs
    for blob in blobs:
        lazy, full = LazyTable(blob), parse_blob(blob).types
        assert len(lazy.types) == len(full)
        assert list(lazy.types) == full
        for t in full[1:]:
            if t.name:
                assert t.id in lazy.find_all(t.name, t.kind)


def _table(names: list[str]) -> bytes:
    """A blob: int, then one STRUCT per name (size 4, no members)."""
    strings = b"\0int\0" + b"".join(n.encode() + b"\0" for n in names)
    types = [Void(0, 0, "", 0, False), Int(1, KIND_INT, "int", 1, False, 4, INT_SIGNED, 0, 32)]
    off = 5
    for i, n in enumerate(names):
        types.append(Struct(2 + i, KIND_STRUCT, n, off, False, 4, []))
        off += len(n) + 1
    return Btf(types, strings).to_bytes()


def test_flavours_and_names_inside_longer_strings() -> None:
    t = LazyTable(_table(["task", "task___old", "task___a___b", "my_task", "a_task"]))
    assert t.ids_named("task") == [2]
    assert t.ids_named("task", essential_name) == [2, 3]  # task___a___b is task___a
    assert t.ids_named("task___a", essential_name) == [4]
    assert t.find("task", KIND_STRUCT) == 2 and t.find("task", KIND_TYPEDEF) is None
    assert t.ids_named("nothing") == [] and t.ids_named("") == []


def test_a_name_that_only_exists_inside_longer_strings() -> None:
    # "ask" ends "task" and "a_task" but names no type: a direct search, then
    # the sorted-offsets filter once there are more such strings than _DIRECT_INSIDE.
    few = LazyTable(_table(["task", "a_task"]))
    assert few.ids_named("ask") == []
    many = LazyTable(_table([f"x{i}_ask" for i in range(btf_index._DIRECT_INSIDE + 4)]))
    assert many.ids_named("ask") == [] and many._sorted_names is not None
    assert many.ids_named("x3_ask") == [5]


def test_lookups_are_kept_bounded_and_not_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(btf_index, "_NAMED_CACHE", 4)
    t = LazyTable(_table([f"s{i}" for i in range(10)]))
    for i in range(10):
        assert t.ids_named(f"s{i}") == [2 + i]
    assert len(t._named) <= 4
    got = t.ids_named("s9")
    got.append(99)  # a caller's list: the kept answer stays as it was
    assert t.ids_named("s9") == [11]
    assert t.ids_named("s9", essential_name) == [11]


def test_a_name_offset_inside_another_string_is_found() -> None:
    """A type whose name_off points into the middle of a string (legal BTF)."""
    strings = b"\0int\0my_task\0"
    types = [
        Void(0, 0, "", 0, False),
        Int(1, KIND_INT, "int", 1, False, 4, INT_SIGNED, 0, 32),
        Typedef(2, KIND_TYPEDEF, "task", 8, False, 1),  # "task" inside "my_task"
    ]
    t = LazyTable(Btf(types, strings).to_bytes())
    assert t.types[2].name == "task" and t.ids_named("task") == [2]


def test_decoded_types_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(btf_index, "DECODED_CACHE", 3)
    t = LazyTable(_table([f"s{i}" for i in range(10)]))
    for i in range(1, 12):
        assert t.types[i].id == i
    assert len(t.types._cache) == 3


def test_corrupt_blobs_are_clear_errors() -> None:
    blob = bytearray(_table(["a"]))
    hdr_len = struct.unpack_from("<I", blob, 4)[0]
    struct.pack_into("<I", blob, hdr_len + 12 + 4 + 4, 30 << 24)  # type 2's info: kind 30
    with pytest.raises(BtfError, match="unknown kind 30"):
        LazyTable(bytes(blob))
    short = bytearray(_table(["a"]))
    struct.pack_into("<I", short, 12, struct.unpack_from("<I", short, 12)[0] + 8)  # type_len
    struct.pack_into("<I", short, 16, struct.unpack_from("<I", short, 16)[0] + 8)  # str_off
    short[hdr_len + 28 : hdr_len + 28] = bytes(8)  # 8 stray bytes after the last type
    with pytest.raises(BtfError, match="type id 3 .*truncated header"):
        LazyTable(bytes(short))
    with pytest.raises(BtfError, match="out of range"):
        LazyTable(_table(["a"])).types[7]
    with pytest.raises(BtfError, match="read-only"):
        LazyTable(_table(["a"])).add_string("x")


VMLINUX = Path("/sys/kernel/btf/vmlinux")


@pytest.mark.skipif(not VMLINUX.exists(), reason="no kernel BTF on this machine")
def test_this_kernels_vmlinux_matches_the_full_parse() -> None:
    """A sample of vmlinux's ~127,000 types, and name lookups, against a full parse."""
    blob = VMLINUX.read_bytes()
    lazy, full = LazyTable(blob), parse_blob(blob).types
    assert len(lazy.types) == len(full)
    for t in full[::97]:
        assert lazy.types[t.id] == t
    for name in ("task_struct", "int", "pid", "mm_struct", "btf_trace_sched_process_exec"):
        want = [t.id for t in full if t.name == name]
        assert lazy.ids_named(name) == want, name


def test_a_mapped_blob_reads_as_its_bytes_do(tmp_path: Path) -> None:
    blob = _table(["task", "task___old", "mm"])
    path = tmp_path / "btf"
    path.write_bytes(blob)
    mapped = kernel_btf._read(str(path), mapped=True)
    assert isinstance(mapped, mmap.mmap) and mapped[:] == blob
    assert kernel_btf._read(str(path)) == blob  # not asked to map: read
    lazy, plain = LazyTable(mapped), LazyTable(blob)
    assert list(lazy.types) == list(plain.types)
    assert lazy.ids_named("task", essential_name) == plain.ids_named("task", essential_name)
    assert lazy.find("mm", KIND_STRUCT) == plain.find("mm", KIND_STRUCT) == 4


@pytest.mark.skipif(not VMLINUX.exists(), reason="no kernel BTF on this machine")
def test_vmlinux_is_mapped_where_the_kernel_allows_it() -> None:
    """Kernels 6.16+ let /sys/kernel/btf/vmlinux be mapped (not copied); older
    ones refuse and it is read. Either way the table holds the same bytes."""
    table = kernel_btf.kernel_target().vmlinux.table
    try:
        with open(VMLINUX, "rb") as f:
            mmap.mmap(f.fileno(), 0, mmap.MAP_PRIVATE, mmap.PROT_READ).close()
        can_map = True
    except OSError:
        can_map = False
    assert isinstance(table.data, mmap.mmap) == can_map
    assert table.data[:] == VMLINUX.read_bytes()
