"""The bpf(2) commands that make links: raw tracepoints (and BTF-typed
programs), BPF_LINK_CREATE (perf events, uprobe_multi), and iterators.
attach.py, tracing.py and usdt.py build on these; the fd returned is the
caller's."""

from __future__ import annotations

import ctypes
import os

from gfxbpf.bpf.consts import (
    BPF_F_UPROBE_MULTI_RETURN,
    BPF_ITER_CREATE,
    BPF_LINK_CREATE,
    BPF_RAW_TRACEPOINT_OPEN,
    BPF_TRACE_UPROBE_MULTI,
)
from gfxbpf.bpf.sysattr import BpfAttr, u64
from gfxbpf.bpf.syscall import check


def raw_tracepoint_open(name: str | None, prog_fd: int) -> int:
    """Attach a RAW_TRACEPOINT program to tracepoint name; returns the link fd.

    name None: a BTF-typed program (tp_btf, fentry, fexit) attaches to the
    target its attach_btf_id named at load."""
    name_buf = ctypes.create_string_buffer(name.encode()) if name is not None else None
    attr = BpfAttr()
    attr.raw_tracepoint.name = ctypes.addressof(name_buf) if name_buf is not None else 0
    attr.raw_tracepoint.prog_fd = prog_fd
    return check(BPF_RAW_TRACEPOINT_OPEN, attr)


def link_create(
    prog_fd: int, target_fd: int, attach_type: int, flags: int = 0, cookie: int = 0
) -> int:
    """BPF_LINK_CREATE; cookie is perf_event.bpf_cookie (BPF_PERF_EVENT links)."""
    attr = BpfAttr()
    a = attr.link_create
    a.prog_fd = prog_fd
    a.target_fd = target_fd
    a.attach_type = attach_type
    a.flags = flags
    a.bpf_cookie = cookie
    return check(BPF_LINK_CREATE, attr)


def iter_create(link_fd: int) -> int:
    """BPF_ITER_CREATE: an fd whose read() runs an iterator link's program."""
    attr = BpfAttr()
    attr.iter_create.link_fd = link_fd
    return check(BPF_ITER_CREATE, attr)


def link_create_uprobe_multi(
    prog_fd: int,
    path: str,
    offsets: list[int],
    cookies: list[int] | None = None,
    pid: int = 0,
    retprobe: bool = False,
    ref_ctr_offsets: list[int] | None = None,
) -> int:
    """BPF_LINK_CREATE of a uprobe_multi link (Linux >= 6.6): one link, many probes.

    Unlike the uprobe perf PMU (CAP_SYS_ADMIN on 6.18), this needs only
    CAP_BPF + CAP_PERFMON. The program must be loaded with
    expected_attach_type BPF_TRACE_UPROBE_MULTI. pid 0 probes every process.
    """
    n = len(offsets)
    if not n or any(x is not None and len(x) != n for x in (cookies, ref_ctr_offsets)):
        raise ValueError("uprobe_multi needs offsets, and one cookie (ref_ctr) per offset if any")
    path_buf = ctypes.create_string_buffer(os.fsencode(path))
    offs = (u64 * n)(*offsets)
    cks = (u64 * n)(*cookies) if cookies is not None else None
    refs = (u64 * n)(*ref_ctr_offsets) if ref_ctr_offsets is not None else None  # semaphores
    attr = BpfAttr()
    a = attr.link_create_uprobe_multi
    a.prog_fd = prog_fd
    a.attach_type = BPF_TRACE_UPROBE_MULTI
    a.path = ctypes.addressof(path_buf)
    a.offsets = ctypes.addressof(offs)
    a.cookies = ctypes.addressof(cks) if cks is not None else 0
    a.ref_ctr_offsets = ctypes.addressof(refs) if refs is not None else 0
    a.cnt = n
    a.um_flags = BPF_F_UPROBE_MULTI_RETURN if retprobe else 0
    a.pid = max(pid, 0)
    return check(BPF_LINK_CREATE, attr)
