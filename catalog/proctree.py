"""The process tree a program of catalog/programs/gfx_tree.h follows, from
/proc: the broker seeds the tree's map with the descendants a target has at
attach (the kernel's fork hook takes the later ones), and the client names
the symbols of the same processes (client/family.py). Only world-readable
files are read (`stat` for the parent, `status` for the owner), so neither
needs a ptrace right.
"""

from __future__ import annotations

import os


def parent(pid: int, proc: str = "/proc") -> int | None:
    """pid's parent, or None when pid is gone or its stat cannot be read."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            return int(f.read().rpartition(b")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def children(proc: str = "/proc") -> dict[int, list[int]]:
    """Every live process's children, by a scan of every process's parent."""
    out: dict[int, list[int]] = {}
    try:
        names = os.listdir(proc)
    except OSError:
        return out
    for name in names:
        if name.isdigit():
            ppid = parent(int(name), proc)
            if ppid:
                out.setdefault(ppid, []).append(int(name))
    return out


def _owned_by(pid: int, uid: int, proc: str) -> bool:
    """Real and effective uid are uid (what scope self demands of a target)."""
    try:
        with open(f"{proc}/{pid}/status", "rb") as f:
            for line in f.read().splitlines():
                if line.startswith(b"Uid:"):
                    real, eff = line.split()[1:3]
                    return int(real) == uid and int(eff) == uid
    except (OSError, ValueError, IndexError):
        pass
    return False


def descendants(pid: int, uid: int | None, proc: str = "/proc") -> list[int]:
    """The live descendants of pid, children before grandchildren; with uid,
    only those the user owns (and nothing below one that is not theirs)."""
    tree = children(proc)
    out: list[int] = []
    todo = list(tree.get(pid, ()))
    while todo:
        p = todo.pop(0)
        if uid is not None and not _owned_by(p, uid, proc):
            continue  # a setuid child, or another user's: outside the scope
        out.append(p)
        todo.extend(tree.get(p, ()))
    return out
