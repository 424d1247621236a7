"""StreamEvents: an attachment's ring buffer, consumed by the broker and sent
in batches (gRPC callers, who cannot hold the ring buffer's fd)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from gfxbpf.bpf.maps import Map
from gfxbpf.bpf.ringbuf import RingBuffer
from gfxbpf.broker.errors import BrokerError
from gfxbpf.broker.owners import Attachment
from gfxbpf.proto import gfxbpf_pb2 as pb

# One batch holds at most this many records / bytes.
EVENT_BATCH_RECORDS = 512
EVENT_BATCH_BYTES = 512 * 1024
EVENT_POLL_SECONDS = 0.2


def event_map(att: Attachment, asked: str) -> str:
    """The name of the event map StreamEvents asked for (or the only one)."""
    rings = [m.name for m in att.shared.entry.visible_maps if m.show == "events"]
    name = asked or (rings[0] if len(rings) == 1 else "")
    if name not in rings:
        raise BrokerError(
            pb.ERROR_NOT_FOUND,
            f"program {att.program!r} has no event map {asked!r} "
            f"(event maps: {', '.join(rings) or 'none'})",
        )
    return name


def open_ring(kmap: Map) -> RingBuffer:
    """The ring buffer of kmap on an fd of its own (the caller pins the instance
    while this runs, so kmap's fd is the map's)."""
    try:  # a RingBuffer that fails closes the fd it owns
        return RingBuffer(os.dup(kmap.fileno()), kmap.max_entries, owns_fd=True)
    except (OSError, ValueError) as e:  # ValueError: not a ring buffer's size
        raise BrokerError(pb.ERROR_KERNEL, f"cannot map the ring buffer: {e}") from None


def events(
    att: Attachment, ring: RingBuffer, max_events: int, cancelled: Callable[[], bool]
) -> Iterator[pb.EventBatch]:
    """Batches until max_events, detach (a last batch with end = true) or
    cancelled() (no last batch). ring is closed and att.streaming cleared when
    it ends."""
    seq = 0
    try:
        while True:
            if cancelled() or att.closed:
                if att.closed and not cancelled():
                    yield pb.EventBatch(end=True, lost=ring.discarded)
                return
            records = ring.poll(EVENT_POLL_SECONDS)
            while records:
                batch, seq = _batch(records, seq, max_events)
                batch.lost = ring.discarded
                yield batch
                if batch.end:
                    return
    finally:
        ring.close()
        att.streaming = False


def _batch(records: list[bytes], seq: int, max_events: int) -> tuple[pb.EventBatch, int]:
    """Take one batch's records off the front of records; returns it and the last seq."""
    batch = pb.EventBatch()
    size = 0
    while records and len(batch.events) < EVENT_BATCH_RECORDS and size < EVENT_BATCH_BYTES:
        rec = records.pop(0)
        seq += 1
        size += len(rec)
        batch.events.append(pb.Event(seq=seq, data=rec))
        if max_events and seq >= max_events:
            batch.end = True
            break
    return batch, seq
