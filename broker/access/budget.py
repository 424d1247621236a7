"""Per-user budget of kernel memory in the BPF maps the broker hands out.

A client that received a map fd can keep that map alive after it detaches:
it holds the fd, or pins it in a bpffs it may write. The memory stays
charged to the broker's cgroup for as long as the kernel holds the map.
Every new instance's client-visible maps are charged to the uid that made
the broker create them, and two limits apply (issue #26 item 11, issue #24
item 4: one model):

- live: the bytes of a uid's maps the kernel still holds, attached or kept
  through fds and pins (map_bytes_per_user). A charge is released only when
  the kernel has freed every one of its maps; the broker sees that by their
  ids (bpf/mapids.py). Where it cannot list map ids, a charge counts as live
  until `window` seconds after it was made.
- churn: the bytes of maps created for a uid in the last `window` seconds,
  freed or not (map_churn_bytes_per_user): an allowance that a user
  profiling once a minute, or re-running 10-second profiles back to back,
  never meets, and that stops a tight create-and-drop loop. A load that
  fails keeps its churn part (refund() gives back only the live part).

Joining a live instance costs nothing (the kernel allocates nothing new).

map_bytes() estimates what the kernel accounts for a map (the `memlock:`
line of its fdinfo, bpf_map_memory_usage()), rounded up, from the same
numbers BPF_MAP_CREATE gets; it errs on the high side.
"""

from __future__ import annotations

import mmap
import threading
import time
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
    map_ids: frozenset[int] | None = None  # the kernel's ids, once loaded (bind)
    freed: bool = False  # the kernel no longer holds any of its maps


@dataclass(frozen=True)
class Limits:
    live: int  # bytes a uid's maps may hold at once
    churn: int  # bytes created for a uid per window
    window: float  # seconds


class OverBudget(Exception):
    """A charge would pass a limit (kind "live" or "churn"). retry_after: seconds
    until it would fit (churn), None when unknown (live: it fits once the
    kernel frees maps) or never (more than the whole limit: whole=True)."""

    def __init__(
        self, kind: str, used: int, need: int, retry_after: float | None, whole: bool = False
    ) -> None:
        super().__init__(f"{need} bytes over the {kind} budget ({used} used)")
        self.kind = kind
        self.used = used
        self.need = need
        self.retry_after = retry_after
        self.whole = whole


class MapBudget:
    """Charges per uid, live and recent; thread-safe.

    live_ids() lists the map ids the kernel holds (None: cannot tell). The
    limits are passed to each charge, so a reloaded policy applies at once.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        live_ids: Callable[[], set[int] | None] = lambda: None,
    ) -> None:
        self._clock = clock
        self._live_ids = live_ids
        self._lock = threading.Lock()
        self._charges: dict[int, list[Charge]] = {}

    def _refresh(self, uid: int, now: float, window: float) -> list[Charge]:
        """uid's charges, those the kernel freed marked, old freed ones dropped."""
        q = self._charges.get(uid, [])
        bound = [(c, c.map_ids) for c in q if not c.freed and c.map_ids]
        if bound:
            ids = self._live_ids()
            for c, mine in bound:
                if ids is None:  # cannot tell: live for a window, as before
                    c.freed = now - c.at >= window
                else:
                    c.freed = not (mine & ids)
        q = [c for c in q if not (c.freed and now - c.at >= window)]
        if q:
            self._charges[uid] = q
        else:
            self._charges.pop(uid, None)
        return q

    def used(self, uid: int, window: float) -> tuple[int, int]:
        """(live bytes, bytes created in the last window) of uid."""
        with self._lock:
            now = self._clock()
            q = self._refresh(uid, now, window)
            return _live(q), _recent(q, now, window)

    def charge(self, uid: int, nbytes: int, limits: Limits) -> Charge:
        """Record nbytes for uid, or raise OverBudget if that would pass a limit."""
        for kind, limit in (("live", limits.live), ("churn", limits.churn)):
            if nbytes > limit:
                raise OverBudget(kind, 0, nbytes, None, whole=True)
        with self._lock:
            now = self._clock()
            q = self._refresh(uid, now, limits.window)
            recent = _recent(q, now, limits.window)
            if recent + nbytes > limits.churn:
                wait = _churn_retry(q, recent, nbytes, limits, now)
                raise OverBudget("churn", recent, nbytes, wait)
            live = _live(q)
            if live + nbytes > limits.live:
                raise OverBudget("live", live, nbytes, None)
            c = Charge(uid, nbytes, now)
            self._charges.setdefault(uid, q).append(c)
            return c

    def bind(self, charge: Charge, map_ids: set[int]) -> None:
        """The kernel ids of a charge's maps: it is released once all are freed."""
        with self._lock:
            charge.map_ids = frozenset(map_ids)

    def refund(self, charge: Charge) -> None:
        """Give back the live part of a charge whose maps never reached a client
        (a failed load or attach). Its churn part stays for the window: the
        broker created those maps, and verified the program, all the same, so a
        loop of loads that fail (a target that exits while attaching) meets the
        churn allowance as a loop that succeeds does (issue 35 item 5)."""
        with self._lock:
            charge.freed = True


def _live(q: list[Charge]) -> int:
    return sum(c.nbytes for c in q if not c.freed)


def _recent(q: list[Charge], now: float, window: float) -> int:
    return sum(c.nbytes for c in q if now - c.at < window)


def _churn_retry(q: list[Charge], recent: int, nbytes: int, limits: Limits, now: float) -> float:
    """Seconds until enough recent charges leave the window for nbytes to fit."""
    for c in sorted((c for c in q if now - c.at < limits.window), key=lambda c: c.at):
        recent -= c.nbytes
        if recent + nbytes <= limits.churn:
            return max(0.0, c.at + limits.window - now)
    return 0.0
