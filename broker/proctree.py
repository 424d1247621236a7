"""The descendants of a process, from /proc, for a program that follows a
process tree (catalog/programs/gfx_tree.h). The broker reads only world-readable
files (`stat` for the parent, `status` for the owner), so it needs no ptrace
right; the kernel's fork hook takes over for processes forked after attach.
"""

from __future__ import annotations

import os


def _parent(pid: int, proc: str) -> int | None:
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            return int(f.read().rpartition(b")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


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
    children: dict[int, list[int]] = {}
    for name in os.listdir(proc):
        if name.isdigit():
            ppid = _parent(int(name), proc)
            if ppid:
                children.setdefault(ppid, []).append(int(name))
    out: list[int] = []
    todo = list(children.get(pid, ()))
    while todo:
        p = todo.pop(0)
        if uid is not None and not _owned_by(p, uid, proc):
            continue  # a setuid child, or another user's: outside the scope
        out.append(p)
        todo.extend(children.get(p, ()))
    return out
