"""Per-user budget of kernel memory in the BPF maps the broker hands out.

A client that received a map fd can keep that map alive after it detaches:
it holds the fd, or pins it in a bpffs it may write. The broker cannot see
such references, so it cannot give the memory back when the attachment ends
(the memory stays charged to the broker's cgroup). What it can bound is how
much it creates for one uid: every new instance's client-visible maps are
charged to the uid that made the broker create them, and a charge lapses
`window` seconds after it was made. Joining a live instance costs nothing
(the kernel allocates nothing new).

map_bytes() estimates what the kernel accounts for a map (the `memlock:`
line of its fdinfo, bpf_map_memory_usage()), rounded up, from the same
numbers BPF_MAP_CREATE gets; it errs on the high side.
"""

from __future__ import annotations

import mmap
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gfxbpf.bpf import consts as C

PAGE = mmap.PAGESIZE
# struct bpf_map and its type's header (struct bpf_htab, bpf_array...), with room.
MAP_OVERHEAD = PAGE
_HTAB_ELEM = 48  # sizeof(struct htab_elem) before the key
_HTAB_BUCKET = 16  # sizeof(struct bucket)
_HTAB_LOCKS = 8  # HASHTAB_MAP_LOCK_COUNT ints per possible CPU
_RINGBUF_META_PAGES = 3  # header page, consumer page, producer page
_HASHES = (C.MapType.HASH, C.MapType.LRU_HASH, C.MapType.PERCPU_HASH, C.MapType.LRU_PERCPU_HASH)
_ARRAYS = (
    C.MapType.ARRAY,
    C.MapType.PERCPU_ARRAY,
    C.MapType.PROG_ARRAY,
    C.MapType.PERF_EVENT_ARRAY,
    C.MapType.CGROUP_ARRAY,
    C.MapType.ARRAY_OF_MAPS,
)


def _round8(n: int) -> int:
    return (n + 7) & ~7


def _page_up(n: int) -> int:
    return -(-n // PAGE) * PAGE


def _pow2_up(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def map_bytes(
    map_type: int, key_size: int, value_size: int, max_entries: int, flags: int, ncpus: int
) -> int:
    """Kernel bytes a map of this shape may hold (an upper estimate)."""
    percpu = map_type in C.PERCPU_MAP_TYPES
    value = _round8(value_size)
    if map_type == C.MapType.RINGBUF:
        data_pages = max_entries // PAGE
        body = (_RINGBUF_META_PAGES + data_pages) * PAGE
        body += (_RINGBUF_META_PAGES + 2 * data_pages) * 8  # the vmap's page array
    elif map_type in _ARRAYS:
        body = max_entries * (8 + value * ncpus) if percpu else max_entries * value
    elif map_type in _HASHES:
        lru = map_type in (C.MapType.LRU_HASH, C.MapType.LRU_PERCPU_HASH)
        elem = _HTAB_ELEM + _round8(key_size) + (8 if percpu else value)
        body = _pow2_up(max_entries) * _HTAB_BUCKET + 4 * _HTAB_LOCKS * ncpus
        # Preallocated (the default) or not, max_entries elements is the most;
        # a plain preallocated hash keeps one spare element per CPU.
        entries = max_entries + (ncpus if not (percpu or lru) else 0)
        body += entries * (elem + 8)  # + an llist node when not preallocated
        if percpu:
            body += entries * (8 + value * ncpus)
        if lru:
            body += 8 * ncpus
    elif map_type == C.MapType.STACK_TRACE:
        body = _pow2_up(max_entries) * 8 + max_entries * (16 + value_size)
    else:  # anything else: a key, a value per CPU and a list node per entry
        body = max_entries * (_round8(key_size) + value * (ncpus if percpu else 1) + 64)
    return MAP_OVERHEAD + _page_up(body)


def human(n: int) -> str:
    """Bytes for a message: 268 KiB, 16.0 MiB."""
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    if n >= 1 << 10:
        return f"{n // (1 << 10)} KiB"
    return f"{n} bytes"


@dataclass(eq=False)  # each charge is itself: refund() finds that one
class Charge:
    uid: int
    nbytes: int
    at: float


class OverBudget(Exception):
    """A charge would pass the limit. retry_after: seconds until it would fit,
    None when it never fits (more than the whole limit)."""

    def __init__(self, used: int, need: int, retry_after: float | None) -> None:
        super().__init__(f"{need} bytes over budget ({used} used)")
        self.used = used
        self.need = need
        self.retry_after = retry_after


class MapBudget:
    """Bytes charged per uid over a sliding window; thread-safe.

    The limit and window are passed to each charge, so a reloaded policy
    applies at once.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._charges: dict[int, deque[Charge]] = {}

    def _live(self, uid: int, now: float, window: float) -> deque[Charge]:
        q = self._charges.get(uid)
        if q is None:
            return deque()
        while q and now - q[0].at >= window:
            q.popleft()
        if not q:
            del self._charges[uid]
        return q

    def used(self, uid: int, window: float) -> int:
        with self._lock:
            return sum(c.nbytes for c in self._live(uid, self._clock(), window))

    def charge(self, uid: int, nbytes: int, limit: int, window: float) -> Charge:
        """Record nbytes for uid, or raise OverBudget if that would pass limit."""
        with self._lock:
            now = self._clock()
            q = self._live(uid, now, window)
            used = sum(c.nbytes for c in q)
            if used + nbytes > limit:
                raise OverBudget(
                    used, nbytes, self._retry_after(q, used, nbytes, limit, now, window)
                )
            c = Charge(uid, nbytes, now)
            self._charges.setdefault(uid, q).append(c)
            return c

    @staticmethod
    def _retry_after(
        q: deque[Charge], used: int, nbytes: int, limit: int, now: float, window: float
    ) -> float | None:
        if nbytes > limit:
            return None
        for c in q:  # oldest first: lapse charges until the new one fits
            used -= c.nbytes
            if used + nbytes <= limit:
                return max(0.0, c.at + window - now)
        return 0.0

    def refund(self, charge: Charge) -> None:
        """Take back a charge whose maps never reached a client."""
        with self._lock:
            q = self._charges.get(charge.uid)
            if q is not None and charge in q:
                q.remove(charge)
                if not q:
                    del self._charges[charge.uid]
