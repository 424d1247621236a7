"""python -m gfxbpf.bpf load: kernel ids on one JSON line, unload when stdin closes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from gfxbpf.catalog.entries import load_catalog
from gfxbpf.catalog.objects import object_path

CATALOG = load_catalog()


def prog_exists(prog_id: int) -> bool:
    r = subprocess.run(["bpftool", "prog", "show", "id", str(prog_id)], capture_output=True)
    return r.returncode == 0


def test_load_prints_ids_and_unloads_on_stdin_close() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gfxbpf.bpf", "load", str(object_path(CATALOG.get("ucalls")))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    line = proc.stdout.readline()
    d = json.loads(line)
    # Every program of the object: the probes and both builds of the process
    # tree's fork hook (gfx_tree.h), with the tree's map.
    assert set(d["programs"]) == {"ucall_entry", "ucall_return", "tree_fork", "tree_fork_btf"}
    assert set(d["maps"]) == {"calls", "entry_ts", "latency", "tree", "ucalls.rodata"}
    ids = list(d["programs"].values())
    assert all(prog_exists(i) for i in ids)
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    deadline = time.monotonic() + 5
    while any(prog_exists(i) for i in ids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(prog_exists(i) for i in ids)
