"""A process's live family, its descendants, from /proc (world-readable files):
which processes of a tree to name symbols for (their /proc/PID/maps) and,
with several --pid, which samples to keep. The kernel follows the tree for
the broker's programs (catalog/programs/gfx_tree.h); this only looks, with
catalog/proctree.py's scan where /proc has no `children` files."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from gfxbpf.catalog import proctree


def descendants(pids: Iterable[int], proc: str = "/proc") -> set[int]:
    """Every live descendant of the given processes (not the processes themselves)."""
    if os.path.exists(f"{proc}/thread-self/children"):
        return _down_from(pids, proc)
    return _by_scan(pids, proc)


def _children(pid: int, proc: str) -> list[int]:
    """The children of every thread of pid, by its tasks' `children` files
    (a kernel built with CONFIG_PROC_CHILDREN): what a scan of every
    process's ppid finds, reading only the tree's files (profile asks every
    50 ms; the scan costs ~1 ms per 100 processes on the host)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return out  # gone
    for tid in tids:
        try:
            with open(f"{proc}/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return out


def _walk(pids: Iterable[int], kids: Callable[[int], Iterable[int]]) -> set[int]:
    out: set[int] = set()
    todo = [c for p in pids for c in kids(p)]
    while todo:
        p = todo.pop()
        if p not in out:
            out.add(p)
            todo.extend(kids(p))
    return out


def _down_from(pids: Iterable[int], proc: str) -> set[int]:
    return _walk(pids, lambda p: _children(p, proc))


def _by_scan(pids: Iterable[int], proc: str) -> set[int]:
    tree = proctree.children(proc)  # one scan of every process's parent
    return _walk(pids, lambda p: tree.get(p, ()))
