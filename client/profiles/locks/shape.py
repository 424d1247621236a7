"""A lock profile's shape: each lock's frames at the root, the waiters and the
releasers under it, and the table of locks the report and the summary show.

    myprog;[lock lock_a];[waiters];main;worker;pthread_mutex_lock;...;[wait: futex]
    myprog;[lock lock_a];[holders, at release];main;worker;pthread_mutex_unlock;...;[wake: futex]

A waiter's stack is weighed by its waiting time, a holder's by the waiting
time its releases ended: each lock's waiting time is shown twice, once per side."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gfxbpf.client.profiles.locks.reader import RELEASED, WAITING

if TYPE_CHECKING:
    from gfxbpf.client.profiles.locks.reader import LockReader, LockStats
    from gfxbpf.client.profiles.model import Profile

WAITERS_FRAME = "[waiters]"
HOLDERS_FRAME = "[holders, at release]"
_LEAF = re.compile(r"^\[lock (.*): (waiting|released)\]$")
_SIDES = {WAITING: (WAITERS_FRAME, "[wait: futex]"), RELEASED: (HOLDERS_FRAME, "[wake: futex]")}


def lock_frames(frames: tuple[str, ...]) -> tuple[str, ...]:
    """A stack with the lock's leaf frame moved to the root (others as they are)."""
    m = _LEAF.match(frames[-1]) if frames else None
    if m is None:
        return frames
    side, leaf = _SIDES[m.group(2)]
    return (frames[0], f"[lock {m.group(1)}]", side, *frames[1:-1], leaf)


def reshape(prof: Profile) -> None:
    """Every stack of prof, and each per-thread copy, with its lock at the root."""
    rekey(prof, lock_frames)
    prof.time_kind = "lock_wait"


def rekey(prof: Profile, change: Callable[[tuple[str, ...]], tuple[str, ...]]) -> None:
    """prof's stacks and per-thread stacks with their frames changed (merged where equal)."""
    stacks: dict[tuple[str, ...], int] = {}
    for frames, n in prof.stacks.items():
        key = change(frames)
        stacks[key] = stacks.get(key, 0) + n
    prof.stacks = stacks
    threads: dict[Any, int] = {}
    for (thread, frames), n in prof.threads.items():
        at = (thread, change(frames))
        threads[at] = threads.get(at, 0) + n
    prof.threads = threads


def lock_table(reader: LockReader) -> list[LockStats]:
    """The locks, most waited on first."""
    return sorted(reader.locks.values(), key=lambda s: (-s.wait_ns, s.pid, s.lock))


def lock_rows(reader: LockReader) -> list[dict[str, Any]]:
    """The summary's `locks`: one object per lock of each process."""
    return [
        {
            "pid": s.pid,
            "lock": s.lock,
            "waits": s.waits,
            "wait_ns": s.wait_ns,
            "wakes": s.wakes,
            "woken": s.woken,
            "released_ns": s.released_ns,
        }
        for s in lock_table(reader)
    ]
