"""The descendants the broker seeds a process tree with, and those the client
names symbols for, from a fake /proc (the client's by its tasks' children
files too, and as a scan of the real /proc finds them)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from gfxbpf.catalog import proctree as broker_tree
from gfxbpf.client import family as client_tree

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


def _kill_tree(pid: int) -> None:
    for p in client_tree.descendants([pid]) | {pid}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def test_the_tree_by_children_files_is_the_tree_by_scan() -> None:
    script = "sleep 30 & (sleep 30; true) & bash -c 'sleep 30 & wait' & wait"
    with subprocess.Popen(["bash", "-c", script]) as top:
        try:
            deadline = time.monotonic() + 10
            while len(client_tree._by_scan([top.pid], "/proc")) < 5:
                assert time.monotonic() < deadline, "the tree never started"
                time.sleep(0.01)
            scanned = client_tree._by_scan([top.pid], "/proc")
            assert client_tree.descendants([top.pid]) == scanned
            if os.path.exists("/proc/thread-self/children"):  # CONFIG_PROC_CHILDREN
                assert client_tree._down_from([top.pid], "/proc") == scanned
        finally:
            _kill_tree(top.pid)


def test_children_files_are_followed_down_every_thread(tmp_path: Path) -> None:
    proc = _proc(
        tmp_path, {100: (1, ALICE, ALICE), 101: (100, ALICE, ALICE), 102: (101, ALICE, ALICE)}
    )
    for pid, tids in {100: {100: "", 105: "101 "}, 101: {101: "102"}, 102: {102: ""}}.items():
        for tid, kids in tids.items():
            (tmp_path / str(pid) / "task" / str(tid)).mkdir(parents=True)
            (tmp_path / str(pid) / "task" / str(tid) / "children").write_text(kids)
    (tmp_path / "thread-self").mkdir()
    (tmp_path / "thread-self" / "children").write_text("")
    assert client_tree.descendants([100], proc) == {101, 102}  # 101 started by thread 105
    assert client_tree.descendants([102], proc) == set()
    assert client_tree.descendants([999], proc) == set()  # gone
