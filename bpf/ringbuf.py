"""RingBuffer: the user-space consumer of a BPF_MAP_TYPE_RINGBUF map.

Layout (kernel/bpf/ringbuf.c; docs/BPF-ABI.md): page 0 holds consumer_pos and is the only
writable mapping; page 1 holds producer_pos, and the data area follows,
mapped twice so a record that wraps reads contiguously. Each record starts
with an 8-byte header {u32 len | BUSY | DISCARD; u32 pg_off}.
"""

from __future__ import annotations

import errno
import mmap
import os
import select
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.consts import MapType
from gfxbpf.bpf.errors import KernelError

BUSY_BIT = 1 << 31
DISCARD_BIT = 1 << 30
HDR_SIZE = 8
LEN_MASK = DISCARD_BIT - 1
# poll()'s naps while the head record is BUSY, seconds: a BPF program
# commits within microseconds, so start short and back off.
_BUSY_NAP_MIN = 20e-6
_BUSY_NAP_MAX = 2e-3
# Programs may commit without waking the reader (BPF_RB_NO_WAKEUP: the
# wake-up costs the program more than its work; catalog/programs/gfxbpf_ring.h),
# so poll() looks again at least this often, seconds, while it waits; right
# after records came it looks sooner (_TICK_MIN, doubling while none come),
# so a stream that flows is read in small batches, an idle one costs little.
WAKE_TICK = 0.05
_TICK_MIN = 1e-3

# Native formats: struct copies these with one aligned load/store (memcpy of
# 4/8 bytes), so positions and headers are never torn. x86-64 only.
_U64 = struct.Struct("Q")
_U32 = struct.Struct("I")


# drain(): records of one size in a row, from _RUN_MIN on, are cut in one
# pass, _RUN_MAX at a time (the pass reads that many headers).
_RUN_MIN = 8
_RUN_MAX = 4096
# ... and after a record that starts no run, the next _RUN_SKIP are read one
# by one without looking for one (streams of mixed sizes pay almost nothing).
_RUN_SKIP = 32


def _same(data: Any, off: int, length: int, step: int) -> bool:
    """Whether the 2nd and the _RUN_MIN-th record from off look as long as the first."""
    return (
        _U32.unpack_from(data, off + step)[0] == length
        and _U32.unpack_from(data, off + (_RUN_MIN - 1) * step)[0] == length
    )


class _Layouts:
    """struct.Structs that cut one value out of each frame of a run: the frame's
    first `skip` bytes, then `fmt`'s fields, then padding to `stride` bytes."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int, int], struct.Struct] = {}

    def get(self, fmt: str, skip: int, stride: int) -> struct.Struct:
        st = self._cache.get((fmt, skip, stride))
        if st is None:
            if len(self._cache) > 64:  # many record sizes: keep it bounded
                self._cache.clear()
            order, body = (fmt[0], fmt[1:]) if fmt[:1] in ("@", "=", "<", ">", "!") else ("@", fmt)
            pad = stride - struct.calcsize(f"{order}{skip}x{body}")
            if pad < 0:
                raise ValueError(f"layout {fmt!r} does not fit in {stride - skip} bytes")
            st = struct.Struct(f"{order}{skip}x{body}{pad}x")
            self._cache[(fmt, skip, stride)] = st
        return st


_LAYOUTS = _Layouts()


class RecordRun(NamedTuple):
    """`n` committed records of `length` bytes each, in ring order, copied
    out in one piece: record i's payload is data[i * stride + skip:][:length].

    RingBuffer.read_runs() hands these out: a run of one record size keeps its
    frames (headers and padding) as the ring held them, so one C pass of
    struct cuts or decodes all of them (unpack, payloads); a record that
    starts no run is a run of one (stride = length, skip = 0).
    """

    length: int
    n: int  # records in the run
    data: bytes
    stride: int
    skip: int

    def payloads(self) -> list[bytes]:
        """Each record's payload as a bytes object."""
        if self.n == 1:
            return [self.data[self.skip : self.skip + self.length]]
        cut = _LAYOUTS.get(f"{self.length}s", self.skip, self.stride)
        return [p for (p,) in cut.iter_unpack(self.data)]

    def unpack(self, layout: struct.Struct) -> list[tuple[Any, ...]]:
        """Each record's leading fields, decoded by layout (its byte order and
        fields; the record may be longer) in one pass."""
        if layout.size > self.length:
            raise ValueError(
                f"layout {layout.format!r} needs {layout.size} bytes; these records hold "
                f"{self.length}"
            )
        if self.n == 1:
            return [layout.unpack_from(self.data, self.skip)]
        return list(_LAYOUTS.get(layout.format, self.skip, self.stride).iter_unpack(self.data))


def _run(data: Any, off: int, length: int, step: int, k: int) -> RecordRun:
    """The committed records of `length` bytes that follow each other from
    `off` (at most k; the first one is known committed), copied out as one run.

    Streams of one record type come as such runs: their headers are read in
    one strided pass and the frames copied in one piece, instead of a header
    read and a slice per record.
    """
    with memoryview(data) as whole:
        view = whole[off : off + k * step]
        hdrs = view.cast("I")[:: step // 4].tolist()
        if hdrs.count(length) != k:  # a BUSY, discarded or other-sized record
            k = next(i for i, h in enumerate(hdrs) if h != length)
        frames = view[: k * step].tobytes()
        view.release()
    return RecordRun(length, k, frames, step, HDR_SIZE)


class RingBufferError(OSError, KernelError):
    """The ring buffer cannot be mapped or is inconsistent."""


class RingBuffer:
    """Consume records from a ring-buffer map fd.

    owns_fd: close the map fd in close(). max_entries: the data size; asked
    from the kernel (map_info) when not given.
    """

    def __init__(self, fd: int, max_entries: int | None = None, *, owns_fd: bool = False) -> None:
        self._fd = fd
        self._owns_fd = owns_fd
        self._cons: mmap.mmap | None = None
        self._data: mmap.mmap | None = None
        self._epoll: select.epoll | None = None
        self._tick = WAKE_TICK  # poll()'s longest wait between looks, now
        # ... and its first after records came: a consumer that takes them in
        # batches anyway raises it, so the reader wakes less often.
        self.min_tick = _TICK_MIN
        self.records = 0  # records handed out so far
        self.discarded = 0  # records the producer discarded (skipped)
        # Records the producer could not reserve are not knowable here: the
        # kernel does not count them; a program must count its own failures.
        try:
            self._open(max_entries)
        except BaseException:
            self.close()
            raise

    def _open(self, max_entries: int | None) -> None:
        fd = self._fd
        if max_entries is None:
            info = bpfsys.map_info(fd)
            if info.type != MapType.RINGBUF:
                raise ValueError(f"fd {fd} is a map of type {info.type}, not a ring buffer (27)")
            max_entries = info.max_entries
        page = mmap.PAGESIZE
        if max_entries <= 0 or max_entries & (max_entries - 1) or max_entries % page:
            raise ValueError(
                f"ring buffer size {max_entries} must be a power of two and a multiple of {page}"
            )
        self.max_entries = max_entries
        self._mask = max_entries - 1
        self._page = page
        try:
            self._cons = mmap.mmap(fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except PermissionError as e:
            raise RingBufferError(
                e.errno,
                "cannot map the ring buffer's consumer page writable: this map fd is "
                "read-only (BPF_F_RDONLY), and a read-only fd cannot be consumed; "
                "hand the consumer a read-write fd of its own ring buffer",
            ) from e
        self._data = mmap.mmap(
            fd, page + 2 * max_entries, mmap.MAP_SHARED, mmap.PROT_READ, offset=page
        )
        self._epoll = select.epoll()  # close-on-exec by default
        self._epoll.register(fd, select.EPOLLIN)

    @classmethod
    def _from_buffers(cls, cons: Any, data: Any, max_entries: int) -> RingBuffer:
        """A reader over plain buffers laid out like the mappings (for tests)."""
        rb = cls.__new__(cls)
        rb._fd, rb._owns_fd, rb._epoll = -1, False, None
        rb._cons, rb._data = cons, data
        rb.records = rb.discarded = 0
        rb._tick, rb.min_tick = WAKE_TICK, _TICK_MIN
        rb.max_entries, rb._mask, rb._page = max_entries, max_entries - 1, mmap.PAGESIZE
        return rb

    # --- lifetime ---

    def fileno(self) -> int:
        """The map fd: readable (EPOLLIN) while records wait."""
        if self._data is None:
            raise ValueError("ring buffer is closed")
        return self._fd

    def close(self) -> None:
        for attr in ("_epoll", "_data", "_cons"):
            obj = getattr(self, attr)
            setattr(self, attr, None)
            if obj is not None and hasattr(obj, "close"):  # plain buffers in tests
                obj.close()
        if self._owns_fd and self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __enter__(self) -> RingBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Unmap even if the user forgot; never close a borrowed fd here.
        if getattr(self, "_data", None) is not None:
            self.close()

    # --- consuming ---

    def pending(self) -> int:
        """Bytes produced but not yet consumed (headers and padding included)."""
        cons, data = self._maps()
        return _U64.unpack_from(data, 0)[0] - _U64.unpack_from(cons, 0)[0]

    def _maps(self) -> tuple[mmap.mmap, mmap.mmap]:
        if self._cons is None or self._data is None:
            raise ValueError("ring buffer is closed")
        return self._cons, self._data

    def drain(self) -> list[bytes]:
        """Every committed record available now, without waiting.

        Stops at a record still being written (BUSY). One call takes at most
        about one ring's worth of data, so memory stays bounded while a
        producer keeps writing.
        """
        return self._take(flat=True)

    def read_runs(self) -> list[RecordRun]:
        """What drain() takes, as runs of records of one size (RecordRun), for
        readers that decode many records per call: a stream of one record
        type comes as a few runs, each cut or decoded in one pass of C."""
        return self._take(flat=False)

    def _take(self, flat: bool) -> list[Any]:
        """The records drain() and read_runs() hand out: payloads (flat) or runs."""
        cons_map, data = self._maps()
        u32_at = _U32.unpack_from
        u64_at = _U64.unpack_from
        mask = self._mask
        page = self._page  # data starts one page into this mapping
        max_len = self.max_entries - HDR_SIZE  # BUSY/DISCARD set make a header exceed it too
        out: list[Any] = []
        append = out.append
        records = discarded = skip = 0
        cons = u64_at(cons_map, 0)[0]
        end = cons + self.max_entries  # at most one ring's worth per call
        busy = False
        while not busy:
            prod = min(u64_at(data, 0)[0], end)
            if cons >= prod:
                break
            while cons < prod:
                off = page + (cons & mask)
                hdr = u32_at(data, off)[0]
                if hdr <= max_len:
                    step = (hdr + HDR_SIZE + 7) & ~7
                    if skip:
                        skip -= 1
                    elif prod - cons >= _RUN_MIN * step and _same(data, off, hdr, step):
                        run = _run(data, off, hdr, step, min((prod - cons) // step, _RUN_MAX))
                        if flat:
                            out += run.payloads()
                        else:
                            append(run)
                        records += run.n
                        cons += run.n * step
                        continue
                    else:  # mixed sizes: look for a run again after a while
                        skip = _RUN_SKIP
                    payload = data[off + HDR_SIZE : off + HDR_SIZE + hdr]
                    append(payload if flat else RecordRun(hdr, 1, payload, hdr, 0))
                    records += 1
                    cons += step
                    continue
                # rare: busy, discarded or corrupt
                if hdr & BUSY_BIT:  # not committed yet: come back later
                    busy = True
                    break
                hdr &= LEN_MASK
                if hdr > max_len:
                    raise RingBufferError(
                        errno.EIO, f"corrupt ring buffer record length {hdr} at {cons}"
                    )
                discarded += 1
                cons += (hdr + HDR_SIZE + 7) & ~7
            # Publish once per pass (the records are copied out by now), so
            # the producer can reuse the space.
            _U64.pack_into(cons_map, 0, cons)
        self.records += records
        self.discarded += discarded
        return out

    def poll(self, timeout: float | None = None) -> list[bytes]:
        """Records available now, or wait up to timeout seconds (None: forever) for some.

        [] means the timeout passed with nothing committed: a record that is
        reserved but not yet committed (BUSY) is waited for, not reported as
        an empty ring. A record committed without a wake-up is seen within
        WAKE_TICK seconds.
        """
        return self._wait(self.drain, timeout)

    def poll_runs(self, timeout: float | None = None) -> list[RecordRun]:
        """poll(), as read_runs() hands records out."""
        return self._wait(self.read_runs, timeout)

    def _wait(self, take: Callable[[], list[Any]], timeout: float | None) -> list[Any]:
        records = take()
        if records:
            self._tick = self.min_tick
            return records
        ep = self._epoll
        if ep is None:
            raise ValueError("ring buffer is closed")
        deadline = None if timeout is None else time.monotonic() + timeout
        nap = _BUSY_NAP_MIN
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return []
            tick = self._tick
            if self.pending():
                # The head record is BUSY. epoll is level-triggered on unread
                # bytes, so it would return at once: nap while the producer
                # (a BPF program, mid-write) finishes.
                time.sleep(nap if left is None else min(nap, left))
                nap = min(2 * nap, _BUSY_NAP_MAX)
            else:
                ep.poll(tick if left is None else min(left, tick))
                self._tick = min(2 * tick, WAKE_TICK)
            records = take()
            if records:
                self._tick = self.min_tick
                return records

    def __iter__(self) -> Iterator[bytes]:
        """Yield records forever, waiting when the ring is empty."""
        while True:
            yield from self.poll(None)
