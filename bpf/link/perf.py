"""perf_event_open(2) over ctypes, struct perf_event_attr, and its ioctls.

Only what attaching BPF programs needs: tracepoint, uprobe and software
sampling events. x86-64 syscall number; the attr layout is the uapi one.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os

__all__ = [
    "PERF_EVENT_IOC_DISABLE",
    "PERF_EVENT_IOC_ENABLE",
    "PERF_EVENT_IOC_SET_BPF",
    "PERF_FLAG_FD_CLOEXEC",
    "PERF_TYPE_SOFTWARE",
    "PERF_TYPE_TRACEPOINT",
    "PerfEventAttr",
    "disable",
    "enable",
    "perf_event_open",
    "set_bpf",
    "uprobe_pmu_type",
    "uprobe_retprobe_bit",
]

NR_PERF_EVENT_OPEN = 298  # x86-64

PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1
PERF_TYPE_TRACEPOINT = 2
PERF_COUNT_SW_CPU_CLOCK = 0
PERF_COUNT_SW_DUMMY = 9

PERF_FLAG_FD_NO_GROUP = 1 << 0
PERF_FLAG_FD_OUTPUT = 1 << 1
PERF_FLAG_PID_CGROUP = 1 << 2
PERF_FLAG_FD_CLOEXEC = 1 << 3

# _IO('$', 0), _IO('$', 1), _IOW('$', 8, __u32)
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_DISABLE = 0x2401
PERF_EVENT_IOC_SET_BPF = 0x40042408

UPROBE_PMU_DIR = "/sys/bus/event_source/devices/uprobe"

_u32, _u64, _s32, _u16 = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int32, ctypes.c_uint16


class PerfEventAttr(ctypes.Structure):
    """struct perf_event_attr (include/uapi/linux/perf_event.h, 136 bytes).

    Unions are flattened to their first member; the aliases below give the
    other names (sample_freq, config1 = uprobe_path, config2 = probe_offset).
    """

    _fields_ = [
        ("type", _u32),
        ("size", _u32),
        ("config", _u64),
        ("sample_period", _u64),  # union with sample_freq
        ("sample_type", _u64),
        ("read_format", _u64),
        # The flag word, bit by bit.
        ("disabled", _u64, 1),
        ("inherit", _u64, 1),
        ("pinned", _u64, 1),
        ("exclusive", _u64, 1),
        ("exclude_user", _u64, 1),
        ("exclude_kernel", _u64, 1),
        ("exclude_hv", _u64, 1),
        ("exclude_idle", _u64, 1),
        ("mmap", _u64, 1),
        ("comm", _u64, 1),
        ("freq", _u64, 1),
        ("inherit_stat", _u64, 1),
        ("enable_on_exec", _u64, 1),
        ("task", _u64, 1),
        ("watermark", _u64, 1),
        ("precise_ip", _u64, 2),
        ("mmap_data", _u64, 1),
        ("sample_id_all", _u64, 1),
        ("exclude_host", _u64, 1),
        ("exclude_guest", _u64, 1),
        ("exclude_callchain_kernel", _u64, 1),
        ("exclude_callchain_user", _u64, 1),
        ("mmap2", _u64, 1),
        ("comm_exec", _u64, 1),
        ("use_clockid", _u64, 1),
        ("context_switch", _u64, 1),
        ("write_backward", _u64, 1),
        ("namespaces", _u64, 1),
        ("ksymbol", _u64, 1),
        ("bpf_event", _u64, 1),
        ("aux_output", _u64, 1),
        ("cgroup", _u64, 1),
        ("text_poke", _u64, 1),
        ("build_id", _u64, 1),
        ("inherit_thread", _u64, 1),
        ("remove_on_exec", _u64, 1),
        ("sigtrap", _u64, 1),
        ("_reserved_1", _u64, 26),
        ("wakeup_events", _u32),  # union with wakeup_watermark
        ("bp_type", _u32),
        ("config1", _u64),  # union: bp_addr, kprobe_func, uprobe_path
        ("config2", _u64),  # union: bp_len, kprobe_addr, probe_offset
        ("branch_sample_type", _u64),
        ("sample_regs_user", _u64),
        ("sample_stack_user", _u32),
        ("clockid", _s32),
        ("sample_regs_intr", _u64),
        ("aux_watermark", _u32),
        ("sample_max_stack", _u16),
        ("_reserved_2", _u16),
        ("aux_sample_size", _u32),
        ("aux_action", _u32),
        ("sig_data", _u64),
        ("config3", _u64),
    ]

    @property
    def sample_freq(self) -> int:
        return self.sample_period

    @sample_freq.setter
    def sample_freq(self, v: int) -> None:
        self.sample_period = v

    @property
    def flags(self) -> int:
        """The whole flag word at offset 40."""
        return int.from_bytes(bytes(self)[40:48], "little")


assert ctypes.sizeof(PerfEventAttr) == 136
assert PerfEventAttr.wakeup_events.offset == 48 and PerfEventAttr.config1.offset == 56

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def _describe(attr: PerfEventAttr) -> str:
    return f"type={attr.type}, config={attr.config:#x}"


PARANOID = "/proc/sys/kernel/perf_event_paranoid"
# Debian's and Ubuntu's kernels add levels above upstream's 2, at which
# perf_event_open asks for CAP_SYS_ADMIN itself: CAP_PERFMON is not enough.
# Debian's is 3, Ubuntu's 4 (its 3 acts as upstream's 2): the kernel is asked
# (_may_open_perf_events) before a refusal is blamed on the level.
PARANOID_ADMIN_ONLY = 3


def perf_event_paranoid() -> int | None:
    """The sysctl kernel.perf_event_paranoid; None if unreadable."""
    try:
        with open(PARANOID) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def admin_only_level() -> int | None:
    """The paranoid level when it is one that asks for CAP_SYS_ADMIN; None otherwise."""
    level = perf_event_paranoid()
    return level if level is not None and level >= PARANOID_ADMIN_ONLY else None


def admin_only_message(level: int) -> str:
    """Why a holder of CAP_PERFMON is refused at such a level, and the way out."""
    return (
        f"kernel.perf_event_paranoid is {level}: at this level, which Debian's (3) and "
        "Ubuntu's (4) kernels add, only CAP_SYS_ADMIN may open perf events "
        "(CAP_PERFMON is not enough); an administrator sets it to 2, upstream's default"
    )


CAP_SYS_ADMIN = 21
STATUS = "/proc/self/status"


def _holds_cap_sys_admin() -> bool:
    try:
        with open(STATUS) as f:
            eff = next(line for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration):
        return False
    return bool(int(eff.split()[1], 16) >> CAP_SYS_ADMIN & 1)


def _may_open_perf_events() -> bool:
    """Whether the kernel opens this process a perf event at all: a dummy
    software event on itself, user space only, which every level up to 2
    allows. False only for a refusal (EACCES, EPERM)."""
    attr = PerfEventAttr(type=PERF_TYPE_SOFTWARE, config=PERF_COUNT_SW_DUMMY)
    attr.disabled = attr.exclude_kernel = attr.exclude_hv = 1
    fd = _open(attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC)  # not perf_event_open: its hint asks here
    if fd >= 0:
        os.close(fd)
    return fd >= 0 or -fd not in (errno.EACCES, errno.EPERM)


def refusing_level() -> int | None:
    """The paranoid level when it keeps this process from opening any perf
    event (a level above 2, no CAP_SYS_ADMIN, and the kernel says no); None
    otherwise."""
    level = admin_only_level()
    if level is None or _holds_cap_sys_admin() or _may_open_perf_events():
        return None
    return level


NOBODY = 65534


def _may_open_without_admin() -> bool | None:
    """_may_open_perf_events asked as the broker is (not root, no
    CAP_SYS_ADMIN), by a child that becomes nobody: a root shell's check of a
    policy must not answer with its own CAP_SYS_ADMIN. None when the child
    cannot drop to nobody (no CAP_SETUID)."""
    pid = os.fork()
    if pid == 0:  # the child: no Python cleanup, only its verdict
        code = 2
        try:
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)  # leaving uid 0 clears every capability
            code = 0 if not _holds_cap_sys_admin() and _may_open_perf_events() else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return None if code not in (0, 1) else code == 0


def refusing_level_for_broker() -> int | None:
    """The paranoid level when it keeps the broker (CAP_BPF and CAP_PERFMON,
    never CAP_SYS_ADMIN) from opening perf events, asked of the kernel even
    from root; None otherwise. Where the question cannot be put to a child,
    every level above 2 counts as refusing."""
    if not _holds_cap_sys_admin():
        return refusing_level()  # this process is asked as the broker would be
    level = admin_only_level()
    return None if level is None or _may_open_without_admin() else level


def perf_events_refused() -> str | None:
    """Why this process can open no perf event at all; None when it can."""
    level = refusing_level()
    return None if level is None else admin_only_message(level)


def _hint(err: int) -> str:
    if err in (errno.EACCES, errno.EPERM):
        level = refusing_level()
        if level is not None:
            return f" ({admin_only_message(level)})"
        return " (needs CAP_PERFMON or root, or a lower kernel.perf_event_paranoid)"
    if err == errno.ENOENT:
        return " (no such event on this kernel)"
    if err == errno.ENODEV:
        return " (the CPU is offline or the PMU does not exist)"
    if err == errno.E2BIG:
        return " (perf_event_attr larger than the kernel accepts)"
    if err == errno.EMFILE:
        return " (too many open files)"
    return ""


def _open(attr: PerfEventAttr, pid: int, cpu: int, group_fd: int, flags: int) -> int:
    """The system call: the fd, or -errno."""
    if attr.size == 0:
        attr.size = ctypes.sizeof(PerfEventAttr)
    fd = _syscall(
        ctypes.c_long(NR_PERF_EVENT_OPEN),
        ctypes.byref(attr),
        ctypes.c_int(pid),
        ctypes.c_int(cpu),
        ctypes.c_int(group_fd),
        ctypes.c_ulong(flags),
    )
    return int(fd) if fd >= 0 else -ctypes.get_errno()


def perf_event_open(
    attr: PerfEventAttr,
    pid: int,
    cpu: int,
    group_fd: int = -1,
    flags: int = PERF_FLAG_FD_CLOEXEC,
    *,
    name: str | None = None,
) -> int:
    """Open a perf event; returns its fd. `name` is used in error messages."""
    fd = _open(attr, pid, cpu, group_fd, flags)
    if fd < 0:
        err = -fd
        what = name or f"perf event ({_describe(attr)})"
        raise OSError(
            err,
            f"perf_event_open for {what} on pid {pid} cpu {cpu} failed: "
            f"{os.strerror(err)}{_hint(err)}",
        )
    return int(fd)


def _ioctl(fd: int, request: int, arg: int, what: str) -> None:
    try:
        fcntl.ioctl(fd, request, arg)
    except OSError as e:
        raise OSError(e.errno, f"{what} on perf event fd {fd} failed: {e.strerror}") from None


def enable(fd: int) -> None:
    _ioctl(fd, PERF_EVENT_IOC_ENABLE, 0, "PERF_EVENT_IOC_ENABLE")


def disable(fd: int) -> None:
    _ioctl(fd, PERF_EVENT_IOC_DISABLE, 0, "PERF_EVENT_IOC_DISABLE")


def set_bpf(fd: int, prog_fd: int) -> None:
    """Legacy attach (before BPF links for perf events, kernel < 5.15)."""
    _ioctl(fd, PERF_EVENT_IOC_SET_BPF, prog_fd, "PERF_EVENT_IOC_SET_BPF")


def _read_sysfs(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(256).strip()
    except FileNotFoundError:
        raise OSError(
            errno.ENOENT,
            f"{path} is missing: this kernel has no uprobe PMU (needs CONFIG_UPROBE_EVENTS)",
        ) from None


def uprobe_pmu_type(base: str = UPROBE_PMU_DIR) -> int:
    """The dynamic PMU type id perf_event_open takes for uprobes."""
    text = _read_sysfs(os.path.join(base, "type"))
    if not text.isdigit():
        raise OSError(errno.EINVAL, f"{base}/type holds {text!r}, not a PMU type")
    return int(text)


def uprobe_retprobe_bit(base: str = UPROBE_PMU_DIR) -> int:
    """Which config bit turns a uprobe into a uretprobe ("config:0" -> 0)."""
    text = _read_sysfs(os.path.join(base, "format", "retprobe"))
    prefix = "config:"
    bit = text[len(prefix) :] if text.startswith(prefix) else ""
    if not bit.isdigit() or int(bit) > 63:
        raise OSError(errno.EINVAL, f"{base}/format/retprobe holds {text!r}, not 'config:N'")
    return int(bit)
