"""bench/'s own BPF programs load, attach and count what they should.

bench/run compiles bench/bench.bpf.c at run time; this keeps it from rotting
between bench runs.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

from bench import ownprogs
from gfxbpf.bpf.ringbuf import RingBuffer
from tests.conftest import compile_bpf

ROOT = Path(__file__).resolve().parents[2]
NR_GETPPID = 110  # x86-64


def _object(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "bpf/programs/gfxbpf.h", tmp_path / "gfxbpf.h")
    return compile_bpf((ROOT / "bench/bench.bpf.c").read_text(), tmp_path, "bench")


def test_stream_program_records_every_syscall_of_one_process(kernel: None, tmp_path: Path) -> None:
    obj_path = _object(tmp_path)
    n = 1000
    with ownprogs.attached(
        obj_path, ["stream_sys_enter"], {"target_pid": os.getpid()}, 1 << 20
    ) as obj:
        for _ in range(n):
            os.getppid()
        with RingBuffer(obj.map("records").fileno()) as rb:
            records = rb.drain()
        written, lost = ownprogs.tally(obj)
    nrs = [struct.unpack("<QQ", r)[1] for r in records]
    assert nrs.count(NR_GETPPID) == n
    assert written >= len(records) and lost == 0


def test_empty_programs_attach_to_the_catalog_tracepoints(kernel: None, tmp_path: Path) -> None:
    names = ["empty_sys_enter", "empty_exec", "empty_clone", "empty_clone3"]
    with ownprogs.attached(_object(tmp_path), names) as obj:
        assert sorted(obj.programs) == sorted(names)
