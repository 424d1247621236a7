"""The walk memo (client/profiles/unwind/memo.py) reuses a result only where
the walk would read the same words: a copy that differs in a word the walk
never read hits, one that differs in a word it read walks again."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from gfxbpf.client.profiles.unwind import memo as memo_mod
from gfxbpf.client.profiles.unwind.result import Stop, UnwindResult
from gfxbpf.client.profiles.unwind.steps import Stack

SP = 0x7FFF0000


NO_TABLES: Any = None  # fake_unwind reads no table


class Maps:
    def __init__(self) -> None:
        self.mappings: list[object] = []

    def find(self, addr: int) -> None:
        return None


def _maps() -> Any:
    return Maps()


def fake_unwind(
    regs: Any, stack: Any, maps: Any, tables: Any, mem: Stack, exact: bool = True
) -> UnwindResult:
    """Reads the word at sp + 8 (a return address) and, if it is odd, the one at sp + 24."""
    ra = mem.u64(SP + 8)
    assert ra is not None
    if ra & 1:
        return UnwindResult((regs.ip, ra, mem.u64(SP + 24) or 0), None, 0)
    return UnwindResult((regs.ip, ra), Stop.TRUNCATED, 0)


def copy(*words: int) -> bytes:
    return struct.pack(f"<{len(words)}Q", *words)


def test_a_copy_with_the_same_words_read_reuses_the_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memo_mod, "unwind", fake_unwind)
    m, maps = memo_mod.UnwindMemo(), _maps()
    first = m.walk(0x1000, SP, 0, copy(7, 0x4000, 99, 5), maps, NO_TABLES)
    assert first[0] == (0x1000, 0x4000) and first[1] is not None and m.walks == 1
    # Words 0 and 2 changed (a local, a counter): never read, the same walk.
    assert m.walk(0x1000, SP, 0, copy(8, 0x4000, 100, 5), maps, NO_TABLES) == first
    assert (m.walks, m.hits) == (1, 1)
    # The word read changed: walked again, and now it reads sp + 24 too.
    again = m.walk(0x1000, SP, 0, copy(8, 0x4001, 100, 5), maps, NO_TABLES)
    assert again == ((0x1000, 0x4001, 5), None, False) and m.walks == 2
    # ... so a copy that differs only at sp + 24 walks again as well.
    other = m.walk(0x1000, SP, 0, copy(8, 0x4001, 100, 6), maps, NO_TABLES)
    assert other[0] == (0x1000, 0x4001, 6) and m.walks == 3


def test_other_registers_sizes_or_maps_never_share_a_walk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memo_mod, "unwind", fake_unwind)
    m, maps = memo_mod.UnwindMemo(), _maps()
    data = copy(7, 0x4000, 99, 5)
    m.walk(0x1000, SP, 0, data, maps, NO_TABLES)
    m.walk(0x1008, SP, 0, data, maps, NO_TABLES)  # another ip
    m.walk(0x1000, SP, 16, data, maps, NO_TABLES)  # another rbp
    m.walk(0x1000, SP, 0, data + copy(1), maps, NO_TABLES)  # a longer copy
    m.walk(0x1000, SP, 0, data, _maps(), NO_TABLES)  # a newer snapshot of the maps
    assert (m.walks, m.hits) == (5, 0)


def test_a_snapshot_that_gained_a_mapping_walks_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # A copy read before the maps showed its library ("not code"), then the
    # refresh merged the library into the same snapshot: the stale result
    # must not come back (CI: every --stacks-at copy of a ctypes call lost).
    monkeypatch.setattr(memo_mod, "unwind", fake_unwind)
    m, maps = memo_mod.UnwindMemo(), _maps()
    data = copy(7, 0x4000, 99, 5)
    m.walk(0x1000, SP, 0, data, maps, NO_TABLES)
    m.walk(0x1000, SP, 0, data, maps, NO_TABLES)
    assert (m.walks, m.hits) == (1, 1)
    maps.mappings = [object()]  # ProcessMaps.merge replaces the list
    m.walk(0x1000, SP, 0, data, maps, NO_TABLES)
    assert (m.walks, m.hits) == (2, 1)


def test_the_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memo_mod, "unwind", fake_unwind)
    m, maps = memo_mod.UnwindMemo(max_entries=4), _maps()
    for ip in range(10):
        m.walk(ip, SP, 0, copy(7, 0x4000), maps, NO_TABLES)
    assert len(m._entries) == 4
