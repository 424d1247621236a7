"""RingBuffer.drain over plain buffers laid out like the kernel's mappings:
headers, padding, BUSY and DISCARD bits, wrap-around, corrupt lengths. Offline."""

from __future__ import annotations

import mmap
import os
import select
import struct
import threading
import time

import pytest

from gfxbpf.bpf.ringbuf import BUSY_BIT, DISCARD_BIT, RecordRun, RingBuffer, RingBufferError

PAGE = mmap.PAGESIZE
SIZE = 4096


class FakeRing:
    """Producer side: writes records into a data area that is 'mapped twice'."""

    def __init__(self) -> None:
        self.cons = bytearray(PAGE)
        self.data = bytearray(PAGE + 2 * SIZE)
        self.prod = 0
        self.rb = RingBuffer._from_buffers(self.cons, self.data, SIZE)

    def _write(self, pos: int, raw: bytes) -> None:
        for i, b in enumerate(raw):  # both copies, as the double mapping shows them
            off = (pos + i) % SIZE
            self.data[PAGE + off] = b
            self.data[PAGE + SIZE + off] = b

    def put(self, payload: bytes, flags: int = 0) -> int:
        pos = self.prod
        self._write(pos, struct.pack("<II", len(payload) | flags, 0) + payload)
        self.prod += (len(payload) + 8 + 7) & ~7
        struct.pack_into("<Q", self.data, 0, self.prod)
        return pos

    def set_flags(self, pos: int, flags: int, length: int) -> None:
        self._write(pos, struct.pack("<I", length | flags))

    @property
    def consumer_pos(self) -> int:
        return struct.unpack_from("<Q", self.cons, 0)[0]


def test_records_padding_and_consumer_position() -> None:
    f = FakeRing()
    f.put(b"a")
    f.put(b"")
    f.put(b"12345678")
    f.put(b"x" * 9)
    assert f.rb.drain() == [b"a", b"", b"12345678", b"x" * 9]
    assert f.consumer_pos == f.prod == 16 + 8 + 16 + 24
    assert f.rb.drain() == [] and f.rb.records == 4


def test_busy_stops_and_discard_skips() -> None:
    f = FakeRing()
    f.put(b"one")
    f.put(b"gone", DISCARD_BIT)
    busy = f.put(b"later", BUSY_BIT)
    f.put(b"after")
    assert f.rb.drain() == [b"one"]
    assert f.consumer_pos == busy and f.rb.discarded == 1
    assert f.rb.drain() == []  # still busy
    f.set_flags(busy, 0, 5)  # committed
    assert f.rb.drain() == [b"later", b"after"]
    assert f.consumer_pos == f.prod


def test_poll_waits_for_a_busy_record_instead_of_returning_empty() -> None:
    f = FakeRing()
    busy = f.put(b"late", BUSY_BIT)
    # The kernel's fd is readable while bytes are unread, BUSY or not: a
    # pipe with a byte in it stands for it.
    r, w = os.pipe()
    os.write(w, b"x")
    f.rb._epoll = select.epoll()
    f.rb._epoll.register(r, select.EPOLLIN)
    try:
        assert f.rb.poll(0.05) == []  # the timeout passed, the record still BUSY
        committer = threading.Timer(0.1, f.set_flags, (busy, 0, 4))
        committer.start()
        started = time.monotonic()
        assert f.rb.poll(5.0) == [b"late"]
        assert 0.09 < time.monotonic() - started < 2.0
        committer.join()
    finally:
        f.rb._epoll.close()
        os.close(r)
        os.close(w)


def test_wraparound_reads_contiguously() -> None:
    f = FakeRing()
    got = []
    want = []
    for n in range(600):
        payload = bytes([n % 251]) * (n % 37)
        f.put(payload)
        want.append(payload)
        if n % 50 == 49:
            got += f.rb.drain()
    got += f.rb.drain()
    assert got == want and f.prod > 3 * SIZE


def test_corrupt_length_raises() -> None:
    f = FakeRing()
    f._write(0, struct.pack("<II", SIZE, 0))
    struct.pack_into("<Q", f.data, 0, SIZE + 8)
    with pytest.raises(RingBufferError, match="corrupt"):
        f.rb.drain()


def test_drain_is_bounded_to_one_ring() -> None:
    f = FakeRing()
    # Pretend the producer is far ahead with committed empty records
    # everywhere: one drain takes at most about one ring's worth.
    for pos in range(0, SIZE, 8):
        f._write(pos, struct.pack("<II", 0, 0))
    struct.pack_into("<Q", f.data, 0, 100 * SIZE)
    got = f.rb.drain()
    assert len(got) == SIZE // 8 and f.consumer_pos == SIZE


def test_runs_of_one_record_size_stop_where_the_run_does() -> None:
    # drain() cuts runs of same-sized records in one pass (_RUN_MIN and up):
    # the run must end at a BUSY record, a discarded one or another size.
    f = FakeRing()
    recs = [struct.pack("<QQ", i, i * i) for i in range(20)]
    for r in recs[:12]:
        f.put(r)
    busy = f.put(recs[12])
    f.set_flags(busy, BUSY_BIT, 16)
    for r in recs[13:]:
        f.put(r)
    assert f.rb.drain() == recs[:12]
    assert f.consumer_pos == busy
    f.set_flags(busy, DISCARD_BIT, 16)  # the producer gave that one up
    f.put(b"odd size")
    for r in recs[:10]:
        f.put(r)
    assert f.rb.drain() == recs[13:] + [b"odd size"] + recs[:10]
    assert f.rb.discarded == 1 and f.consumer_pos == f.prod


def test_a_run_that_wraps_around_reads_contiguously() -> None:
    f = FakeRing()
    f.put(b"p" * (SIZE - 8 - 24 * 5))  # leave room for 5 frames before the end
    assert len(f.rb.drain()) == 1
    recs = [bytes([i]) * 16 for i in range(40)]  # 40 frames: wraps after 5
    for r in recs:
        f.put(r)
    assert f.rb.drain() == recs
    assert f.consumer_pos == f.prod


def test_a_run_stops_at_a_record_of_another_size() -> None:
    f = FakeRing()
    recs = [struct.pack("<QQ", i, -i & 0xFFFF) for i in range(12)]
    for r in recs:
        f.put(r)
    f.put(b"\x10\0\0\0\0\0\0\0")  # 8 bytes that read like a 16-byte header
    for r in recs:
        f.put(r)
    assert f.rb.drain() == recs + [b"\x10\0\0\0\0\0\0\0"] + recs
    assert f.consumer_pos == f.prod and f.rb.records == 25


# --- read_runs(): records handed out as runs of one size, decoded in one pass ---

PAIR = struct.Struct("<QQ")


def flat(runs: list[RecordRun]) -> list[bytes]:
    return [p for run in runs for p in run.payloads()]


def test_read_runs_cuts_a_run_that_wraps_across_the_double_mapping() -> None:
    f = FakeRing()
    f.put(b"p" * (SIZE - 8 - 24 * 5))  # leave room for 5 frames before the end
    assert len(f.rb.read_runs()) == 1
    pairs = [(i, i * 3) for i in range(40)]  # 40 frames: the run wraps after 5
    for p in pairs:
        f.put(PAIR.pack(*p))
    runs = f.rb.read_runs()
    assert [(r.length, r.n) for r in runs] == [(16, 40)]
    assert runs[0].unpack(PAIR) == pairs
    assert f.consumer_pos == f.prod and f.rb.records == 41


def test_read_runs_skips_a_discarded_record_and_stops_at_a_busy_one() -> None:
    f = FakeRing()
    for i in range(10):
        f.put(PAIR.pack(i, 0))
    f.put(PAIR.pack(99, 99), DISCARD_BIT)
    for i in range(10, 20):
        f.put(PAIR.pack(i, 0))
    busy = f.put(PAIR.pack(20, 0), BUSY_BIT)
    for i in range(21, 30):
        f.put(PAIR.pack(i, 0))
    runs = f.rb.read_runs()
    assert [x for r in runs for (x, _) in r.unpack(PAIR)] == list(range(20))
    assert all(r.length == 16 for r in runs)
    assert f.consumer_pos == busy and f.rb.discarded == 1
    assert f.rb.read_runs() == []  # the head is still BUSY
    f.set_flags(busy, 0, 16)
    assert [x for r in f.rb.read_runs() for (x, _) in r.unpack(PAIR)] == list(range(20, 30))
    assert f.consumer_pos == f.prod


def test_read_runs_of_mixed_lengths_keep_order_and_payloads() -> None:
    f = FakeRing()
    want = []
    for n in range(96):  # 2304 bytes of frames: fits the ring
        payload = bytes([n]) * (n // 12 * 4)  # runs of 12 records of one size
        f.put(payload)
        want.append(payload)
    want.append(b"tail")
    f.put(b"tail")
    runs = f.rb.read_runs()
    assert flat(runs) == want and sum(r.n for r in runs) == 97
    assert any(r.n > 1 for r in runs)  # same-sized records came as runs
    assert f.rb.drain() == [] and f.consumer_pos == f.prod


def test_unpack_reads_leading_fields_and_refuses_a_layout_too_long() -> None:
    f = FakeRing()
    for i in range(12):
        f.put(struct.pack("<IIQ", i, 7, i << 40) + b"rest")  # 20-byte records
    f.put(b"\x05\0\0\0")  # one 4-byte record: a run of one
    runs = f.rb.read_runs()
    assert [r.unpack(struct.Struct("<I")) for r in runs] == [[(i,) for i in range(12)], [(5,)]]
    assert runs[0].unpack(struct.Struct("<IIQ"))[3] == (3, 7, 3 << 40)
    with pytest.raises(ValueError, match="needs 8 bytes"):
        runs[1].unpack(struct.Struct("<Q"))
