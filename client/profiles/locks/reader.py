"""Program `locks`' records read as they come: each futex wait that slept and
each wake that woke a thread, unwound like every stack copy
(client/profiles/copies.py) and keyed by the lock they touched.

A wait's stack is weighed by the time it waited. The release that ended it
is the last wake of the same futex word (in the same process) that entered
between the wait's entry and its exit: the thread that made it held the
lock, and its stack (pthread_mutex_unlock's caller) is weighed by the time
of the waits it ended. The two sides carry leaf frames that shape.py turns
into the lock's frames at the root."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gfxbpf.client.profiles.copies import CopyReader, StackKey, parse_header
from gfxbpf.client.profiles.locks.names import LockNames

if TYPE_CHECKING:
    from gfxbpf.client.events import EventStream
    from gfxbpf.client.profiles.copies import MapsOf
    from gfxbpf.client.profiles.model import RawStack
    from gfxbpf.client.profiles.unwind import UnwindTables

# Record flags (catalog/programs/locks.bpf.c): which side of the lock.
FLAG_LOCK_WAIT = 8192
FLAG_LOCK_WAKE = 16384
WAITING, RELEASED = "waiting", "released"


def lock_leaf(lock: str, side: str) -> str:
    """The leaf frame a record's stack carries until shape.py moves it to the root."""
    return f"[lock {lock}: {side}]"


@dataclass
class LockStats:
    """One lock of one process: what its waiters and releasers did."""

    pid: int
    lock: str
    waits: int = 0
    wait_ns: int = 0
    wakes: int = 0  # wakes that woke at least one thread
    woken: int = 0  # threads those wakes woke
    released_ns: int = 0  # the waits' time joined to the release that ended them


class LockReader(CopyReader):
    """Drains a `locks` attachment's ring: waits and releases per lock."""

    def __init__(
        self,
        stream: EventStream,
        process_maps: MapsOf,
        tables: UnwindTables,
        pids: Sequence[int] = (),
    ) -> None:
        super().__init__(stream, process_maps, tables, pids, waits=True)
        self.names = LockNames()
        self.locks: dict[tuple[int, int], LockStats] = {}  # (tgid, futex word) -> stats
        # (tgid, futex word) -> its waits: (entry_ns, exit_ns, ns, key)
        self._waits: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
        # (tgid, futex word) -> its releases, in the order read: (entry_ns, key)
        self._wakes: dict[tuple[int, int], list[tuple[int, StackKey]]] = {}
        self.joined = False

    def add(self, rec: bytes) -> None:
        tgid, _tid, flags, _s, _ip, _sp, _bp, ts, elapsed, low, high, comm = parse_header(rec)
        self.records += 1
        side = flags & (FLAG_LOCK_WAIT | FLAG_LOCK_WAKE)
        if not side or not self.ours(tgid, comm):
            return
        self.samples += 1
        word = (tgid, low | high << 32)
        stats = self.locks.get(word)
        if stats is None:
            name = self.names.name(self.process_maps(tgid, False), word[1])
            stats = self.locks[word] = LockStats(tgid, name)
        if side == FLAG_LOCK_WAIT:
            key = self.key_of(rec, (), lock_leaf(stats.lock, WAITING))
            self.counts[key] = self.counts.get(key, 0) + elapsed
            self.by_state["sleeping"] += elapsed
            self._waits.setdefault(word, []).append((ts, ts + elapsed, elapsed))
            stats.waits += 1
            stats.wait_ns += elapsed
        else:
            key = self.key_of(rec, (), lock_leaf(stats.lock, RELEASED))
            self._wakes.setdefault(word, []).append((ts, key))
            stats.wakes += 1
            stats.woken += elapsed

    def raw_stacks(self) -> list[RawStack]:
        """The waiters' stacks and the releasers', each release weighed by the waits it ended."""
        if not self.joined:
            self.joined = True
            for word, waits in self._waits.items():
                self._join(word, waits)
        return super().raw_stacks()

    def _join(self, word: tuple[int, int], waits: list[tuple[int, int, int]]) -> None:
        wakes = sorted(self._wakes.get(word, ()), key=lambda w: w[0])
        times = [t for t, _ in wakes]
        stats = self.locks[word]
        for entry, end, ns in waits:
            i = bisect.bisect_right(times, end) - 1
            if i >= 0 and times[i] >= entry:
                key = wakes[i][1]
                self.counts[key] = self.counts.get(key, 0) + ns
                stats.released_ns += ns
