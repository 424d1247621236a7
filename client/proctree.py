"""A process's live descendants, from /proc (world-readable `stat` files):
which processes of a tree to name symbols for (their /proc/PID/maps) and,
with several --pid, which samples to keep. The kernel follows the tree for
the broker's programs (catalog/programs/gfx_tree.h); this only looks."""

from __future__ import annotations

import os
from collections.abc import Iterable


def _parent(pid: int, proc: str) -> int | None:
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            return int(f.read().rpartition(b")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def descendants(pids: Iterable[int], proc: str = "/proc") -> set[int]:
    """Every live descendant of the given processes (not the processes themselves)."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir(proc)
    except OSError:
        return set()
    for name in names:
        if name.isdigit():
            ppid = _parent(int(name), proc)
            if ppid:
                children.setdefault(ppid, []).append(int(name))
    out: set[int] = set()
    todo = [c for p in pids for c in children.get(p, ())]
    while todo:
        p = todo.pop()
        if p not in out:
            out.add(p)
            todo.extend(children.get(p, ()))
    return out
