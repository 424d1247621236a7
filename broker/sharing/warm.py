"""Verified profiling instances kept warm for the same user's next profile.

Loading stackcopy, offcpu or ustackcopy is mostly the verifier's work on
the Python walker: 50-130 ms (0.3-0.4 s on a quiet machine before its
steps became global functions), seconds on a loaded one, and a `--pid`
profile misses that much of its target. These programs
have a ring buffer each, so an instance is never shared, but once its
attachment is released it can serve the next profile of the same user with
the same knobs:

- their target is not a .rodata constant but the tree map (gfx_tree.h,
  GFX_TREE_ONLY), which the broker fills at each attach;
- parking closes the links (nothing is traced), empties the hidden hash
  maps (tree, per-thread slots), zeroes the since map and drains the ring,
  so nothing of the last profile reaches the next one;
- the visible maps are frozen: their counters (lost, Python walker counts)
  go on counting, and gfxclient reads them as differences from the attach;
  py_codes is an LRU table keyed by process, whose old rows name nothing the
  new profile asks for. A visible counts table cannot be emptied either: a
  program may keep one only if its rows hold the since map's value
  (ustackcopy's calls), so that each profile counts in rows of its own;
  an instance whose table is half full is closed instead of parked, so the
  rows of earlier profiles never crowd out the next one's. Other programs
  with such a table (cudakernels) are loaded for each profile.

A parked instance holds its maps, so it stays charged to its user's map
budget. It is closed after IDLE_SECONDS, when the same user's attach would
go over the budget (InstanceLoader evicts and retries), or when the broker
stops. At most PER_USER are parked per uid; the oldest goes first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from gfxbpf.bpf import consts as C
from gfxbpf.bpf.ringbuf import RingBuffer
from gfxbpf.catalog.entries import Program
from gfxbpf.catalog.instance import Instance


class Parkable(Protocol):
    """What parking needs of an instance (broker/instances.py SharedInstance)."""

    @property
    def inst(self) -> Instance: ...

    @property
    def entry(self) -> Program: ...


P = TypeVar("P", bound=Parkable)

IDLE_SECONDS = 120.0
PY_CODES = "py_codes"  # gfx_python.h: code objects met, keyed by (process, tag, address)
PER_USER = 4
_HASHES = (C.MapType.HASH, C.MapType.LRU_HASH)


def poolable(entry: Program) -> bool:
    """Whether an entry's instances can be kept warm: a ring buffer per instance
    (never shared), a target given through its tree map, and no visible map
    that would carry one profile's data into the next. The ring is drained,
    counters are read as differences from the attach, and py_codes is an LRU
    table keyed by process. A counts table cannot be emptied (frozen): it is
    kept only by a program whose rows hold the since map's value, which the
    broker writes at each attach (ustackcopy's calls: the next profile counts
    in new rows); others (cudakernels' kernels) are loaded for each profile."""
    has_ring = any(m.show == "events" for m in entry.visible_maps)
    return (
        has_ring
        and (not counts_tables(entry) or bool(entry.since_map))
        and bool(entry.tree_map and entry.pid_knob)
    )


def counts_tables(entry: Program) -> list[str]:
    """The entry's visible tables other than py_codes (rows a profile counts in)."""
    return [
        m.name
        for m in entry.visible_maps
        if m.show not in ("events", "counter") and m.name != PY_CODES
    ]


@dataclass
class _Parked(Generic[P]):
    shared: P
    uid: int | None
    since: float  # clock() when parked
    timer: threading.Timer | None = field(default=None, repr=False)


class WarmPool(Generic[P]):
    """Parked instances by pool key (InstanceLoader.pool_key); thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._parked: dict[Hashable, list[_Parked[P]]] = {}
        self.closed = False

    def take(self, key: Hashable) -> P | None:
        """The most recently parked instance for key, removed from the pool."""
        with self._lock:
            items = self._parked.get(key)
            if not items:
                return None
            p = items.pop()
            if not items:
                del self._parked[key]
        if p.timer is not None:
            p.timer.cancel()
        return p.shared

    def park(self, key: Hashable, shared: P, uid: int | None) -> None:
        """Stop shared tracing and keep it for key; close it instead if the
        pool is closed or cannot be cleaned."""
        try:
            _quiesce(shared)
            roomy = _roomy(shared)
        except OSError:
            roomy = False
        if not roomy:
            shared.inst.close()
            return
        p = _Parked(shared, uid, self._clock())
        evicted = []
        with self._lock:
            if self.closed:
                evicted.append(p)
            else:
                self._parked.setdefault(key, []).append(p)
                evicted += self._over_limit(uid)
                p.timer = threading.Timer(IDLE_SECONDS, self._expire, (key, p))
                p.timer.daemon = True
                p.timer.start()
        for e in evicted:
            _close(e)

    def evict_user(self, uid: int | None) -> int:
        """Close every instance parked for uid (its map budget is wanted); how many."""
        with self._lock:
            gone = [p for items in self._parked.values() for p in items if p.uid == uid]
            self._remove(gone)
        for p in gone:
            _close(p)
        return len(gone)

    def close(self) -> None:
        """Close everything parked; later parks close at once (broker stop)."""
        with self._lock:
            self.closed = True
            gone = [p for items in self._parked.values() for p in items]
            self._parked.clear()
        for p in gone:
            _close(p)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(items) for items in self._parked.values())

    def _over_limit(self, uid: int | None) -> list[_Parked[P]]:
        mine = sorted(
            (p for items in self._parked.values() for p in items if p.uid == uid),
            key=lambda p: p.since,
        )
        gone = mine[: max(0, len(mine) - PER_USER)]
        self._remove(gone)
        return gone

    def _remove(self, gone: list[_Parked[P]]) -> None:
        ids = {id(p) for p in gone}
        for key in list(self._parked):
            kept = [p for p in self._parked[key] if id(p) not in ids]
            if kept:
                self._parked[key] = kept
            else:
                del self._parked[key]

    def _expire(self, key: Hashable, p: _Parked[P]) -> None:
        with self._lock:
            items = self._parked.get(key, [])
            if p not in items:
                return  # taken meanwhile
            self._remove([p])
        _close(p)


def _close(p: _Parked[P]) -> None:
    if p.timer is not None:
        p.timer.cancel()
    p.shared.inst.close()


def _roomy(shared: Parkable) -> bool:
    """Whether the counts tables have room for another profile's rows: under
    half full (the earlier profiles' rows stay, frozen)."""
    for name in counts_tables(shared.entry):
        kmap = shared.inst.obj.map(name)
        if len(list(kmap.keys())) * 2 >= kmap.max_entries:
            return False
    return True


def _quiesce(shared: Parkable) -> None:
    """Nothing traced, nothing of the last profile left for the next one."""
    inst = shared.inst
    for a in inst.attachments:
        a.close()
    inst.attachments.clear()
    entry = shared.entry
    for m in entry.maps:
        if m.visible:
            continue
        kmap = inst.obj.map(m.name)
        if kmap.map_type in _HASHES:
            for k in list(kmap.keys()):
                kmap.delete(k)
    if entry.since_map:
        inst.obj.map(entry.since_map).update(0, bytes(8))
    for m in entry.visible_maps:
        if m.show == "events":
            ring = inst.obj.map(m.name)
            with RingBuffer(ring.fileno(), ring.max_entries) as rb:
                while rb.drain():
                    pass
