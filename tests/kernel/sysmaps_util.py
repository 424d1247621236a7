"""Test-only helpers for the sys/maps/ringbuf kernel tests.

A tiny BPF assembler (raw instruction bytes, labels), BPF_PROG_TEST_RUN and
BPF_MAP_GET_FD_BY_ID (commands gfxbpf itself does not wrap), and running a
function in a forked child that dropped to uid/gid 65534 (no capabilities).
"""

from __future__ import annotations

import ctypes
import os
import pickle
import select
import signal
import struct
import time
from collections.abc import Callable
from typing import Any

from gfxbpf.bpf.asm import SLOT

# Opcodes (include/uapi/linux/bpf.h: class | op | source).
MOV64_IMM = 0xB7
MOV64_REG = 0xBF
ADD64_IMM = 0x07
AND64_IMM = 0x57
RSH64_IMM = 0x77
LDX_DW = 0x79
LDX_W = 0x61
STX_DW = 0x7B
STX_W = 0x63
ST_W = 0x62
LD_IMM64 = 0x18
JEQ_IMM = 0x15
JNE_IMM = 0x55
JA = 0x05
CALL = 0x85
EXIT = 0x95

R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10 = range(11)

# Helper ids.
MAP_LOOKUP_ELEM = 1
GET_CURRENT_PID_TGID = 14
RINGBUF_OUTPUT = 130
RINGBUF_RESERVE = 131
RINGBUF_SUBMIT = 132
RINGBUF_DISCARD = 133
GET_ATTACH_COOKIE = 174

BPF_PROG_TEST_RUN = 10
BPF_MAP_GET_FD_BY_ID = 14
PROG_SOCKET_FILTER = 1
PROG_PERF_EVENT = 7
PROG_RAW_TRACEPOINT = 17


class Asm:
    """Instructions with forward labels: jumps name a label, resolved in bytes()."""

    def __init__(self) -> None:
        self.insns: list[tuple[int, int, int, int | str, int]] = []
        self.labels: dict[str, int] = {}

    def i(self, code: int, dst: int = 0, src: int = 0, off: int | str = 0, imm: int = 0) -> Asm:
        self.insns.append((code, dst, src, off, imm))
        return self

    def label(self, name: str) -> Asm:
        self.labels[name] = len(self.insns)
        return self

    def ld_map(self, dst: int, map_fd: int) -> Asm:
        """ld_imm64 dst = map (BPF_PSEUDO_MAP_FD)."""
        self.i(LD_IMM64, dst, 1, 0, map_fd)
        return self.i(0, 0, 0, 0, 0)

    def bytes(self) -> bytes:
        out = bytearray()
        for idx, (code, dst, src, off, imm) in enumerate(self.insns):
            if isinstance(off, str):
                off = self.labels[off] - idx - 1
            out += SLOT.pack(code, (src << 4) | dst, off, imm)
        return bytes(out)


def exit0(a: Asm) -> Asm:
    return a.i(MOV64_IMM, R0, imm=0).i(EXIT)


def counter_prologue(a: Asm, counter_fd: int) -> Asm:
    """r7 = ++counter[0] (ARRAY u32 -> u64); jumps to "out" if the lookup fails."""
    a.i(ST_W, R10, off=-36, imm=0)
    a.i(MOV64_REG, R2, R10).i(ADD64_IMM, R2, imm=-36)
    a.ld_map(R1, counter_fd)
    a.i(CALL, imm=MAP_LOOKUP_ELEM)
    a.i(JEQ_IMM, R0, off="out", imm=0)
    a.i(LDX_DW, R7, R0, 0).i(ADD64_IMM, R7, imm=1).i(STX_DW, R0, R7, 0)
    return a


def prog_seq_output(counter_fd: int, ringbuf_fd: int) -> bytes:
    """Each run outputs record n (n = 1, 2, ...): the first (n & 31) + 1 bytes
    of pack("<4Q", n, n + 1, n + 2, n + 3), so records are 16..40 bytes long.

    When the kernel refuses a record, counter[1] (if the counter map has a
    second slot) counts it, so a test can tell a record the kernel never
    accepted from one the reader lost."""
    a = counter_prologue(Asm(), counter_fd)
    a.i(STX_DW, R10, R7, -32)
    a.i(MOV64_REG, R1, R7)
    for off in (-24, -16, -8):
        a.i(ADD64_IMM, R1, imm=1).i(STX_DW, R10, R1, off)
    a.i(MOV64_REG, R3, R7).i(AND64_IMM, R3, imm=31).i(ADD64_IMM, R3, imm=1)
    a.ld_map(R1, ringbuf_fd)
    a.i(MOV64_REG, R2, R10).i(ADD64_IMM, R2, imm=-32)
    a.i(MOV64_IMM, R4, imm=0)
    a.i(CALL, imm=RINGBUF_OUTPUT)
    a.i(JEQ_IMM, R0, off="out", imm=0)
    a.i(ST_W, R10, off=-36, imm=1)
    a.i(MOV64_REG, R2, R10).i(ADD64_IMM, R2, imm=-36)
    a.ld_map(R1, counter_fd)
    a.i(CALL, imm=MAP_LOOKUP_ELEM)
    a.i(JEQ_IMM, R0, off="out", imm=0)
    a.i(LDX_DW, R1, R0, 0).i(ADD64_IMM, R1, imm=1).i(STX_DW, R0, R1, 0)
    a.label("out")
    return exit0(a).bytes()


def seq_record(n: int) -> bytes:
    return struct.pack("<4Q", n, n + 1, n + 2, n + 3)[: (n & 31) + 1]


def prog_reserve_discard_odd(counter_fd: int, ringbuf_fd: int) -> bytes:
    """Reserve 8 bytes, write n; submit when n is even, discard when odd."""
    a = counter_prologue(Asm(), counter_fd)
    a.ld_map(R1, ringbuf_fd)
    a.i(MOV64_IMM, R2, imm=8).i(MOV64_IMM, R3, imm=0)
    a.i(CALL, imm=RINGBUF_RESERVE)
    a.i(JEQ_IMM, R0, off="out", imm=0)
    a.i(STX_DW, R0, R7, 0)
    a.i(MOV64_REG, R1, R0).i(MOV64_IMM, R2, imm=0)
    a.i(MOV64_REG, R8, R7).i(AND64_IMM, R8, imm=1)
    a.i(JNE_IMM, R8, off="discard", imm=0)
    a.i(CALL, imm=RINGBUF_SUBMIT)
    a.i(JA, off="out")
    a.label("discard")
    a.i(CALL, imm=RINGBUF_DISCARD)
    a.label("out")
    return exit0(a).bytes()


def prog_sys_enter(ringbuf_fd: int, tgid: int, syscall_nr: int) -> bytes:
    """raw_tracepoint sys_enter: for syscall_nr from process tgid, output
    the 8-byte record pack("<II", tgid, syscall_nr)."""
    a = Asm()
    a.i(MOV64_REG, R6, R1)
    a.i(CALL, imm=GET_CURRENT_PID_TGID)
    a.i(RSH64_IMM, R0, imm=32)
    a.i(JNE_IMM, R0, off="out", imm=tgid)
    a.i(LDX_DW, R1, R6, 8)  # args[1]: the syscall number
    a.i(JNE_IMM, R1, off="out", imm=syscall_nr)
    a.i(STX_W, R10, R0, -8).i(STX_W, R10, R1, -4)
    a.ld_map(R1, ringbuf_fd)
    a.i(MOV64_REG, R2, R10).i(ADD64_IMM, R2, imm=-8)
    a.i(MOV64_IMM, R3, imm=8).i(MOV64_IMM, R4, imm=0)
    a.i(CALL, imm=RINGBUF_OUTPUT)
    a.label("out")
    return exit0(a).bytes()


# --- raw bpf(2) for commands gfxbpf does not wrap ---

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.syscall.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint]


def _bpf(cmd: int, attr: bytearray) -> int:
    buf = (ctypes.c_ubyte * 168).from_buffer(attr)
    ret = _libc.syscall(321, cmd, ctypes.addressof(buf), 168)
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf cmd {cmd}: {os.strerror(err)}")
    return ret


def prog_test_run(prog_fd: int, repeat: int = 1) -> int:
    """BPF_PROG_TEST_RUN on a socket filter with a 64-byte packet; returns retval."""
    data = ctypes.create_string_buffer(64)
    attr = bytearray(168)
    struct.pack_into("<IIII", attr, 0, prog_fd, 0, 64, 0)
    struct.pack_into("<Q", attr, 16, ctypes.addressof(data))
    struct.pack_into("<I", attr, 32, repeat)
    _bpf(BPF_PROG_TEST_RUN, attr)
    return struct.unpack_from("<I", attr, 4)[0]


def map_fd_by_id(map_id: int, open_flags: int) -> int:
    """A new fd for map map_id opened with open_flags (e.g. BPF_F_RDONLY)."""
    attr = bytearray(168)
    struct.pack_into("<III", attr, 0, map_id, 0, open_flags)
    return _bpf(BPF_MAP_GET_FD_BY_ID, attr)


# --- unprivileged child ---


def run_unprivileged(
    fn: Callable[..., Any], *args: Any, timeout: float = 30.0, uid: int = 65534
) -> Any:
    """Run fn(*args) in a forked child running as uid/gid `uid` with no
    capabilities; return its result (picklable), or raise AssertionError
    carrying the child's exception (type name, message, errno)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        status = 0
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            result: Any = ("ok", fn(*args))
        except BaseException as e:  # report everything to the parent
            result = ("err", type(e).__name__, str(e), getattr(e, "errno", None))
            status = 1
        try:
            data = pickle.dumps(result)
            view = memoryview(data)
            while view:
                view = view[os.write(w, view) :]
        finally:
            os._exit(status)
    os.close(w)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                raise AssertionError(f"unprivileged child timed out after {timeout}s")
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    result = pickle.loads(b"".join(chunks))
    if result[0] == "err":
        raise ChildError(*result[1:])
    return result[1]


class ChildError(AssertionError):
    def __init__(self, type_name: str, message: str, errno: int | None) -> None:
        super().__init__(f"child raised {type_name}: {message}")
        self.type_name = type_name
        self.message = message
        self.errno = errno
