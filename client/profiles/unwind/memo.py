"""Walks remembered from each frame on: samples of a thread differ in their
innermost frames (the pc moves at every sample) and in words the walk never
reads (locals, counters), while the callers above stay where they were, so
the walk from a caller's frame on holds again.

The walk from a frame on depends on its state (pc, sp, rbp, whether pc is
exact, why the last step was a guess), the top of the stack's mapping, the
files' tables (fixed while the process's snapshot keeps its mappings:
ProcessMaps.merge replaces the list when a later snapshot adds one) and the
words of the copy it reads from there (return addresses, saved rbp, a scan's
candidates). The memo keys the rest of a walk by the state without rbp, and
keeps the addresses and values of the words read, rbp only if a step read it
before a frame's rule replaced it (code built without frame pointers keeps
data in rbp), and the copy's ends only if a read fell outside the copy: a
later walk that reaches the same state in a copy with the same words there
takes the rest as it was, without walking. Exact, never a guess.

An entry is made for a state met a second time, so that the states of the
innermost frames, new at almost every sample, cost a set insert and no entry.
"""

from __future__ import annotations

import struct

from gfxbpf.client.profiles.procmaps import Mapping, ProcessMaps
from gfxbpf.client.profiles.unwind.result import Stop, UnwindResult, UserRegs, stop_text
from gfxbpf.client.profiles.unwind.steps import Buffer, ReadStack
from gfxbpf.client.profiles.unwind.tables import UnwindTables
from gfxbpf.client.profiles.unwind.walk import stack_top, unwind

__all__ = ["UnwindMemo"]

MAX_ENTRIES = 8192  # remembered states: ~1 KiB each at most
SEEN_MAX = 2 * MAX_ENTRIES  # states met once, before one is remembered (cleared when full)

# A walk as the readers keep it: frames, why it stopped (stop_text; None:
# complete), whether a stack scan found a frame.
Walk = tuple[tuple[int, ...], str | None, bool]
# A state as the memo keys it: the snapshot's id, pc, sp, exact, why the last
# step was a guess, the top of the stack's mapping.
Key = tuple[int, int, int, bool, Stop | None, int]
# One state met by a walk: its key, rbp, and how far the copy's reads, the
# reads that missed and the scanned frames had come when the walk stood there.
State = tuple[Key, int | None, int, int, int]

_FORMATS: dict[str, struct.Struct] = {}  # unpackers of the words read, by layout


def _unpacker(addrs: list[int]) -> struct.Struct:
    """One unpack of every word at addrs (sorted): "<" then "{skip}x Q" per word."""
    parts, at = [], addrs[0]
    for a in addrs:
        parts.append(f"{a - at}xQ" if a > at else "Q")
        at = a + 8
    fmt = "<" + "".join(parts)
    got = _FORMATS.get(fmt)
    if got is None:
        if len(_FORMATS) >= MAX_ENTRIES:
            _FORMATS.clear()
        got = _FORMATS[fmt] = struct.Struct(fmt)
    return got


class _Entry:
    """The rest of a walk from one state, and what it read to get there."""

    __slots__ = ("maps", "mappings", "needs_bp", "bp", "addrs", "edge", "fmt", "words", "rest")

    def __init__(
        self, maps: ProcessMaps, bp: int | None, needs_bp: bool, addrs: list[int],
        mem: ReadStack, edge: bool, rest: UnwindResult,
    ) -> None:  # fmt: skip
        self.maps = maps  # the snapshot the tables were picked by (kept: its id is in the key)
        # ... and its mappings then: a walk that met a library not mapped yet
        # ("not code") must be walked again once a refresh adds it
        self.mappings: list[Mapping] = maps.mappings
        self.needs_bp, self.bp = needs_bp, bp
        self.addrs = addrs  # the words read, sorted
        self.edge = (mem.base, mem.end) if edge else None  # a read missed the copy
        self.fmt = _unpacker(addrs) if addrs else None
        self.words = self.fmt.unpack_from(mem.data, addrs[0] - mem.base) if self.fmt else ()
        self.rest = rest

    def holds(self, maps: ProcessMaps, bp: int | None, mem: ReadStack) -> bool:
        """The walk from here on in mem would read the same words as this one."""
        if self.maps is not maps or self.mappings is not maps.mappings:
            return False
        if self.needs_bp and bp != self.bp:
            return False
        if self.edge is not None and self.edge != (mem.base, mem.end):
            return False
        if self.fmt is None:
            return True
        lo = self.addrs[0]
        if lo < mem.base or self.addrs[-1] + 8 > mem.end:
            return False
        return self.fmt.unpack_from(mem.data, lo - mem.base) == self.words


class _Trace:
    """One walk's states (walk.Known): asks the memo at each, and learns the
    rest of the walk from each state met before once the walk ends."""

    __slots__ = ("memo", "maps", "mem", "top", "mid", "states", "steps", "hit")

    def __init__(self, memo: UnwindMemo, maps: ProcessMaps, mem: ReadStack) -> None:
        self.memo, self.maps, self.mem, self.top, self.mid = memo, maps, mem, mem.top, id(maps)
        self.states: list[State] = []
        self.steps: list[tuple[bool, bool, bool]] = []  # per step: walk.Known.stepped's
        self.hit: _Entry | None = None

    def rest(
        self, pc: int, sp: int, bp: int | None, exact: bool, guessed: Stop | None, scanned: int,
        room: int,
    ) -> UnwindResult | None:  # fmt: skip
        key = (self.mid, pc, sp, exact, guessed, self.top)
        entry = self.memo.entries.get(key)
        if (
            entry is not None
            and len(entry.rest.frames) < room
            and entry.holds(self.maps, bp, self.mem)
        ):
            self.hit = entry
            return entry.rest
        mem = self.mem
        self.states.append((key, bp, len(mem.offsets), mem.missed, scanned))
        return None

    def stepped(self, read_bp: bool, kept_bp: bool, loaded_bp: bool) -> None:
        self.steps.append((read_bp, kept_bp, loaded_bp))

    def learn(self, result: UnwindResult) -> None:
        """Remember the rest of the walk from each state met a second time."""
        memo, mem, hit = self.memo, self.mem, self.hit
        if result.stop is Stop.DEPTH or not self.states:
            return  # the rest of a walk cut at the frame limit depends on where it began
        needs = hit.needs_bp if hit is not None else False  # rbp read beyond the last state
        missed = mem.missed + (hit is not None and hit.edge is not None)
        later = set(hit.addrs) if hit is not None else set()
        offsets = mem.offsets
        for k in range(len(self.states) - 1, -1, -1):
            key, bp, n_read, n_missed, scanned = self.states[k]
            if k < len(self.steps):
                read_bp, kept_bp, loaded_bp = self.steps[k]
                if loaded_bp and not needs and len(offsets) > n_read:
                    offsets.pop()  # the caller's saved rbp, never used from here on
                needs = read_bp or (kept_bp and needs)
            later.update(mem.base + off for off in offsets[n_read:])
            del offsets[n_read:]  # in later now
            if key not in memo.seen:
                memo.note(key)
                continue
            rest = UnwindResult(
                result.frames[k:], result.stop, result.scanned - scanned, result.where
            )
            edge = missed > n_missed  # a read from here on fell outside the copy
            memo.keep(key, _Entry(self.maps, bp, needs, sorted(later), mem, edge, rest))


class UnwindMemo:
    """unwind() with the rest of earlier walks reused where exact."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self.entries: dict[Key, _Entry] = {}
        self.seen: set[Key] = set()
        self.hits = 0  # walks answered whole
        self.walks = 0  # walks that took a step (joined = those that then met a known state)
        self.joined = 0

    def walk(
        self,
        ip: int,
        sp: int,
        bp: int,
        stack: Buffer,
        maps: ProcessMaps,
        tables: UnwindTables,
        exact: bool = True,
    ) -> Walk:
        """The walk of the copy stack (bytes from sp up) with these registers
        (exact False: ip is a return address, as unwind() says)."""
        regs = UserRegs(ip, sp, bp)
        mem = ReadStack(sp, stack, stack_top(regs, stack, maps))
        trace = _Trace(self, maps, mem)
        result = unwind(regs, stack, maps, tables, mem=mem, exact=exact, known=trace)
        if not trace.states:
            self.hits += 1
        else:
            self.walks += 1
            self.joined += trace.hit is not None
            trace.learn(result)
        stop = None if result.stop is None else stop_text(result.stop, result.where)
        return result.frames, stop, result.scanned > 0

    def note(self, key: Key) -> None:
        if len(self.seen) >= SEEN_MAX:
            self.seen.clear()
        self.seen.add(key)

    def keep(self, key: Key, entry: _Entry) -> None:
        if len(self.entries) >= self.max_entries and key not in self.entries:
            self.entries.pop(next(iter(self.entries)))  # the oldest
        self.entries[key] = entry
