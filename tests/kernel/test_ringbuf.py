"""RingBuffer against the real kernel, fed by small hand-assembled programs.

Producers: a socket filter run with BPF_PROG_TEST_RUN (deterministic: run n
times, n records, numbered by a counter map) and a raw tracepoint on
sys_enter that records one process's getppid() calls.
"""

from __future__ import annotations

import errno
import os
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.consts import BPF_F_RDONLY, MapType
from gfxbpf.bpf.link import bpflink
from gfxbpf.bpf.ringbuf import RingBuffer, RingBufferError
from tests.kernel.sysmaps_util import (
    PROG_RAW_TRACEPOINT,
    PROG_SOCKET_FILTER,
    map_fd_by_id,
    prog_reserve_discard_odd,
    prog_seq_output,
    prog_sys_enter,
    prog_test_run,
    run_unprivileged,
    seq_record,
)

NR_GETPPID = 110  # x86-64


class Producer:
    """A ring buffer plus a program that writes record n on its n-th run."""

    def __init__(self, size: int, discard_odd: bool = False) -> None:
        self.ring_fd = bpfsys.map_create(MapType.RINGBUF, 0, 0, size, name="t_ring")
        # slot 0: records numbered so far; slot 1: records the kernel refused
        self.counter_fd = bpfsys.map_create(MapType.ARRAY, 4, 8, 2, name="t_count")
        build = prog_reserve_discard_odd if discard_odd else prog_seq_output
        self.prog_fd = bpfsys.prog_load(
            PROG_SOCKET_FILTER, build(self.counter_fd, self.ring_fd), "GPL", name="t_producer"
        )

    def run(self, n: int) -> None:
        prog_test_run(self.prog_fd, repeat=n)

    def refused(self) -> int:
        """Records the kernel did not accept (bpf_ringbuf_output failed)."""
        value = bpfsys.map_lookup_elem(self.counter_fd, struct.pack("<I", 1), 8)
        assert value is not None
        return struct.unpack("<Q", value)[0]

    def close(self) -> None:
        for fd in (self.prog_fd, self.counter_fd, self.ring_fd):
            os.close(fd)


@pytest.fixture
def small() -> Iterator[Producer]:
    p = Producer(4096)
    yield p
    p.close()


def test_exact_records_in_order() -> None:
    p = Producer(1 << 16)
    try:
        with RingBuffer(p.ring_fd) as rb:
            assert rb.max_entries == 1 << 16
            assert rb.drain() == [] and rb.poll(0) == []
            p.run(500)
            assert rb.pending() > 0
            assert rb.drain() == [seq_record(n) for n in range(1, 501)]
            assert rb.pending() == 0 and rb.records == 500 and rb.discarded == 0
            t0 = time.monotonic()
            assert rb.poll(0.05) == []  # waits for the timeout, then nothing
            assert time.monotonic() - t0 >= 0.04
            p.run(3)
            assert rb.poll(5.0) == [seq_record(n) for n in (501, 502, 503)]
    finally:
        p.close()


def test_wraparound_with_consumption_in_between(small: Producer) -> None:
    with RingBuffer(small.ring_fd, 4096) as rb:
        got: list[bytes] = []
        # Rounds of 50 records (16..40 bytes each) go round a 4 KiB ring
        # many times; record sizes do not divide 4096, so some records
        # straddle the end and are read through the second mapping.
        for _ in range(30):
            small.run(50)
            got += rb.drain()
        assert got == [seq_record(n) for n in range(1, 1501)]
        assert _straddling(1, 1500, 4096) > 0  # the double mapping was exercised
        # More than fits: the producer drops what does not fit; what arrives
        # is an unbroken prefix, and after consuming there is room again.
        small.run(400)
        first = rb.drain()
        assert 50 < len(first) < 400
        assert first == [seq_record(n) for n in range(1501, 1501 + len(first))]
        assert small.refused() == 400 - len(first)  # the refusal counter counts
        small.run(10)
        assert rb.drain() == [seq_record(n) for n in range(1901, 1911)]


def _straddling(first: int, last: int, size: int) -> int:
    """How many of records first..last cross the end of a ring of size bytes."""
    pos = count = 0
    for n in range(first, last + 1):
        rec = (len(seq_record(n)) + 8 + 7) & ~7
        count += pos % size + rec > size
        pos += rec
    return count


def test_discarded_records_are_skipped() -> None:
    p = Producer(4096, discard_odd=True)
    try:
        with RingBuffer(p.ring_fd) as rb:
            got = []
            for _ in range(5):  # 5 x 100 reservations of 16 bytes: wraps the ring
                p.run(100)
                got += rb.drain()
            assert got == [struct.pack("<Q", n) for n in range(2, 501, 2)]
            assert rb.discarded == 250 and rb.records == 250
    finally:
        p.close()


def test_read_runs_hand_out_what_drain_does(small: Producer) -> None:
    # The kernel's own layout: sizes that do not divide the ring, records
    # straddling its end, read as runs and cut back into payloads.
    with RingBuffer(small.ring_fd, 4096) as rb:
        got: list[bytes] = []
        for _ in range(30):
            small.run(50)
            got += [p for run in rb.read_runs() for p in run.payloads()]
        assert got == [seq_record(n) for n in range(1, 1501)] and rb.records == 1500


def test_read_runs_skip_discarded_records() -> None:
    p = Producer(4096, discard_odd=True)
    try:
        with RingBuffer(p.ring_fd) as rb:
            got = []
            for _ in range(5):  # wraps the ring, a discarded record between each two
                p.run(100)
                got += [n for run in rb.read_runs() for (n,) in run.unpack(struct.Struct("<Q"))]
            assert got == list(range(2, 501, 2))
            assert rb.discarded == 250 and rb.records == 250
    finally:
        p.close()


def test_raw_tracepoint_counts_own_syscalls() -> None:
    ring_fd = bpfsys.map_create(MapType.RINGBUF, 0, 0, 1 << 16, name="t_sysring")
    pid = os.getpid()
    prog_fd = bpfsys.prog_load(
        PROG_RAW_TRACEPOINT, prog_sys_enter(ring_fd, pid, NR_GETPPID), "GPL", name="t_sys_enter"
    )
    try:
        with RingBuffer(ring_fd, owns_fd=True) as rb:
            link_fd = bpflink.raw_tracepoint_open("sys_enter", prog_fd)
            try:
                for _ in range(37):
                    os.getppid()
            finally:
                os.close(link_fd)
            os.getppid()  # detached: not counted
            assert rb.poll(1.0) == [struct.pack("<II", pid, NR_GETPPID)] * 37
        with pytest.raises(OSError):  # owns_fd: close() closed the map fd
            os.fstat(ring_fd)
    finally:
        os.close(prog_fd)


def _child_consume(fd: int, last: bytes) -> dict:
    """As uid 65534: consume a ring buffer it holds only the fd of, until
    the record `last` arrives (or 20 s pass)."""
    rb = RingBuffer(fd)  # max_entries via map_info: allowed without capabilities
    first = rb.drain()
    later: list[bytes] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (later and later[-1] == last):
        later += rb.poll(deadline - time.monotonic())
    rb.close()
    return {"uid": os.getuid(), "first": first, "later": later, "records": rb.records}


def _unmatched(records: list[bytes], numbers: range) -> tuple[int, int]:
    """Match records in order against seq_record(n) for n in numbers:
    (numbers with no record, records left over that match nothing)."""
    i = missing = 0
    for n in numbers:
        if i < len(records) and records[i] == seq_record(n):
            i += 1
        else:
            missing += 1
    return missing, len(records) - i


def test_unprivileged_child_consumes(small: Producer) -> None:
    small.run(100)  # waiting before the child starts
    # 400 more, produced while the child waits in epoll. 4 KiB holds ~120
    # records, so the producer waits for the child to make room (watching
    # the positions only; the parent never consumes).
    watcher = RingBuffer(small.ring_fd)

    def produce() -> None:
        time.sleep(0.3)
        for _ in range(40):
            deadline = time.monotonic() + 10
            while watcher.pending() > 2048 and time.monotonic() < deadline:
                time.sleep(0.002)
            small.run(10)

    t = threading.Thread(target=produce)
    t.start()
    try:
        out = run_unprivileged(_child_consume, small.ring_fd, seq_record(500))
    finally:
        t.join()
        watcher.close()
    assert out["uid"] == 65534
    assert out["first"] == [seq_record(n) for n in range(1, 101)]
    # Every record the kernel accepted arrives, in order and intact. The
    # kernel may refuse one (a full ring if the child was starved for long,
    # or a failed ring lock on 6.15+); it counts those, so a reader that lost
    # a record cannot hide behind them.
    refused = small.refused()
    missing, stray = _unmatched(out["later"], range(101, 501))
    assert stray == 0, "records out of order, repeated or corrupt"
    assert missing == refused, f"{missing - refused} records the kernel accepted were lost"
    assert refused <= 5, f"the kernel refused {refused} of 400 records"
    assert out["records"] == 500 - refused


def test_readonly_fd_cannot_be_consumed(small: Producer) -> None:
    # Ring buffers refuse BPF_F_RDONLY at creation; a read-only fd comes from
    # reopening the map by id.
    with pytest.raises(bpfsys.BpfError):
        bpfsys.map_create(MapType.RINGBUF, 0, 0, 4096, flags=BPF_F_RDONLY)
    ro_fd = map_fd_by_id(bpfsys.map_info(small.ring_fd).id, BPF_F_RDONLY)
    try:
        with pytest.raises(RingBufferError, match="read-only") as ei:
            RingBuffer(ro_fd)
        assert ei.value.errno in (errno.EACCES, errno.EPERM)
        os.fstat(ro_fd)  # a failed RingBuffer leaves a borrowed fd open
    finally:
        os.close(ro_fd)


def test_bad_arguments() -> None:
    hfd = bpfsys.map_create(MapType.HASH, 4, 4, 1)
    try:
        with pytest.raises(ValueError, match="not a ring buffer"):
            RingBuffer(hfd)
    finally:
        os.close(hfd)
    p = Producer(4096)
    try:
        with pytest.raises(ValueError, match="power of two"):
            RingBuffer(p.ring_fd, 6000)
        rb = RingBuffer(p.ring_fd)
        assert rb.fileno() == p.ring_fd
        rb.close()
        rb.close()  # idempotent
        os.fstat(p.ring_fd)  # not owned: still open
        with pytest.raises(ValueError, match="closed"):
            rb.poll(0)
    finally:
        p.close()


def test_iteration_yields_forever() -> None:
    p = Producer(1 << 14)
    try:
        with RingBuffer(p.ring_fd) as rb:
            p.run(5)
            it = iter(rb)
            assert [next(it) for _ in range(5)] == [seq_record(n) for n in range(1, 6)]
            threading.Timer(0.1, p.run, (1,)).start()
            assert next(it) == seq_record(6)  # waited in epoll for it
    finally:
        p.close()


def test_drain_throughput() -> None:
    p = Producer(16 << 20)
    n = 400_000
    try:
        with RingBuffer(p.ring_fd) as rb:
            p.run(n)
            t0 = time.perf_counter()
            got = rb.drain()
            dt = time.perf_counter() - t0
            assert len(got) == n
            assert got[0] == seq_record(1) and got[-1] == seq_record(n)
            rate = n / dt
            print(f"drained {n} records in {dt:.3f}s: {rate / 1e6:.2f} M records/s")
            assert rate > 300_000, f"drain too slow: {rate:.0f} records/s"
    finally:
        p.close()
