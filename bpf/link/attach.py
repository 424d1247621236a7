"""Attach loaded programs: tracepoints, raw tracepoints, uprobes, perf sampling.

Every attach_* returns an Attachment that owns its fds: close() detaches
(disable, then close link and perf fds), may be called twice, and runs on
`with` exit and on garbage collection, so a dropped attachment never leaves
a program attached.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Iterable

from gfxbpf.bpf.consts import BPF_PERF_EVENT
from gfxbpf.bpf.errors import KernelError
from gfxbpf.bpf.link import bpflink, perf, tracefs
from gfxbpf.bpf.symbols import resolve_symbol, resolve_symbols

__all__ = [
    "AttachError",
    "Attachment",
    "PerfEventAttachment",
    "RawTracepointAttachment",
    "attach_perf_event",
    "attach_raw_tracepoint",
    "attach_tracepoint",
    "attach_uprobe",
    "attach_uprobe_multi",
    "LinkAttachment",
    "possible_cpu_list",
]


class AttachError(OSError, KernelError):
    """Attaching failed; str() names the attach point and the kernel's reason."""


class Attachment:
    """Base: owns fds, detaches on close()."""

    def __init__(self, description: str) -> None:
        self.description = description
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def fds(self) -> list[int]:
        """The open fds (perf events and links) this attachment owns."""
        return []

    def _detach(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._detach()

    def __enter__(self) -> Attachment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else "attached"
        return f"<{type(self).__name__} {self.description} ({state})>"


def _close_quietly(fd: int | None) -> None:
    if fd is not None and fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


class PerfEventAttachment(Attachment):
    """One or more perf events (one per CPU for sampling), each with the program."""

    def __init__(self, description: str) -> None:
        super().__init__(description)
        # (perf fd, link fd or None when attached with the legacy ioctl)
        self._events: list[tuple[int, int | None]] = []
        self._keepalive: object = None  # e.g. the uprobe path buffer

    def fds(self) -> list[int]:
        out: list[int] = []
        for pfd, lfd in self._events:
            out.append(pfd)
            if lfd is not None:
                out.append(lfd)
        return out

    @property
    def link_fds(self) -> list[int]:
        return [lfd for _, lfd in self._events if lfd is not None]

    @property
    def perf_fds(self) -> list[int]:
        return [pfd for pfd, _ in self._events]

    def _detach(self) -> None:
        events, self._events = self._events, []
        for pfd, lfd in events:
            try:
                perf.disable(pfd)
            except OSError:
                pass
            _close_quietly(lfd)
            _close_quietly(pfd)


class LinkAttachment(Attachment):
    """One fd (a BPF link or raw tracepoint): closing it detaches."""

    def __init__(self, description: str, fd: int) -> None:
        super().__init__(description)
        self.fd = fd

    def fds(self) -> list[int]:
        return [] if self._closed else [self.fd]

    def _detach(self) -> None:
        fd, self.fd = self.fd, -1
        _close_quietly(fd)


class RawTracepointAttachment(LinkAttachment):
    pass


def _attach_prog(att: PerfEventAttachment, prog_fd: int, perf_fd: int, cookie: int) -> None:
    """Put the program on an open perf event (owned by att from here on), then enable it."""
    link_fd: int | None = None
    try:
        try:
            link_fd = bpflink.link_create(prog_fd, perf_fd, BPF_PERF_EVENT, cookie=cookie)
        except OSError as e:
            # Kernels before 5.15 have no perf-event links: use the ioctl.
            if e.errno != errno.EINVAL:
                raise
            if cookie:
                raise AttachError(
                    e.errno,
                    f"attaching to {att.description}: a BPF cookie needs BPF links for "
                    f"perf events (Linux 5.15+), and this kernel refused one: {e}",
                ) from None
            perf.set_bpf(perf_fd, prog_fd)
    except AttachError:
        _close_quietly(perf_fd)
        raise
    except OSError as e:
        _close_quietly(perf_fd)
        raise AttachError(
            e.errno or errno.EINVAL,
            f"attaching program fd {prog_fd} to {att.description} failed: {e}",
        ) from None
    att._events.append((perf_fd, link_fd))
    perf.enable(perf_fd)


def _open_event(attr: perf.PerfEventAttr, pid: int, cpu: int, description: str) -> int:
    try:
        return perf.perf_event_open(attr, pid, cpu, name=description)
    except OSError as e:
        raise AttachError(e.errno or errno.EINVAL, str(e.strerror)) from None


def attach_tracepoint(
    prog_fd: int, category: str, event: str, cookie: int = 0
) -> PerfEventAttachment:
    """Attach a TRACEPOINT program to category:event.

    One perf event on CPU 0 with pid -1 is enough: the program hangs off the
    tracepoint itself and runs on every CPU (tests/kernel/test_attach.py
    checks this with a task pinned to another CPU).
    """
    tracefs.validate_name("category", category)
    tracefs.validate_name("event", event)
    description = f"tracepoint {category}:{event}"
    ev_id = tracefs.event_id(category, event)  # TracepointNotFound names the event
    attr = perf.PerfEventAttr()
    attr.type = perf.PERF_TYPE_TRACEPOINT
    attr.size = ctypes.sizeof(attr)
    attr.config = ev_id
    attr.sample_period = 1
    attr.wakeup_events = 1
    attr.disabled = 1
    att = PerfEventAttachment(description)
    try:
        pfd = _open_event(attr, -1, 0, description)
        _attach_prog(att, prog_fd, pfd, cookie)
    except BaseException:
        att.close()
        raise
    return att


def attach_raw_tracepoint(prog_fd: int, name: str) -> RawTracepointAttachment:
    """Attach a RAW_TRACEPOINT program to the kernel tracepoint `name` (e.g. sys_enter)."""
    tracefs.validate_name("name", name)
    description = f"raw tracepoint {name}"
    try:
        fd = bpflink.raw_tracepoint_open(name, prog_fd)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise AttachError(
                errno.ENOENT, f"raw tracepoint {name} does not exist on this kernel"
            ) from None
        raise AttachError(
            e.errno or errno.EINVAL, f"attaching program fd {prog_fd} to {description}: {e}"
        ) from None
    return RawTracepointAttachment(description, fd)


def attach_uprobe(
    prog_fd: int,
    path: str | os.PathLike[str],
    symbol: str | None = None,
    offset: int | None = None,
    pid: int = -1,
    retprobe: bool = False,
    cookie: int = 0,
    ref_ctr_offset: int = 0,
) -> PerfEventAttachment:
    """Attach a KPROBE-type program to a uprobe (or uretprobe) in an ELF file.

    The probe point is `symbol` (plus `offset` bytes, if both are given) or a
    raw file `offset`. pid -1 probes every process that maps the file; a pid
    probes only that process. ref_ctr_offset: a USDT semaphore's file offset.
    """
    spath = os.path.abspath(os.fspath(path))
    if "\0" in spath:
        raise ValueError(f"invalid path {spath!r}")
    if not os.path.isfile(spath):
        raise AttachError(errno.ENOENT, f"uprobe target {spath} is not an existing regular file")
    if symbol is None and offset is None:
        raise ValueError("attach_uprobe needs a symbol or a file offset")
    if offset is not None and offset < 0:
        raise ValueError(f"uprobe offset must be >= 0, got {offset}")
    if pid < -1:
        raise ValueError(f"pid must be -1 (all processes) or a process id, got {pid}")
    file_off = (resolve_symbol(spath, symbol) if symbol else 0) + (offset or 0)
    kind = "uretprobe" if retprobe else "uprobe"
    where = symbol if symbol else f"{file_off:#x}"
    if symbol and offset:
        where = f"{symbol}+{offset:#x}"
    description = f"{kind} {spath}:{where}" + (f" pid {pid}" if pid != -1 else "")

    path_buf = ctypes.create_string_buffer(spath.encode())
    attr = perf.PerfEventAttr()
    try:
        attr.type = perf.uprobe_pmu_type()
        if retprobe:
            attr.config = 1 << perf.uprobe_retprobe_bit()
        attr.config |= ref_ctr_offset << 32
    except OSError as e:
        raise AttachError(e.errno or errno.ENOENT, str(e.strerror)) from None
    attr.size = ctypes.sizeof(attr)
    attr.config1 = ctypes.addressof(path_buf)  # uprobe_path
    attr.config2 = file_off  # probe_offset
    attr.sample_period = 1
    attr.wakeup_events = 1
    attr.disabled = 1
    att = PerfEventAttachment(description)
    att._keepalive = path_buf
    cpu = 0 if pid == -1 else -1
    try:
        pfd = _open_event(attr, pid, cpu, description)
        _attach_prog(att, prog_fd, pfd, cookie)
    except BaseException:
        att.close()
        raise
    return att


def attach_uprobe_multi(
    prog_fd: int,
    path: str | os.PathLike[str],
    symbols: Iterable[str],
    pid: int = -1,
    retprobe: bool = False,
    cookies: Iterable[int] | None = None,
) -> LinkAttachment:
    """Attach one program to uprobes (or uretprobes) on several functions at once.

    A uprobe_multi BPF link needs only CAP_BPF + CAP_PERFMON, where the uprobe
    perf PMU wants CAP_SYS_ADMIN on recent kernels. The program must have been
    loaded with expected_attach_type BPF_TRACE_UPROBE_MULTI. Each function's
    cookie (default: its index) is what bpf_get_attach_cookie() returns.
    pid -1 probes every process that maps the file.
    """
    spath = os.fspath(path)
    if "\0" in spath:
        raise ValueError(f"invalid path {spath!r}")
    names = list(symbols)
    if not names:
        raise ValueError("attach_uprobe_multi needs at least one function")
    if pid < -1:
        raise ValueError(f"pid must be -1 (all processes) or a process id, got {pid}")
    offsets = resolve_symbols(spath, names)
    cks = list(cookies) if cookies is not None else list(range(len(names)))
    kind = "uretprobe" if retprobe else "uprobe"
    description = f"{kind} {spath}:{','.join(names)}" + (f" pid {pid}" if pid != -1 else "")
    try:
        fd = bpflink.link_create_uprobe_multi(prog_fd, spath, offsets, cks, pid, retprobe)
    except OSError as e:
        raise AttachError(e.errno or errno.EINVAL, f"attaching {description}: {e}") from None
    return LinkAttachment(description, fd)


def possible_cpu_list(path: str = "/sys/devices/system/cpu/possible") -> list[int]:
    """CPU numbers from a list such as "0-3,8-11"."""
    with open(path, encoding="ascii") as f:
        text = f.read(4096).strip()
    cpus: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"cannot parse CPU list {text!r} in {path}")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first or last > 65535:
            raise ValueError(f"bad CPU range {part!r} in {path}")
        cpus.extend(range(first, last + 1))
    if not cpus:
        raise ValueError(f"empty CPU list in {path}")
    return cpus


def attach_perf_event(
    prog_fd: int, frequency: int, cpus: Iterable[int] | None = None
) -> PerfEventAttachment:
    """Attach a PERF_EVENT program to CPU-clock sampling at `frequency` Hz on each CPU.

    CPUs that are possible but not present/online (ENODEV) are skipped.
    """
    if not isinstance(frequency, int) or frequency <= 0:
        raise ValueError(f"sampling frequency must be a positive integer (Hz), got {frequency!r}")
    cpu_list = list(cpus) if cpus is not None else possible_cpu_list()
    description = f"perf cpu-clock sampling at {frequency} Hz"
    att = PerfEventAttachment(description)
    skipped: list[int] = []
    try:
        for cpu in cpu_list:
            attr = perf.PerfEventAttr()
            attr.type = perf.PERF_TYPE_SOFTWARE
            attr.size = ctypes.sizeof(attr)
            attr.config = perf.PERF_COUNT_SW_CPU_CLOCK
            attr.sample_freq = frequency
            attr.freq = 1
            attr.disabled = 1
            try:
                pfd = perf.perf_event_open(attr, -1, cpu, name=f"{description} on cpu {cpu}")
            except OSError as e:
                if e.errno == errno.ENODEV:
                    skipped.append(cpu)
                    continue
                hint = ""
                if e.errno == errno.EINVAL:
                    hint = " (frequency above kernel.perf_event_max_sample_rate, or no such CPU)"
                raise AttachError(e.errno or errno.EINVAL, f"{e.strerror}{hint}") from None
            _attach_prog(att, prog_fd, pfd, 0)
        if not att._events:
            raise AttachError(
                errno.ENODEV, f"{description}: no CPU could be opened (tried {cpu_list})"
            )
    except BaseException:
        att.close()
        raise
    return att
