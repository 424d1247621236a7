"""Lock and waker profiles without a kernel: futex words named by their
variables' symbols, waits joined with the release that ended them, wakers
joined with their waits, the frames the profiles show, and the flags'
combinations. The kernel half is tests/kernel/test_locks.py."""

from __future__ import annotations

import ctypes
import mmap
import os

import pytest

from gfxbpf.client.cli.gfxclient import parse_args
from gfxbpf.client.cli.kinds import locks as lock_profile
from gfxbpf.client.errors import UsageError
from gfxbpf.client.profiles import copies, procmaps
from gfxbpf.client.profiles.locks import reader as locks_reader
from gfxbpf.client.profiles.locks import shape, wakers
from gfxbpf.client.profiles.locks.names import LockNames
from gfxbpf.client.profiles.model import Profile, Thread
from tests.event_stream import Records

TGID, FUTEX = 7, 202
WAIT = locks_reader.FLAG_LOCK_WAIT | copies.FLAG_SYSCALL
WAKE = locks_reader.FLAG_LOCK_WAKE | copies.FLAG_SYSCALL


def _rec(tid: int, flags: int, entry: int, elapsed: int, word: int = 0, wakee: int = 0) -> bytes:
    low, high = (word & 0xFFFFFFFF, word >> 32) if word else (wakee, 0)
    return copies.HEADER.pack(TGID, tid, flags, 0, 0, 0, 0, entry, elapsed, low, high, b"app")


def test_a_global_is_named_by_its_symbol_and_other_memory_by_mapping() -> None:
    maps = procmaps.capture(os.getpid())
    assert maps is not None
    runtime = ctypes.addressof(ctypes.c_int.in_dll(ctypes.pythonapi, "_PyRuntime"))
    names = LockNames()
    assert names.name(maps, runtime) == "_PyRuntime"
    assert names.name(maps, runtime + 0x28) == "_PyRuntime+0x28"
    buf = mmap.mmap(-1, 8192, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        where = ctypes.addressof(ctypes.c_char.from_buffer(buf)) + 0x10
        fresh = procmaps.capture(os.getpid())
        assert LockNames().name(fresh, where).startswith("[anon]+0x")  # merged with neighbours
    finally:
        del where
        buf.close()
    assert names.name(None, 0x7F00_0000_1234) == "[process gone]+0x234"


def test_each_wait_is_joined_with_the_release_that_ended_it() -> None:
    word = 0x5555_0000_1000
    recs = [
        _rec(11, WAIT, 1_000, 40_000_000, word),  # waits from t=1 us for 40 ms
        _rec(12, WAKE, 2_000, 1, word),  # a release too early: another wait's
        _rec(12, WAKE, 40_000_000, 1, word),  # the release that ended it
        _rec(13, WAKE, 50_000_000, 1, word + 8),  # another lock's
        _rec(11, WAIT, 60_000_000, 5_000_000, word),  # no release seen: not joined
    ]
    reader = locks_reader.LockReader(Records(recs), lambda pid, refresh: None, None)  # type: ignore[arg-type]
    reader.drain()
    raw = reader.raw_stacks()
    (stats,) = [s for s in reader.locks.values() if s.waits]
    assert (stats.waits, stats.wait_ns, stats.wakes, stats.released_ns) == (
        2,
        45_000_000,
        2,
        40_000_000,
    )
    released = [s for s in raw if s.leaf and s.leaf.endswith(": released]")]
    assert [s.weight for s in released] == [40_000_000], released
    waited = sum(s.weight for s in raw if s.leaf and s.leaf.endswith(": waiting]"))
    assert waited == 45_000_000


def test_the_lock_goes_to_the_root_with_its_side() -> None:
    prof = Profile(
        stacks={
            ("app", "main", "f", "[lock lock_a: waiting]"): 3,
            ("app", "main", "g", "[lock lock_a: released]"): 3,
            ("app", "main"): 1,
        },
        unit="nanoseconds",
        threads={(Thread(1), ("app", "main", "f", "[lock lock_a: waiting]")): 3},
    )
    shape.reshape(prof)
    assert prof.stacks == {
        ("app", "[lock lock_a]", "[waiters]", "main", "f", "[wait: futex]"): 3,
        ("app", "[lock lock_a]", "[holders, at release]", "main", "g", "[wake: futex]"): 3,
        ("app", "main"): 1,
    }
    assert list(prof.threads)[0][1][1] == "[lock lock_a]" and prof.time_kind == "lock_wait"


def test_a_waiter_is_keyed_by_its_waker_and_a_marker_stands_for_others() -> None:
    other = wakers.FLAG_WAKER | wakers.FLAG_WAKER_OTHER
    kernel = wakers.FLAG_WAKER | wakers.FLAG_WAKER_KERNEL
    recs = [
        _rec(0, other, 100, 0, wakee=21),
        _rec(21, copies.FLAG_SYSCALL, 100, 30_000_000, wakee=FUTEX),  # joined: same entry_ns
        _rec(0, kernel, 200, 0, wakee=22),
        _rec(22, copies.FLAG_SYSCALL, 999, 10_000_000, wakee=FUTEX),  # another wait's waker
    ]
    reader = wakers.WakerReader(Records(recs), lambda pid, refresh: None, None)  # type: ignore[arg-type]
    reader.drain()
    leaves = {s.leaf: s.weight for s in reader.raw_stacks()}
    assert leaves == {"[wait: futex] [woken by #0]": 30_000_000, "[wait: futex]": 10_000_000}
    assert reader.woken_ns == {"yours": 0, "other": 30_000_000, "kernel": 0, "unknown": 10_000_000}
    frames = {0: (wakers.OTHER_FRAME,)}
    joined = wakers._join(("app", "main", "[wait: futex] [woken by #0]"), frames)
    assert joined == ("app", "main", "[wait: futex]", "--", "[woken by another user's process]")


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--wakers"], "--wakers goes with --off-cpu"),
        (["--locks", "--wall"], "--locks does not go with --wall"),
        (["--locks", "--off-cpu", "--wakers"], "--locks does not go with --off-cpu, --wakers"),
        (["--locks", "--scope", "system"], "scope self only"),
    ],
)
def test_flags_that_do_not_go_together(argv: list[str], words: str) -> None:
    args = parse_args(["profile", *argv, "--", "true"])
    with pytest.raises(UsageError, match=words):
        lock_profile.run(args, None, None, None) if "--locks" in argv else lock_profile.command(
            args, None
        )  # type: ignore[arg-type]
