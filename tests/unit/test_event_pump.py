"""EventStream's ring path: a thread moves records off the ring as they come,
so a consumer that is slow for a while loses nothing (a profile's first
unwind through a large library), within a bounded backlog. Offline: a
stand-in ring with the kernel's behaviour when full (the record is dropped)."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gfxbpf.bpf.ringbuf import RecordRun
from gfxbpf.client import events
from gfxbpf.proto import gfxbpf_pb2 as pb


class Ring:
    """A ring of `slots` records: a record written while it is full is dropped."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.held: collections.deque[bytes] = collections.deque()
        self.dropped = 0
        self.lock = threading.Lock()
        self.closed = False
        self.asleep = False

    def write(self, rec: bytes) -> None:
        with self.lock:
            if len(self.held) >= self.slots:
                self.dropped += 1
            else:
                self.held.append(rec)

    def drain(self) -> list[bytes]:
        with self.lock:
            out = list(self.held)
            self.held.clear()
        return out

    def poll(self, timeout: float | None = None) -> list[bytes]:
        deadline = time.monotonic() + (timeout or 0.0)
        if self.asleep:  # a wake-up not yet come: nothing until the timeout
            time.sleep(timeout or 0.0)
            return []
        while not (out := self.drain()) and time.monotonic() < deadline:
            time.sleep(0.001)
        return out

    # What the pump calls: RingBuffer's runs (here each record a run of one).
    def read_runs(self) -> list[RecordRun]:
        return [RecordRun(len(r), 1, r, len(r), 0) for r in self.drain()]

    def poll_runs(self, timeout: float | None = None) -> list[RecordRun]:
        return [RecordRun(len(r), 1, r, len(r), 0) for r in self.poll(timeout)]

    def close(self) -> None:
        self.closed = True


class RingMap:
    name = "events"
    desc = pb.MapDescription(name="events", max_entries=4096)
    btf = None
    fd = 3  # a ring is passed: the fd path


@pytest.fixture
def ring(monkeypatch: pytest.MonkeyPatch) -> Iterator[Ring]:
    r = Ring(slots=32)
    monkeypatch.setattr(events, "RingBuffer", lambda fd, size: r)
    yield r


def _produce(ring: Ring, n: int, every_s: float) -> threading.Thread:
    def run() -> None:
        for i in range(n):
            ring.write(i.to_bytes(4, "little") * 64)
            time.sleep(every_s)

    t = threading.Thread(target=run)
    t.start()
    return t


def _numbers(records: list[bytes]) -> list[int]:
    return [int.from_bytes(r[:4], "little") for r in records]


def test_a_slow_consumer_loses_nothing(ring: Ring) -> None:
    stream = events.EventStream(None, 1, RingMap())  # type: ignore[arg-type]
    producer = _produce(ring, 400, 0.001)  # ~0.5 s at 1 ms a record: 12x the ring
    got = stream.poll_raw(1.0)
    time.sleep(0.6)  # busy elsewhere, e.g. parsing a large library's call-frame tables
    producer.join()
    stream.flush()
    while batch := stream.poll_raw(0.0):
        got += batch
    stream.close()
    assert ring.dropped == 0
    assert _numbers(got) == list(range(400))  # all of them, in order
    assert ring.closed


def test_flush_hands_over_what_the_ring_holds(ring: Ring) -> None:
    ring.asleep = True  # the thread's polls see nothing: only flush() drains
    stream = events.EventStream(None, 1, RingMap())  # type: ignore[arg-type]
    queued = stream._put

    def slow_put(records: list[bytes]) -> None:  # flush() must wait for the queueing too
        time.sleep(0.2 if records else 0.0)
        queued(records)

    stream._put = slow_put  # type: ignore[method-assign]
    for i in range(5):
        ring.write(i.to_bytes(4, "little"))
    assert stream.poll_raw(0.05) == []
    stream.flush()
    assert _numbers(stream.poll_raw(0.0)) == [0, 1, 2, 3, 4]
    stream.close()


def test_flush_is_prompt_while_records_pour_in(ring: Ring) -> None:
    """The ring's thread is its only reader: flush() waits for at most one of
    its polls, however busy the ring (a shared lock starved it for seconds)."""
    stream = events.EventStream(None, 1, RingMap())  # type: ignore[arg-type]
    producer = _produce(ring, 2000, 0.0)
    slowest = 0.0
    for _ in range(20):
        t = time.monotonic()
        stream.flush()
        slowest = max(slowest, time.monotonic() - t)
    producer.join()
    stream.close()
    assert slowest < 0.5, slowest


def test_the_backlog_is_bounded(ring: Ring, monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer that never catches up: the thread stops reading at the bound,
    and the ring drops (and the kernel's count says so) instead of memory growing."""
    monkeypatch.setattr(events, "MAX_BACKLOG_BYTES", 10 * 256)
    stream = events.EventStream(None, 1, RingMap())  # type: ignore[arg-type]
    _produce(ring, 200, 0.0005).join()
    time.sleep(0.1)
    held: Any = stream._backlog
    assert 10 * 256 < held <= 10 * 256 + ring.slots * 256
    assert ring.dropped > 0
    got = []
    stream.flush()
    while batch := stream.poll_raw(0.0):
        got += batch
    stream.close()
    assert len(got) + ring.dropped == 200
