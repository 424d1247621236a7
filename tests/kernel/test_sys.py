"""bpf(2) wrappers against the real kernel: program and BTF loading with
logs, object info, xlated code, stats, raw tracepoints and BPF links."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import time

import pytest

from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.consts import BPF_PERF_EVENT, MapType
from gfxbpf.bpf.link import bpflink
from tests.kernel.sysmaps_util import (
    ADD64_IMM,
    CALL,
    EXIT,
    GET_ATTACH_COOKIE,
    JEQ_IMM,
    MAP_LOOKUP_ELEM,
    MOV64_IMM,
    MOV64_REG,
    PROG_PERF_EVENT,
    PROG_SOCKET_FILTER,
    R0,
    R1,
    R2,
    R6,
    R10,
    ST_W,
    STX_DW,
    Asm,
    prog_seq_output,
    prog_test_run,
)

RET0 = Asm().i(MOV64_IMM, R0, imm=0).i(EXIT).bytes()
BAD = Asm().i(EXIT).bytes()  # reads r0 before anything set it


def test_bad_program_raises_with_verifier_log() -> None:
    with pytest.raises(bpfsys.BpfError) as ei:
        bpfsys.prog_load(PROG_SOCKET_FILTER, BAD, "GPL", name="t_bad")
    e = ei.value
    assert e.errno == errno.EACCES and e.command == "BPF_PROG_LOAD"
    assert e.log and "R0 !read_ok" in e.log
    assert "BPF_PROG_LOAD" in str(e) and "R0 !read_ok" in str(e) and "EACCES" in str(e)
    assert isinstance(e, OSError)


def test_log_buffer_grows_when_too_small(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bpfsys, "LOG_BUF_SIZE", 32)
    with pytest.raises(bpfsys.BpfError) as ei:
        bpfsys.prog_load(PROG_SOCKET_FILTER, BAD, "GPL")
    assert ei.value.errno == errno.EACCES  # the verifier's reason, not ENOSPC
    log = ei.value.log or ""
    assert "R0 !read_ok" in log and "processed 1 insns" in log and len(log) > 32


def test_prog_load_argument_checks() -> None:
    with pytest.raises(ValueError, match="multiple of 8"):
        bpfsys.prog_load(PROG_SOCKET_FILTER, b"\x95", "GPL")
    with pytest.raises(ValueError, match="letters, digits"):
        bpfsys.prog_load(PROG_SOCKET_FILTER, RET0, "GPL", name="no spaces")


def test_prog_info_xlated_and_stats() -> None:
    counter = bpfsys.map_create(MapType.ARRAY, 4, 8, 1, name="t_cnt")
    ring = bpfsys.map_create(MapType.RINGBUF, 0, 0, 1 << 16, name="t_rb")
    fds = [counter, ring]
    try:
        simple = bpfsys.prog_load(PROG_SOCKET_FILTER, RET0, "GPL", name="t_simple_long_name")
        fds.append(simple)
        info = bpfsys.prog_info(simple)
        assert info.name == "t_simple_long_n" and info.type == PROG_SOCKET_FILTER
        assert info.id > 0 and len(info.tag) == 8 and info.tag != bytes(8)
        assert info.xlated_prog_len == len(RET0) and info.map_ids == []
        assert bpfsys.prog_xlated(simple) == RET0

        prog = bpfsys.prog_load(PROG_SOCKET_FILTER, prog_seq_output(counter, ring), "GPL")
        fds.append(prog)
        info = bpfsys.prog_info(prog)
        want = {bpfsys.map_info(counter).id, bpfsys.map_info(ring).id}
        assert info.nr_map_ids == 2 and set(info.map_ids) == want
        xlated = bpfsys.prog_xlated(prog)
        assert len(xlated) == info.xlated_prog_len and len(xlated) % 8 == 0 and xlated

        stats = bpfsys.enable_stats()
        fds.append(stats)
        before = bpfsys.prog_info(prog).run_cnt
        prog_test_run(prog, repeat=10)
        after = bpfsys.prog_info(prog)
        assert after.run_cnt - before == 10 and after.run_time_ns > 0
        # bpf(2) fds are close-on-exec: map, program and stats fds alike.
        assert not any(os.get_inheritable(fd) for fd in fds)
    finally:
        for fd in fds:
            os.close(fd)


def _btf(bits: int) -> bytes:
    """BTF with one type: INT "int", 4 bytes, signed, `bits` bits."""
    strings = b"\0int\0"
    types = struct.pack("<III", 1, 1 << 24, 4) + struct.pack("<I", (1 << 24) | bits)
    hdr = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strings))
    return hdr + types + strings


def test_btf_load() -> None:
    fd = bpfsys.btf_load(_btf(32))
    assert not os.get_inheritable(fd)
    os.close(fd)
    with pytest.raises(bpfsys.BpfError) as ei:
        bpfsys.btf_load(_btf(64))  # 64 bits do not fit in 4 bytes
    assert ei.value.errno == errno.EINVAL and ei.value.command == "BPF_BTF_LOAD"
    assert ei.value.log  # the BTF verifier says why


# --- link_create with a bpf_cookie, through a software perf event ---


class _PerfAttr(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("rest", ctypes.c_uint8 * 48),
    ]


def _perf_cpu_clock_self() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    attr = _PerfAttr(type=1, size=72, config=0, sample_period=100_000)  # cpu-clock, 100 us
    fd = libc.syscall(298, ctypes.byref(attr), 0, -1, -1, 8)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"perf_event_open: {os.strerror(err)}")
    return fd


def test_link_create_passes_bpf_cookie() -> None:
    cookie = 0x1122334455667788
    out = bpfsys.map_create(MapType.ARRAY, 4, 8, 1, name="t_cookie")
    a = Asm()
    a.i(CALL, imm=GET_ATTACH_COOKIE).i(MOV64_REG, R6, R0)  # r1 = ctx on entry
    a.i(ST_W, R10, off=-4, imm=0).i(MOV64_REG, R2, R10).i(ADD64_IMM, R2, imm=-4)
    a.ld_map(R1, out).i(CALL, imm=MAP_LOOKUP_ELEM)
    a.i(JEQ_IMM, R0, off="out", imm=0).i(STX_DW, R0, R6, 0)
    a.label("out").i(MOV64_IMM, R0, imm=0).i(EXIT)
    prog = bpfsys.prog_load(PROG_PERF_EVENT, a.bytes(), "GPL", name="t_cookie")
    pfd = _perf_cpu_clock_self()
    try:
        link = bpflink.link_create(prog, pfd, BPF_PERF_EVENT, cookie=cookie)
        assert not os.get_inheritable(link)
        try:
            deadline = time.monotonic() + 5
            value = b""
            while time.monotonic() < deadline:  # burn CPU until a sample fires
                sum(range(100_000))
                value = bpfsys.map_lookup_elem(out, bytes(4), 8) or b""
                if value != bytes(8):
                    break
        finally:
            os.close(link)
        assert struct.unpack("<Q", value)[0] == cookie
    finally:
        for fd in (pfd, prog, out):
            os.close(fd)


def test_possible_cpus() -> None:
    # possible >= configured CPUs; the per-CPU map tests check it matches the kernel.
    assert bpfsys.possible_cpus() >= (os.cpu_count() or 1)
