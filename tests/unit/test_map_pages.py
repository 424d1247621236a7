"""Whole-page map decoding: batch decoders, packed ReadMap pages, per-CPU counters.

The client decodes a page's key and value buffers in one pass each
(Btf.batch_decoder); these tests hold that to the one-value decoder, read
packed and per-entry (older broker) ReadMap replies to the same result, and
check that a per-CPU counter is summed over CPUs with zero slots left out.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from elftools.elf.elffile import ELFFile

from gfxbpf.bpf.btf.facade import Btf
from gfxbpf.client.errors import ProtocolError
from gfxbpf.client.handle import ClientMap, fold_counters
from gfxbpf.proto import gfxbpf_pb2 as pb

PROGRAMS = Path(__file__).resolve().parents[2] / "catalog" / "programs"
PERCPU_ARRAY = 6
HASH = 1


def object_btf(name: str) -> Btf:
    data = (PROGRAMS / f"{name}.bpf.o").read_bytes()
    return Btf.parse(ELFFile(io.BytesIO(data)).get_section_by_name(".BTF").data())


# ------------------------------------------------------------------ fold_counters


def test_fold_counters_sums_each_keys_cpus_and_drops_zeros() -> None:
    keys = [0, 1, 2, 3]
    per_cpu = [5, 0, 0, 0, 0, 7, 1, 2]  # two CPUs per key, key by key
    assert fold_counters(keys, per_cpu, 2) == [(0, 5), (2, 7), (3, 3)]


def test_fold_counters_one_cpu_and_nothing_counted() -> None:
    assert fold_counters([10, 11], [0, 4], 1) == [(11, 4)]
    assert fold_counters([1, 2, 3], [0] * 12, 4) == []


# ------------------------------------------------------------------ batch decoders


@pytest.mark.parametrize(
    "program, type_name",
    [
        ("clonecount", "comm_key"),  # struct of one char array
        ("execsnoop", "exec_event"),  # u32s and char arrays
        ("syscount", "__u64"),
        ("syscount", "__u32"),
        ("fence", "latency_key"),  # the histogram key: strings and a slot
        ("fence", "fence_key"),
    ],
)
def test_batch_decoder_matches_the_one_value_decoder(program: str, type_name: str) -> None:
    btf = object_btf(program)
    tid = btf.find(type_name)
    assert tid is not None, type_name
    size = btf.size_of(tid)
    one = btf.decoder(tid)
    for stride in (size, (size + 7) & ~7, size + 8):
        values = [bytes((i * 37 + j) % 256 for j in range(size)) for i in range(5)]
        for i in (1, 3):  # text that ends early, as C strings do
            values[i] = values[i][: size // 2] + b"\0" * (size - size // 2)
        buf = b"".join(v.ljust(stride, b"\xee") for v in values)
        assert btf.batch_decoder(tid, stride)(buf, 5) == [one(v) for v in values]
        assert btf.batch_decoder(tid, stride)(buf, 0) == []


def test_batch_decoder_reads_comms_as_the_one_value_decoder() -> None:
    """The batch path for strings (C loops, no frame per value) cuts at the first
    NUL and replaces bad UTF-8 exactly as the one-value decoder does."""
    btf = object_btf("clonecount")
    tid = btf.find("comm_key")
    assert tid is not None
    one = btf.decoder(tid)
    comms = [
        b"bash",
        b"",
        b"\xe2\x82\xac uro",  # a whole multi-byte character
        b"cut \xe2\x82",  # one cut short by the NUL
        b"\xff\xfe bad",
        b"no nul at all!!!",  # 16 bytes, nothing after
    ]
    values = [c.ljust(16, b"\0") for c in comms]
    values.append(b"abc\0garbage\xffaf!!")  # bytes after the NUL are ignored
    buf = b"".join(values)
    got = btf.batch_decoder(tid, 16)(buf, len(values))
    assert got == [one(v) for v in values]
    assert got[0] == {"comm": "bash"} and got[-1] == {"comm": "abc"}
    assert got[3] == {"comm": "cut \ufffd"} and got[5] == {"comm": "no nul at all!!!"}
    # The char[16] itself (a key that is a bare string): the scalar batch path.
    array = btf.resolve_type(tid).members[0].type
    strings = btf.batch_decoder(array, 16)(buf, len(values))
    assert strings == [one(v)["comm"] for v in values]
    assert btf.batch_decoder(array, 24)(b"".join(v.ljust(24, b"x") for v in values), 7) == strings


def test_batch_decoder_refuses_a_short_buffer() -> None:
    btf = object_btf("syscount")
    u64 = btf.find("__u64")
    with pytest.raises(Exception, match="need 24 bytes, got 16"):
        btf.batch_decoder(u64)(b"\0" * 16, 3)


# ------------------------------------------------------------------ ClientMap pages


class _Transport:
    """Serves a map's pages as a broker would: packed, or one MapEntry each."""

    def __init__(self, pages: list[list[tuple[bytes, list[bytes]]]], packed: bool) -> None:
        self.pages, self.packed, self.requests = pages, packed, []

    def read_map(self, req: pb.ReadMapRequest) -> pb.ReadMapReply:
        self.requests.append(req)
        i = int(req.cursor or b"0")
        nxt = str(i + 1).encode() if i + 1 < len(self.pages) else b""
        page = self.pages[i]
        if not self.packed:
            return pb.ReadMapReply(
                entries=[pb.MapEntry(key=k, per_cpu=v) for k, v in page], next_cursor=nxt
            )
        return pb.ReadMapReply(
            keys=b"".join(k for k, _ in page),
            values=b"".join(x.ljust(8, b"\0") for _, v in page for x in v),
            count=len(page),
            ncpus=len(page[0][1]),
            next_cursor=nxt,
        )


def _syscount_map(transport: Any, show: str = "counter") -> ClientMap:
    btf = object_btf("syscount")
    desc = pb.MapDescription(
        name="counts",
        show=show,
        map_type=PERCPU_ARRAY,
        key_size=4,
        value_size=8,
        max_entries=1024,
        per_cpu=True,
        fd_index=-1,
        btf_key_type_id=btf.find("__u32") or 0,
        btf_value_type_id=btf.find("__u64") or 0,
    )
    att = SimpleNamespace(id=1, broker=SimpleNamespace(direct_reads=False, transport=transport))
    return ClientMap(att, desc, None, btf)  # type: ignore[arg-type]


def _per_cpu_pages() -> list[list[tuple[bytes, list[bytes]]]]:
    def e(nr: int, *cpus: int) -> tuple[bytes, list[bytes]]:
        return nr.to_bytes(4, "little"), [c.to_bytes(8, "little") for c in cpus]

    return [[e(0, 3, 4), e(1, 0, 0), e(2, 0, 9)], [e(3, 0, 0), e(110, 1234, 1)]]


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "entries"])
def test_per_cpu_counter_reads_summed_without_zeros(packed: bool) -> None:
    t = _Transport(_per_cpu_pages(), packed)
    cmap = _syscount_map(t)
    assert cmap.folded and not cmap.per_cpu  # reads like a shared counter
    assert cmap.read() == [(0, 7), (2, 9), (110, 1235)]
    assert all(r.packed for r in t.requests) and len(t.requests) == 2
    raw = cmap.raw_items()  # the undecoded bytes keep every slot and CPU
    assert len(raw) == 5 and raw[4][1] == [(1234).to_bytes(8, "little"), b"\1" + b"\0" * 7]


def test_per_cpu_map_not_shown_as_counter_keeps_its_cpus() -> None:
    cmap = _syscount_map(_Transport(_per_cpu_pages(), True), show="table")
    assert cmap.per_cpu and not cmap.folded
    assert cmap.read()[0] == (0, [3, 4])


def test_packed_page_with_wrong_sizes_is_a_protocol_error() -> None:
    class Bad(_Transport):
        def read_map(self, req: pb.ReadMapRequest) -> pb.ReadMapReply:
            return pb.ReadMapReply(keys=b"\0" * 4, values=b"\0" * 8, count=1, ncpus=2)

    with pytest.raises(ProtocolError, match="8 value bytes for 1 values"):
        _syscount_map(Bad([], True)).read()


def test_hash_map_packed_page_decodes_struct_keys() -> None:
    btf = object_btf("clonecount")
    key_id = btf.find("comm_key") or 0
    names = [b"bash", b"make", b"cc1"]
    keys = b"".join(n.ljust(16, b"\0") for n in names)
    values = struct.pack("<3Q", 5, 6, 0)

    class One:
        def read_map(self, req: pb.ReadMapRequest) -> pb.ReadMapReply:
            return pb.ReadMapReply(keys=keys, values=values, count=3)

    desc = pb.MapDescription(
        name="counts",
        show="counter",
        map_type=HASH,
        key_size=16,
        value_size=8,
        max_entries=16384,
        fd_index=-1,
        btf_key_type_id=key_id,
        btf_value_type_id=btf.find("__u64") or 0,
    )
    att = SimpleNamespace(id=1, broker=SimpleNamespace(direct_reads=False, transport=One()))
    cmap = ClientMap(att, desc, None, btf)  # type: ignore[arg-type]
    # A shared hash map keeps its zero counts: only per-CPU slots are folded.
    assert cmap.read() == [({"comm": "bash"}, 5), ({"comm": "make"}, 6), ({"comm": "cc1"}, 0)]
