"""tracefs on the running kernel: every live format parses; stored GPU formats
match the live ones where the events exist (dma_fence)."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest

from gfxbpf.bpf.link import tracefs

FORMATS = Path(__file__).resolve().parent.parent / "data" / "formats"


def test_tracefs_root_is_the_mounted_one() -> None:
    root = tracefs.tracefs_root()
    assert os.path.isdir(os.path.join(root, "events", "sched"))


def test_every_live_format_parses() -> None:
    root = tracefs.tracefs_root()
    paths = glob.glob(os.path.join(root, "events", "*", "*", "format"))
    assert len(paths) > 100
    for p in paths:
        with open(p) as f:
            fmt = tracefs.parse_format(f.read())
        assert fmt.name == os.path.basename(os.path.dirname(p))
        assert fmt.fields["common_type"].offset == 0
        assert fmt.fields["common_pid"].size == 4 and fmt.fields["common_pid"].is_common


def test_live_sched_process_exec() -> None:
    fmt = tracefs.read_format("sched", "sched_process_exec")
    assert fmt.id == tracefs.event_id("sched", "sched_process_exec")
    fn = fmt.fields["filename"]
    assert (fn.offset, fn.size, fn.is_data_loc) == (8, 4, True)
    assert list(fmt.event_fields) == ["filename", "pid", "old_pid"]
    assert tracefs.event_exists("syscalls", "sys_enter_getppid")
    assert "__syscall_nr" in tracefs.read_format("syscalls", "sys_enter_getppid").fields
    assert not tracefs.event_exists("i915", "i915_vma_bind")  # no GPU driver here


@pytest.mark.parametrize("event", ["dma_fence_emit", "dma_fence_signaled"])
def test_stored_dma_fence_matches_live(event: str) -> None:
    if not tracefs.event_exists("dma_fence", event):
        pytest.skip("kernel without dma_fence tracepoints")
    live = tracefs.read_format("dma_fence", event)
    stored = tracefs.parse_format((FORMATS / "dma_fence" / event).read_text())
    assert live.fields == stored.fields
    assert live.print_fmt == stored.print_fmt
