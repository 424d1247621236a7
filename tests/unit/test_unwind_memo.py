"""The walk memo (client/profiles/unwind/memo.py) reuses the rest of a walk
from a frame on only where the walk would read the same words from there: a
copy that differs in a word the rest never reads (a local, the rbp that code
without frame pointers keeps data in) takes it, one that differs in a word
it reads walks again. Every answer is checked against a plain walk, on the
synthetic process of test_unwind_walk."""

from __future__ import annotations

from gfxbpf.client.profiles.unwind import UserRegs, unwind
from gfxbpf.client.profiles.unwind.memo import UnwindMemo, Walk
from gfxbpf.client.profiles.unwind.result import stop_text
from tests.unit.test_unwind_walk import FP, LEAF, LIB, MID, ROOT, SP, FakeTables, maps, stack

RA_MID, RA_FP, RA_ROOT = LIB + MID + 0x10, LIB + FP + 0x20, LIB + ROOT + 0x10
# leaf (CFA sp+8) <- mid (CFA sp+32, rbx saved) <- root: no step reads rbp.
NO_FP = {0: RA_MID, 32: RA_ROOT}
# leaf <- mid <- fp (CFA rbp+16, rbp saved at 0x40) <- root: fp's step reads
# the rbp the sample had (leaf and mid leave it as it was).
FP_RBP = SP + 0x40
WITH_FP = {0: RA_MID, 32: RA_FP, 0x40: 0x1234, 0x48: RA_ROOT}


class Walker:
    """A memo over one snapshot of the synthetic process; each walk checked."""

    def __init__(self, max_entries: int = 8192) -> None:
        self.memo, self.maps, self.tables = UnwindMemo(max_entries), maps(), FakeTables()

    def walk(self, ip: int, words: dict[int, int], bp: int = 0, size: int = 0x400) -> Walk:
        data = stack(words, size)
        got = self.memo.walk(ip, SP, bp, data, self.maps, self.tables)
        plain = unwind(UserRegs(ip, SP, bp), data, self.maps, FakeTables())
        stop = None if plain.stop is None else stop_text(plain.stop, plain.where)
        assert got == (plain.frames, stop, plain.scanned > 0)
        return got

    def again(self, times: int, ip: int = LIB + LEAF + 4, words: dict[int, int] = NO_FP,
              **kw: int) -> None:  # fmt: skip
        """The same sample `times` times (the second one makes its states' entries)."""
        for _ in range(times):
            self.walk(ip, words, **kw)

    @property
    def counts(self) -> tuple[int, int, int]:
        return self.memo.walks, self.memo.hits, self.memo.joined


def test_samples_at_other_leaf_pcs_take_the_callers_walk() -> None:
    w = Walker()
    first = w.walk(LIB + LEAF + 4, NO_FP)
    assert first == ((LIB + LEAF + 4, RA_MID, RA_ROOT), None, False)
    w.walk(LIB + LEAF + 8, NO_FP)  # mid's frame met again: remembered from now on
    assert w.counts == (2, 0, 0)
    got = w.walk(LIB + LEAF + 12, NO_FP | {8: 77, 16: 78})  # mid's locals changed
    assert got[0] == (LIB + LEAF + 12, RA_MID, RA_ROOT) and w.counts == (3, 0, 1)


def test_a_sample_met_again_is_answered_whole() -> None:
    w = Walker()
    w.again(3)
    assert w.counts == (2, 1, 0)


def test_a_changed_return_address_walks_again() -> None:
    w = Walker()
    w.again(2)
    other = w.walk(LIB + LEAF + 4, NO_FP | {32: LIB + ROOT + 0x18})  # mid's caller moved
    assert other[0][-1] == LIB + ROOT + 0x18 and w.counts == (3, 0, 0)


def test_rbp_counts_only_where_a_step_reads_it() -> None:
    # Without frame pointers rbp holds data: samples that differ only there share.
    w = Walker()
    for bp in (1, 2, 3):
        w.walk(LIB + LEAF + 4, NO_FP, bp=bp)
    assert w.counts == (2, 1, 0)
    # fp's frame is found through the rbp the sample had: another rbp walks again.
    w = Walker()
    for _ in range(2):
        assert w.walk(LIB + LEAF + 4, WITH_FP, bp=FP_RBP)[1] is None
    w.walk(LIB + LEAF + 4, WITH_FP, bp=FP_RBP)
    assert w.counts == (2, 1, 0)
    w.walk(LIB + LEAF + 4, WITH_FP, bp=FP_RBP + 0x10)  # the CFA moves: another walk
    assert w.counts == (3, 1, 0)


def test_a_saved_rbp_nothing_reads_later_is_not_compared() -> None:
    # fp saved its caller's rbp (0x1234) and root never reads it: another value
    # there is the same walk; fp's return address is compared.
    w = Walker()
    for saved in (0x1234, 0x5678, 0x9ABC):
        w.walk(LIB + LEAF + 4, WITH_FP | {0x40: saved}, bp=FP_RBP)
    assert w.counts == (2, 1, 0)


def test_a_walk_that_ran_past_the_copy_holds_only_for_a_copy_that_ends_there() -> None:
    w = Walker()
    for _ in range(2):
        assert w.walk(LIB + LEAF + 4, {0: RA_MID}, size=24)[1] == "truncated"  # mid's ra at 32
    w.walk(LIB + LEAF + 4, {0: RA_MID}, size=24)
    assert w.counts == (2, 1, 0)
    assert w.walk(LIB + LEAF + 4, NO_FP, size=0x400)[1] is None  # a longer copy walks on
    assert w.counts == (3, 1, 0)


def test_a_snapshot_that_gained_a_mapping_walks_again() -> None:
    # A copy read before the maps showed its library ("not code"), then the
    # refresh merged the library into the same snapshot: the stale result
    # must not come back (CI: every --stacks-at copy of a ctypes call lost).
    w = Walker()
    w.again(3)
    assert w.counts == (2, 1, 0)
    w.maps.mappings = list(w.maps.mappings)  # ProcessMaps.merge replaces the list
    w.walk(LIB + LEAF + 4, NO_FP)
    assert w.counts == (3, 1, 0)


def test_another_snapshot_never_shares_a_walk() -> None:
    w = Walker()
    w.again(2)
    w.maps = maps()
    w.walk(LIB + LEAF + 4, NO_FP)
    assert w.counts == (3, 0, 0)


def test_the_memo_is_bounded() -> None:
    w = Walker(max_entries=4)
    for _ in range(2):
        for i in range(10):
            w.walk(LIB + LEAF + i, NO_FP)
    assert len(w.memo.entries) == 4
