"""broker/sharing/warm.py: parked instances by key and user, their bounds."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from gfxbpf.broker.sharing import warm


class _Inst:
    def __init__(self) -> None:
        self.closed = False
        self.attachments: list[Any] = []

    def close(self) -> None:
        self.closed = True


class _Shared:
    def __init__(self) -> None:
        self.inst = _Inst()
        self.entry: Any = SimpleNamespace(visible_maps=())  # no counts table


@pytest.fixture(autouse=True)
def _no_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warm, "_quiesce", lambda shared: None)


def test_a_parked_instance_is_taken_once_by_its_key() -> None:
    pool: warm.WarmPool[Any] = warm.WarmPool()
    s = _Shared()
    pool.park("k", s, 1000)
    assert pool.take("other") is None
    assert pool.take("k") is s and not s.inst.closed
    assert pool.take("k") is None
    pool.close()


def test_at_most_per_user_parked_the_oldest_closed_first() -> None:
    pool: warm.WarmPool[Any] = warm.WarmPool()
    mine = [_Shared() for _ in range(warm.PER_USER + 1)]
    theirs = _Shared()
    for i, s in enumerate(mine):
        pool.park(("k", i), s, 1000)
    pool.park("t", theirs, 2000)
    assert mine[0].inst.closed  # the oldest of uid 1000's
    assert not any(s.inst.closed for s in mine[1:]) and not theirs.inst.closed
    assert len(pool) == warm.PER_USER + 1
    pool.close()


def test_evicting_a_user_closes_only_theirs() -> None:
    pool: warm.WarmPool[Any] = warm.WarmPool()
    mine, theirs = _Shared(), _Shared()
    pool.park("a", mine, 1000)
    pool.park("b", theirs, 2000)
    assert pool.evict_user(1000) == 1
    assert mine.inst.closed and not theirs.inst.closed
    assert pool.take("a") is None and pool.take("b") is theirs
    pool.close()


def test_idle_instances_expire(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warm, "IDLE_SECONDS", 0.05)
    pool: warm.WarmPool[Any] = warm.WarmPool()
    s = _Shared()
    pool.park("k", s, 1000)
    for _ in range(200):
        if s.inst.closed:
            break
        time.sleep(0.01)
    assert s.inst.closed and pool.take("k") is None
    pool.close()


def test_after_close_nothing_is_kept() -> None:
    pool: warm.WarmPool[Any] = warm.WarmPool()
    kept, late = _Shared(), _Shared()
    pool.park("k", kept, 1000)
    pool.close()
    assert kept.inst.closed
    pool.park("k", late, 1000)  # a release during shutdown
    assert late.inst.closed and pool.take("k") is None


def test_an_instance_that_cannot_be_cleaned_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(shared: Any) -> None:
        raise OSError("map gone")

    monkeypatch.setattr(warm, "_quiesce", broken)
    pool: warm.WarmPool[Any] = warm.WarmPool()
    s = _Shared()
    pool.park("k", s, 1000)
    assert s.inst.closed and pool.take("k") is None


def test_which_programs_are_kept_warm() -> None:
    from gfxbpf.catalog.entries import load_catalog

    cat = load_catalog()
    # ustackcopy's calls rows hold the since map's value: the next profile
    # counts in rows of its own. cudakernels' kernels table has no such key.
    assert warm.counts_tables(cat.get("ustackcopy")) == ["calls"]
    assert cat.get("ustackcopy").since_map
    for name in ("stackcopy", "offcpu", "ustackcopy"):
        assert warm.poolable(cat.get(name)), name
    for name in ("cudakernels", "profile", "ustacks"):
        assert not warm.poolable(cat.get(name)), name


class _Table:
    def __init__(self, rows: int, max_entries: int) -> None:
        self.rows, self.max_entries = rows, max_entries

    def keys(self) -> Any:
        return iter(range(self.rows))


def _with_calls(rows: int) -> _Shared:
    s = _Shared()
    calls = SimpleNamespace(name="calls", show="table")
    s.entry = SimpleNamespace(visible_maps=(calls,))
    table = _Table(rows, 16384)
    s.inst.obj = SimpleNamespace(map=lambda name: table)  # type: ignore[attr-defined]
    return s


def test_an_instance_whose_counts_table_is_half_full_is_closed_not_parked() -> None:
    pool: warm.WarmPool[Any] = warm.WarmPool()
    roomy, full = _with_calls(8191), _with_calls(8192)
    pool.park("a", roomy, 1000)
    pool.park("b", full, 1000)
    assert pool.take("a") is roomy and not roomy.inst.closed
    assert full.inst.closed and pool.take("b") is None
    pool.close()
