"""bench/'s own BPF programs load, attach and count what they should.

bench/run loads the committed bench/bench.bpf.o (tools/build_bpf.py builds
it); this keeps it from rotting between bench runs.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from bench import ownprogs
from gfxbpf.bpf.ringbuf import RingBuffer

ROOT = Path(__file__).resolve().parents[2]
NR_GETPPID = 110  # x86-64


BENCH_OBJECT = ROOT / "bench/bench.bpf.o"


def test_stream_program_records_every_syscall_of_one_process(kernel: None) -> None:
    n = 1000
    with ownprogs.attached(
        BENCH_OBJECT, ["stream_sys_enter"], {"target_pid": os.getpid()}, 1 << 20
    ) as obj:
        for _ in range(n):
            os.getppid()
        with RingBuffer(obj.map("records").fileno()) as rb:
            records = rb.drain()
        written, lost = ownprogs.tally(obj)
    nrs = [struct.unpack("<QQ", r)[1] for r in records]
    assert nrs.count(NR_GETPPID) == n
    assert written >= len(records) and lost == 0


def test_empty_programs_attach_to_the_catalog_tracepoints(kernel: None) -> None:
    names = ["empty_sys_enter", "empty_exec", "empty_clone", "empty_clone3"]
    with ownprogs.attached(BENCH_OBJECT, names) as obj:
        assert sorted(obj.programs) == sorted(names)
