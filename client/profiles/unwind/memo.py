"""Walks remembered: a thread that waits or is sampled again and again at the
same place sends copies that differ only in words the walk never reads
(locals, counters, timestamps), so the walk's result holds again.

A walk reads the registers, the copy's length and the top of its stack
mapping, the files' tables (fixed while the process's snapshot keeps its
mappings: ProcessMaps.merge replaces the list when a later snapshot adds one)
and a few words of the copy (return addresses, saved rbp, a scan's
candidates). The memo keys a result by the first ones and keeps the offsets
and values of the words read: a copy with the same words at those offsets
walks to the same result, so it is returned without walking. Exact, never a
guess; an off-CPU profile of threads that wait thousands of times a second
unwinds several times faster, so the ring keeps up.
"""

from __future__ import annotations

import struct

from gfxbpf.client.profiles.procmaps import ProcessMaps
from gfxbpf.client.profiles.unwind.result import UnwindResult, UserRegs, stop_text
from gfxbpf.client.profiles.unwind.steps import Buffer, ReadStack
from gfxbpf.client.profiles.unwind.tables import UnwindTables
from gfxbpf.client.profiles.unwind.walk import stack_top, unwind

__all__ = ["UnwindMemo"]

MAX_ENTRIES = 8192  # distinct (maps, registers, copy size): ~1 KiB each


# A walk as the readers keep it: frames, why it stopped (stop_text; None:
# complete), whether a stack scan found a frame.
Walk = tuple[tuple[int, ...], str | None, bool]


def _walk(result: UnwindResult) -> Walk:
    stop = None if result.stop is None else stop_text(result.stop, result.where)
    return result.frames, stop, result.scanned > 0


class _Entry:
    __slots__ = ("maps", "mappings", "fmt", "words", "result")

    def __init__(self, maps: ProcessMaps, offsets: list[int], data: Buffer, result: Walk):
        self.maps = maps  # the snapshot the tables were picked by (kept: its id is the key)
        # ... and its mappings then: a walk that met a library not mapped yet
        # ("not code") must be walked again once a refresh adds it
        self.mappings = maps.mappings
        offsets = sorted(set(offsets))
        # One unpack of every word read: "<" then "{skip}x Q" per word.
        parts, at = [], 0
        for off in offsets:
            parts.append(f"{off - at}xQ" if off > at else "Q")
            at = off + 8
        self.fmt = struct.Struct("<" + "".join(parts))
        self.words = self.fmt.unpack_from(data)
        self.result = result


class UnwindMemo:
    """unwind() with the results of earlier walks reused where exact."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._entries: dict[tuple[int, int, int, int, int, bool], _Entry] = {}
        self.hits = 0
        self.walks = 0

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
        key = (id(maps), ip, sp, bp, len(stack), exact)
        entry = self._entries.get(key)
        if (
            entry is not None
            and entry.maps is maps
            and entry.mappings is maps.mappings
            and entry.fmt.unpack_from(stack) == entry.words
        ):
            self.hits += 1
            return entry.result
        self.walks += 1
        regs = UserRegs(ip, sp, bp)
        mem = ReadStack(sp, stack, stack_top(regs, stack, maps))
        result = _walk(unwind(regs, stack, maps, tables, mem=mem, exact=exact))
        if len(self._entries) >= self.max_entries and key not in self._entries:
            self._entries.pop(next(iter(self._entries)))  # the oldest
        self._entries[key] = _Entry(maps, mem.offsets, stack, result)
        return result
