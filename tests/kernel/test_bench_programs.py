"""bench/'s own BPF programs load, attach and count what they should.

bench/run loads the committed bench/bench.bpf.o (tools/build_bpf.py builds
it); this keeps it from rotting between bench runs.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from bench import ownprogs
from gfxbpf.bpf.ringbuf import RingBuffer

ROOT = Path(__file__).resolve().parents[2]
NR_GETPPID = 110  # x86-64


BENCH_OBJECT = ROOT / "bench/bench.bpf.o"


@pytest.mark.parametrize("wake_each", [0, 1])
def test_stream_program_records_every_syscall_of_one_process(kernel: None, wake_each: int) -> None:
    n = 1000
    knobs = {"target_pid": os.getpid(), "wake_each": wake_each}
    with ownprogs.attached(BENCH_OBJECT, ["stream_sys_enter"], knobs, 1 << 20) as obj:
        for _ in range(n):
            os.getppid()
        with RingBuffer(obj.map("records").fileno()) as rb:
            runs = rb.read_runs()  # as bench/clientside.py's reader takes them
        written, lost = ownprogs.tally(obj)
    nrs = [nr for run in runs for (_, nr) in run.unpack(struct.Struct("=QQ"))]
    assert nrs.count(NR_GETPPID) == n
    assert written >= len(nrs) and lost == 0  # the reader's own calls come after
    assert max(run.n for run in runs) > 1  # one record size: they came as runs


def test_empty_programs_attach_to_the_catalog_tracepoints(kernel: None) -> None:
    names = ["empty_sys_enter", "empty_exec", "empty_clone", "empty_clone3"]
    with ownprogs.attached(BENCH_OBJECT, names) as obj:
        assert sorted(obj.programs) == sorted(names)
