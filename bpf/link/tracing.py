"""Attach the BTF-typed and kprobe program kinds: tp_btf, fentry/fexit, iter, kprobes.

Each returns an attach.Attachment that owns its fd, like attach.py's
functions (which cover tracepoints, raw tracepoints, uprobes and perf
sampling). Kprobes need the kernel's kprobe PMU: where CONFIG_KPROBES is off
the error says the kind is unavailable on this kernel, not that the program
is wrong.
"""

from __future__ import annotations

import ctypes
import errno
import os

from gfxbpf.bpf.consts import BPF_TRACE_ITER
from gfxbpf.bpf.link import bpflink, perf
from gfxbpf.bpf.link.attach import (
    AttachError,
    LinkAttachment,
    PerfEventAttachment,
    _attach_prog,
    _open_event,
)

KPROBE_PMU_DIR = "/sys/bus/event_source/devices/kprobe"
SYSCALL_PREFIX = "__x64_sys_"  # x86-64 syscall wrappers, as libbpf's ksyscall uses
MAX_ITER_OUTPUT = 64 << 20  # bounds what read_iter() collects from one run


def attach_btf_traced(prog_fd: int, description: str) -> LinkAttachment:
    """Attach a tp_btf, fentry or fexit program to the target named at load time."""
    try:
        fd = bpflink.raw_tracepoint_open(None, prog_fd)
    except OSError as e:
        raise AttachError(e.errno or errno.EINVAL, f"attaching {description}: {e}") from None
    return LinkAttachment(description, fd)


def attach_iter(prog_fd: int, description: str) -> LinkAttachment:
    """Create an iterator link for an iter/ program; read it with read_iter()."""
    try:
        fd = bpflink.link_create(prog_fd, 0, BPF_TRACE_ITER)
    except OSError as e:
        raise AttachError(e.errno or errno.EINVAL, f"attaching {description}: {e}") from None
    return LinkAttachment(description, fd)


def read_iter(link: LinkAttachment, limit: int = MAX_ITER_OUTPUT) -> bytes:
    """Run the iterator once: everything its program wrote with seq_printf/seq_write."""
    try:
        fd = bpflink.iter_create(link.fd)
    except OSError as e:
        raise AttachError(e.errno or errno.EINVAL, f"reading {link.description}: {e}") from None
    chunks: list[bytes] = []
    total = 0
    try:
        while total < limit:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)[:limit]


def kprobe_unavailable(kind: str) -> AttachError:
    return AttachError(
        errno.EOPNOTSUPP,
        f"{kind} attach is unavailable: this kernel has no kprobe PMU ({KPROBE_PMU_DIR} "
        "is missing; it was built without CONFIG_KPROBES). The program loads, but only "
        "a kernel with kprobes can run it; tracepoint, tp_btf or fentry programs need none",
    )


def attach_kprobe(
    prog_fd: int, function: str, retprobe: bool = False, offset: int = 0, cookie: int = 0
) -> PerfEventAttachment:
    """Attach a KPROBE program to a kernel function (kprobe, or kretprobe on return)."""
    kind = "kretprobe" if retprobe else "kprobe"
    if not function or "\0" in function:
        raise ValueError(f"invalid kernel function name {function!r}")
    try:
        pmu = perf.uprobe_pmu_type(KPROBE_PMU_DIR)  # same sysfs layout as the uprobe PMU
        bit = perf.uprobe_retprobe_bit(KPROBE_PMU_DIR) if retprobe else 0
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise kprobe_unavailable(kind) from None
        raise AttachError(e.errno or errno.EINVAL, str(e)) from None
    description = f"{kind} {function}" + (f"+{offset:#x}" if offset else "")
    name_buf = ctypes.create_string_buffer(function.encode())
    attr = perf.PerfEventAttr()
    attr.type = pmu
    attr.size = ctypes.sizeof(attr)
    attr.config = (1 << bit) if retprobe else 0
    attr.config1 = ctypes.addressof(name_buf)  # kprobe_func
    attr.config2 = offset  # probe_offset
    attr.sample_period = 1
    attr.wakeup_events = 1
    attr.disabled = 1
    att = PerfEventAttachment(description)
    att._keepalive = name_buf
    try:
        pfd = _open_event(attr, -1, 0, description)
        _attach_prog(att, prog_fd, pfd, cookie)
    except BaseException:
        att.close()
        raise
    return att


def attach_ksyscall(prog_fd: int, syscall: str, retprobe: bool = False) -> PerfEventAttachment:
    """ksyscall/kretsyscall: a kprobe on the syscall's x86-64 wrapper."""
    return attach_kprobe(prog_fd, SYSCALL_PREFIX + syscall, retprobe)
