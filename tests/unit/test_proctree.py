"""The descendants the broker seeds a process tree with, and those the client
names symbols for, from a fake /proc."""

from __future__ import annotations

from pathlib import Path

from gfxbpf.broker import proctree as broker_tree
from gfxbpf.client import proctree as client_tree

ALICE, ROOT_UID = 1000, 0


def _proc(tmp_path: Path, procs: dict[int, tuple[int, int, int]]) -> str:
    """pid -> (ppid, real uid, effective uid)."""
    for pid, (ppid, ruid, euid) in procs.items():
        d = tmp_path / str(pid)
        d.mkdir()
        # A command name with spaces and a parenthesis, as the kernel allows.
        (d / "stat").write_text(f"{pid} (a (b) c) S {ppid} 1 1 0\n")
        (d / "status").write_text(f"Name:\tx\nUid:\t{ruid}\t{euid}\t{euid}\t{euid}\n")
    (tmp_path / "self").mkdir()
    return str(tmp_path)


def test_descendants_of_the_callers_own_only(tmp_path: Path) -> None:
    proc = _proc(
        tmp_path,
        {
            100: (1, ALICE, ALICE),  # the target
            101: (100, ALICE, ALICE),  # a child
            102: (101, ALICE, ALICE),  # a grandchild
            103: (100, ALICE, ROOT_UID),  # a setuid child: out of scope
            104: (103, ALICE, ALICE),  # ... and what it started
            105: (1, ALICE, ALICE),  # not in the tree
        },
    )
    assert broker_tree.descendants(100, ALICE, proc) == [101, 102]
    assert sorted(broker_tree.descendants(100, None, proc)) == [101, 102, 103, 104]
    assert client_tree.descendants([100], proc) == {101, 102, 103, 104}
    assert client_tree.descendants([105], proc) == set()
    assert broker_tree.descendants(999, ALICE, proc) == []
