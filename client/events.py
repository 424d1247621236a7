"""A stream of one ring buffer's events, as the client sees them.

Over the Unix socket the broker passes the ring buffer's own fd, which the
client maps and polls (gfxbpf.bpf.ringbuf); otherwise the transport streams
the records (gRPC StreamEvents, which the broker consumes for us). Records
are decoded with the object's BTF, by the map's event type.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol

from gfxbpf.bpf.btf.facade import Btf, BtfError
from gfxbpf.bpf.ringbuf import RecordRun, RingBuffer, RingBufferError
from gfxbpf.client.errors import ClientError
from gfxbpf.client.transport import EventCall, Transport
from gfxbpf.proto import gfxbpf_pb2 as pb


class RingMap(Protocol):
    """What a stream needs of a map: handle.ClientMap is one (no import back to it)."""

    name: str
    desc: pb.MapDescription
    btf: Btf | None

    @property
    def fd(self) -> int | None: ...


# Records read off a ring and not yet taken by poll(): beyond this the pump
# stops reading, the ring fills and the kernel counts what it drops.
MAX_BACKLOG_BYTES = 128 << 20
_PUMP_WAIT_S = 0.02  # the pump's longest wait on an empty ring (flush() waits for it)


class EventStream:
    """Decoded records of one ring buffer: poll(timeout) -> list; close() ends it.

    Either way a thread moves the records into a queue as they come, so a
    consumer that is slow for a while (a profile's first unwind through a
    large library) loses nothing while its backlog fits MAX_BACKLOG_BYTES.
    fd path: the thread polls a RingBuffer over the passed fd; flush() hands
    over what the ring holds now. Otherwise the thread consumes the
    transport's StreamEvents (gRPC), so poll() can time out and Ctrl-C is
    never stuck inside the gRPC library.
    """

    def __init__(
        self, transport: Transport, attachment_id: int, cmap: RingMap, max_events: int = 0
    ) -> None:
        self.map = cmap
        self.max_events = max_events
        self.received = 0
        self.lost = 0  # records the broker reported dropped (gRPC); unknowable on the fd path
        self.ended = False
        self._ring: RingBuffer | None = None
        self._call: EventCall | None = None
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._decode = self._event_decoder()
        self._stop = threading.Event()
        # flush(): events the ring's thread sets once it queued what the ring held
        self._flushes: queue.SimpleQueue[threading.Event] = queue.SimpleQueue()
        self._backlog = 0  # bytes queued from the ring (fd path)
        self._backlog_lock = threading.Lock()
        if cmap.fd is not None:
            try:
                self._ring = RingBuffer(cmap.fd, cmap.desc.max_entries or None)
            except (RingBufferError, OSError, ValueError) as e:
                raise ClientError(f"cannot map the ring buffer {cmap.name!r}: {e}") from e
            self._thread = threading.Thread(
                target=self._pump_ring, name=f"gfxbpf-ring-{cmap.name}", daemon=True
            )
            self._thread.start()
            return
        call = transport.stream_events(
            pb.StreamEventsRequest(
                attachment_id=attachment_id, map=cmap.name, max_events=max_events
            )
        )
        self._call = call
        self._thread = threading.Thread(
            target=self._pump, args=(call,), name=f"gfxbpf-events-{cmap.name}", daemon=True
        )
        self._thread.start()

    def _event_decoder(self) -> Any:
        btf, d = self.map.btf, self.map.desc
        if btf is None:
            return None
        type_id = d.btf_event_type_id
        if not type_id and d.event_type:
            type_id = btf.find(d.event_type) or 0
        if not type_id:
            return None
        try:
            return btf.decoder(type_id)
        except BtfError:
            return None

    def decode(self, record: bytes) -> Any:
        if self._decode is not None:
            try:
                return self._decode(record)
            except BtfError:
                pass
        return {"data": record.hex()}

    def _pump(self, call: EventCall) -> None:
        try:
            for batch in call:
                self._queue.put(batch)
                if batch.end:
                    break
        except Exception as e:  # noqa: BLE001 - handed to the consumer thread
            self._queue.put(e)
        self._queue.put(None)  # end of stream

    def _pump_ring(self) -> None:
        """The ring's only reader (a lock shared with flush() starved flush on a
        busy host): polls it, and drains it at once when flush() asks."""
        ring = self._ring
        assert ring is not None
        failed = False
        while not failed and not self._stop.is_set():
            flushes = []
            while not self._flushes.empty():
                flushes.append(self._flushes.get())
            runs: list[RecordRun] = []
            try:
                if flushes:
                    runs = ring.read_runs()
                elif self._backlog > MAX_BACKLOG_BYTES:  # far behind: let the ring fill
                    self._stop.wait(_PUMP_WAIT_S)
                else:
                    runs = ring.poll_runs(_PUMP_WAIT_S)
            except InterruptedError:
                pass
            except Exception as e:  # noqa: BLE001 - handed to the consumer thread
                self._queue.put(e)
                failed = True
            self._put(runs)
            for done in flushes:  # only once their records are in the queue
                done.set()

    def _put(self, runs: list[RecordRun]) -> None:
        """Queue what the ring gave as it came: runs of records, copied out in
        one piece each, cut into records by the consumer (poll_raw)."""
        if runs:
            with self._backlog_lock:
                self._backlog += sum(len(run.data) for run in runs)
            self._queue.put(runs)

    def pace(self, seconds: float) -> None:
        """Records are taken about every `seconds` (fd path): the ring's reader
        looks that often while they flow, not every millisecond."""
        if self._ring is not None:
            self._ring.min_tick = min(seconds, _PUMP_WAIT_S)

    def flush(self, timeout: float = 2.0) -> None:
        """Have what the ring holds now queued, so the next poll() returns it
        (fd path; over gRPC the broker sends records as it reads them)."""
        if self._ring is None or self._thread is None or not self._thread.is_alive():
            return
        done = threading.Event()
        self._flushes.put(done)
        done.wait(timeout)

    def poll(self, timeout: float | None = None) -> list[Any]:
        """Records that arrived, waiting up to timeout seconds (None: until some arrive)."""
        return [self.decode(r) for r in self.poll_raw(timeout)]

    def poll_raw(self, timeout: float | None = None) -> list[bytes]:
        if self.ended:
            return []
        out: list[bytes] = []
        deadline = None if timeout is None else time.monotonic() + timeout
        block = True
        while True:
            try:
                if not block:
                    item = self._queue.get_nowait()
                elif deadline is None:
                    item = self._queue.get()
                else:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            block = False  # after the first item, take only what is already there
            if item is None:
                self.ended = True
                break
            if isinstance(item, Exception):
                self.ended = True
                raise item
            if isinstance(item, list):  # runs off the ring (fd path)
                with self._backlog_lock:
                    self._backlog -= sum(len(run.data) for run in item)
                for run in item:
                    out += run.payloads()
                continue
            self.lost = max(self.lost, item.lost)
            out.extend(e.data for e in item.events)
            if item.end:
                self.ended = True
                break
        return self._count(out)

    def _count(self, records: list[bytes]) -> list[bytes]:
        if self.max_events and self.received + len(records) >= self.max_events:
            records = records[: self.max_events - self.received]
            self.ended = True
        self.received += len(records)
        return records

    def __iter__(self) -> Iterator[Any]:
        while not self.ended:
            yield from self.poll(None)

    def close(self) -> None:
        self.ended = True
        self._stop.set()
        if self._ring is not None:
            if self._thread is not None and self._thread is not threading.current_thread():
                self._thread.join()
            self._ring.close()
            self._ring = None
        if self._call is not None:
            self._call.cancel()
            self._call = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["EventStream"]
