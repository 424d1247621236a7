"""Attach points against the real kernel.

Each test loads a tiny hand-assembled program that adds to slot 0 of an
ARRAY map, attaches it, makes an exact number of events happen, and checks
the count; then closes the attachment and checks the count stops.
"""

from __future__ import annotations

import errno
import gc
import os
import shutil
import struct
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.asm import SLOT
from gfxbpf.bpf.link import attach as attachmod
from gfxbpf.bpf.link import bpflink, perf
from gfxbpf.bpf.link.attach import (
    AttachError,
    attach_perf_event,
    attach_raw_tracepoint,
    attach_tracepoint,
    attach_uprobe,
)
from gfxbpf.bpf.link.tracefs import TracepointNotFound
from gfxbpf.bpf.symbols import resolve_symbol

PROG_KPROBE, PROG_TRACEPOINT, PROG_PERF_EVENT, PROG_RAW_TRACEPOINT = 2, 5, 7, 17
MAP_ARRAY = 2
NR_GETPPID = 110  # x86-64
HELPER_MAP_LOOKUP, HELPER_PID_TGID, HELPER_ATTACH_COOKIE = 1, 14, 174


# --- a tiny assembler: enough for the counting program ---


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return SLOT.pack(code, dst | (src << 4), off, imm)


def counter_prog(
    map_fd: int,
    tgid: int | None = None,
    ctx_u64_at: tuple[int, int] | None = None,
    add_cookie: bool = False,
) -> bytes:
    """Add 1 (or the attach cookie) to map[0] when the filters pass.

    tgid: count only this process. ctx_u64_at (offset, value): count only
    when the u64 at ctx+offset equals value (raw tracepoint args).
    """
    out: list[bytes | tuple[int, int, str]] = []  # (code, dst, label) = jump to "out"
    out.append(_insn(0xBF, 6, 1))  # r6 = ctx
    if tgid is not None:
        out.append(_insn(0x85, imm=HELPER_PID_TGID))
        out.append(_insn(0x77, 0, imm=32))  # r0 >>= 32
        out.append((0x55, 0, tgid))  # if r0 != tgid goto out
    if ctx_u64_at is not None:
        off, value = ctx_u64_at
        out.append(_insn(0x79, 2, 6, off))  # r2 = *(u64 *)(r6 + off)
        out.append((0x55, 2, value))
    if add_cookie:
        out.append(_insn(0xBF, 1, 6))  # r1 = ctx
        out.append(_insn(0x85, imm=HELPER_ATTACH_COOKIE))
        out.append(_insn(0xBF, 7, 0))  # r7 = cookie
    else:
        out.append(_insn(0xB7, 7, imm=1))  # r7 = 1
    out.append(_insn(0x62, 10, off=-4, imm=0))  # *(u32 *)(r10 - 4) = 0
    out.append(_insn(0xBF, 2, 10))
    out.append(_insn(0x07, 2, imm=-4))  # r2 = &key
    out.append(_insn(0x18, 1, 1, imm=map_fd))  # r1 = map (ld_imm64, BPF_PSEUDO_MAP_FD)
    out.append(_insn(0))
    out.append(_insn(0x85, imm=HELPER_MAP_LOOKUP))
    out.append((0x15, 0, 0))  # if r0 == 0 goto out
    out.append(_insn(0xDB, 0, 7))  # lock *(u64 *)(r0 + 0) += r7
    exit_at = len(out)
    out.append(_insn(0xB7, 0, imm=0))  # out: r0 = 0
    out.append(_insn(0x95))
    code = b""
    for i, ins in enumerate(out):
        if isinstance(ins, tuple):
            op, dst, imm = ins
            ins = _insn(op, dst, off=exit_at - i - 1, imm=imm)
        code += ins
    return code


@dataclass
class Counter:
    map_fd: int
    prog_fd: int

    def value(self) -> int:
        raw = bpfsys.map_lookup_elem(self.map_fd, b"\0\0\0\0", 8)
        assert raw is not None
        return struct.unpack("<Q", raw)[0]


@pytest.fixture
def make_counter() -> Iterator:
    fds: list[int] = []

    def make(prog_type: int, **kw: object) -> Counter:
        map_fd = bpfsys.map_create(MAP_ARRAY, 4, 8, 1, name="t_count")
        fds.append(map_fd)
        prog_fd = bpfsys.prog_load(prog_type, counter_prog(map_fd, **kw), "GPL", name="t_count")  # type: ignore[arg-type]
        fds.append(prog_fd)
        return Counter(map_fd, prog_fd)

    yield make
    for fd in fds:
        os.close(fd)


def _fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _getppid_n(n: int) -> None:
    for _ in range(n):
        os.getppid()


# --- tracepoints ---


def test_tracepoint_counts_exactly_and_detaches(make_counter) -> None:
    c = make_counter(PROG_TRACEPOINT, tgid=os.getpid())
    att = attach_tracepoint(c.prog_fd, "syscalls", "sys_enter_getppid")
    fds = att.fds()
    assert fds and all(_fd_open(fd) for fd in fds)
    assert att.link_fds, "a BPF link is expected on Linux 5.15+"
    _getppid_n(37)
    assert c.value() == 37
    att.close()
    assert att.closed and not any(_fd_open(fd) for fd in fds)
    _getppid_n(20)
    assert c.value() == 37
    att.close()  # idempotent
    assert "sys_enter_getppid" in repr(att)


def test_tracepoint_context_manager_and_gc(make_counter) -> None:
    c = make_counter(PROG_TRACEPOINT, tgid=os.getpid())
    with attach_tracepoint(c.prog_fd, "syscalls", "sys_enter_getppid") as att:
        _getppid_n(5)
    assert att.closed
    _getppid_n(5)
    assert c.value() == 5
    # A dropped attachment detaches instead of leaking an attached program.
    attach_tracepoint(c.prog_fd, "syscalls", "sys_enter_getppid")
    gc.collect()
    _getppid_n(5)
    assert c.value() == 5


def test_tracepoint_fires_on_every_cpu(make_counter) -> None:
    """One event opened on CPU 0 must see a task pinned to another CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    c = make_counter(PROG_TRACEPOINT, tgid=os.getpid())
    old = os.sched_getaffinity(0)
    try:
        with attach_tracepoint(c.prog_fd, "syscalls", "sys_enter_getppid"):
            expected = 0
            for cpu in cpus[:4]:
                os.sched_setaffinity(0, {cpu})
                assert os.sched_getaffinity(0) == {cpu}
                _getppid_n(11)
                expected += 11
                assert c.value() == expected, f"events on CPU {cpu} were missed"
    finally:
        os.sched_setaffinity(0, old)


def test_tracepoint_cookie(make_counter) -> None:
    c = make_counter(PROG_TRACEPOINT, tgid=os.getpid(), add_cookie=True)
    with attach_tracepoint(c.prog_fd, "syscalls", "sys_enter_getppid", cookie=1000):
        _getppid_n(3)
    assert c.value() == 3000


def test_missing_tracepoint_is_a_clear_error(make_counter) -> None:
    c = make_counter(PROG_TRACEPOINT)
    with pytest.raises(TracepointNotFound) as ei:
        attach_tracepoint(c.prog_fd, "i915", "i915_vma_bind")
    assert "tracepoint i915:i915_vma_bind does not exist on this kernel" in str(ei.value)
    with pytest.raises(ValueError, match="invalid tracepoint"):
        attach_tracepoint(c.prog_fd, "syscalls", "../../x")


def test_wrong_program_type_names_the_tracepoint(make_counter) -> None:
    c = make_counter(PROG_RAW_TRACEPOINT)
    with pytest.raises(AttachError) as ei:
        attach_tracepoint(c.prog_fd, "syscalls", "sys_enter_getppid")
    assert "tracepoint syscalls:sys_enter_getppid" in str(ei.value)
    assert ei.value.errno == errno.EINVAL


# --- raw tracepoints ---


def test_raw_tracepoint_counts_exactly(make_counter) -> None:
    # sys_enter(struct pt_regs *regs, long id): args[1] is the syscall number.
    c = make_counter(PROG_RAW_TRACEPOINT, tgid=os.getpid(), ctx_u64_at=(8, NR_GETPPID))
    att = attach_raw_tracepoint(c.prog_fd, "sys_enter")
    (fd,) = att.fds()
    _getppid_n(23)
    os.getpid()  # other syscalls are not counted
    assert c.value() == 23
    att.close()
    assert not _fd_open(fd)
    _getppid_n(5)
    assert c.value() == 23
    att.close()


def test_missing_raw_tracepoint(make_counter) -> None:
    c = make_counter(PROG_RAW_TRACEPOINT)
    with pytest.raises(AttachError, match="raw tracepoint no_such_tp does not exist"):
        attach_raw_tracepoint(c.prog_fd, "no_such_tp")
    with pytest.raises(ValueError):
        attach_raw_tracepoint(c.prog_fd, "sys/enter")


# --- uprobes ---

LIB_C = "__attribute__((noinline)) int demo_probe(int x) { return x * 2 + 1; }\n"
MAIN_C = r"""
#include <stdio.h>
#include <stdlib.h>
int demo_probe(int);
int main(int argc, char **argv) {
    int n = atoi(argv[1]);
    char buf[16];
    if (argc > 2 && !fgets(buf, sizeof buf, stdin)) return 2;  /* wait for "go" */
    long s = 0;
    for (int i = 0; i < n; i++) s += demo_probe(i);
    printf("%ld\n", s);
    return 0;
}
"""


@pytest.fixture(scope="module")
def uprobe_target(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the uprobe target")
    tmp = tmp_path_factory.mktemp("uprobe")
    (tmp / "lib.c").write_text(LIB_C)
    (tmp / "main.c").write_text(MAIN_C)
    lib = tmp / "libgfxprobe.so"
    exe = tmp / "prober"
    # A shifted link base: the uprobe needs the file offset, not the address.
    subprocess.run(
        ["gcc", "-O1", "-shared", "-fPIC", "-Wl,-Ttext-segment=0x10000", "-o", lib, tmp / "lib.c"],
        check=True,
    )
    subprocess.run(
        ["gcc", "-O1", "-o", exe, tmp / "main.c", f"-L{tmp}", "-lgfxprobe", f"-Wl,-rpath,{tmp}"],
        check=True,
    )
    return lib, exe


def _run(exe: Path, n: int) -> None:
    subprocess.run([exe, str(n)], check=True, capture_output=True)


@pytest.mark.parametrize("retprobe", [False, True])
def test_uprobe_counts_exactly(make_counter, uprobe_target, retprobe: bool) -> None:
    lib, exe = uprobe_target
    c = make_counter(PROG_KPROBE)
    att = attach_uprobe(c.prog_fd, lib, "demo_probe", retprobe=retprobe)
    assert ("uretprobe" if retprobe else "uprobe") in att.description
    _run(exe, 17)
    _run(exe, 4)
    assert c.value() == 21
    att.close()
    _run(exe, 9)
    assert c.value() == 21


def test_uprobe_by_offset_and_pid(make_counter, uprobe_target) -> None:
    lib, exe = uprobe_target
    c = make_counter(PROG_KPROBE)
    off = resolve_symbol(lib, "demo_probe")
    a = subprocess.Popen([exe, "7", "wait"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    b = subprocess.Popen([exe, "11", "wait"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        with attach_uprobe(c.prog_fd, lib, offset=off, pid=a.pid) as att:
            assert f"pid {a.pid}" in att.description
            for p in (a, b):
                p.communicate(b"go\n", timeout=30)
                assert p.returncode == 0
            assert c.value() == 7  # b's 11 calls were not counted
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_uprobe_errors(make_counter, uprobe_target, tmp_path: Path) -> None:
    lib, _ = uprobe_target
    c = make_counter(PROG_KPROBE)
    with pytest.raises(AttachError, match="not an existing regular file"):
        attach_uprobe(c.prog_fd, tmp_path / "nope.so", "demo_probe")
    with pytest.raises(ValueError, match="symbol or a file offset"):
        attach_uprobe(c.prog_fd, lib)
    with pytest.raises(ValueError, match="demo_prob not found.*demo_probe"):
        attach_uprobe(c.prog_fd, lib, "demo_prob")


# --- perf sampling ---


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_perf_event_sampling(make_counter) -> None:
    c = make_counter(PROG_PERF_EVENT)
    att = attach_perf_event(c.prog_fd, 99)
    ncpu = len(att.perf_fds)
    assert ncpu == len(attachmod.possible_cpu_list())
    _spin(0.5)
    n = c.value()
    # About 99 samples per busy CPU per second; bounded by every CPU for 2 s.
    assert 0 < n < 99 * 2 * ncpu
    att.close()
    time.sleep(0.05)  # a sample already in flight may land
    after = c.value()
    _spin(0.3)
    assert c.value() == after


def test_perf_event_skips_offline_cpus(make_counter, monkeypatch: pytest.MonkeyPatch) -> None:
    c = make_counter(PROG_PERF_EVENT)
    real = perf.perf_event_open

    def fake(attr, pid, cpu, *a, **kw):  # CPU 1 behaves as if offline
        if cpu == 1:
            raise OSError(errno.ENODEV, "offline")
        return real(attr, pid, cpu, *a, **kw)

    monkeypatch.setattr(perf, "perf_event_open", fake)
    with attach_perf_event(c.prog_fd, 99, cpus=[0, 1]) as att:
        assert len(att.perf_fds) == 1
    with pytest.raises(AttachError, match="no CPU could be opened"):
        attach_perf_event(c.prog_fd, 99, cpus=[1])
    with pytest.raises(ValueError, match="positive"):
        attach_perf_event(c.prog_fd, 0)


# --- the legacy ioctl path (kernels without perf-event links) ---


def test_fallback_to_ioctl_when_links_are_refused(
    make_counter, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(*a: object, **kw: object) -> int:
        raise bpfsys.BpfError(errno.EINVAL, "BPF_LINK_CREATE")

    monkeypatch.setattr(bpflink, "link_create", no_links)
    c = make_counter(PROG_TRACEPOINT, tgid=os.getpid())
    att = attach_tracepoint(c.prog_fd, "syscalls", "sys_enter_getppid")
    assert att.link_fds == [] and len(att.perf_fds) == 1
    _getppid_n(13)
    assert c.value() == 13
    att.close()
    _getppid_n(3)
    assert c.value() == 13
    with pytest.raises(AttachError, match="cookie needs BPF links"):
        attach_tracepoint(c.prog_fd, "syscalls", "sys_enter_getppid", cookie=5)
