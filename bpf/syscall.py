"""bpf(2) over ctypes: one small wrapper per command gfxbpf uses.

Every call passes a zeroed ``union bpf_attr`` of ATTR_SIZE bytes; the kernel
requires the bytes past the fields a command uses to be zero. Layouts and
numbers: include/uapi/linux/bpf.h, x86-64 (docs/BPF-ABI.md). File descriptors are plain
ints; the caller owns them (os.close). bpf(2) fds are close-on-exec.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import os
import re
from collections.abc import Callable, Iterable
from functools import cache
from typing import NamedTuple

from gfxbpf.bpf.consts import (
    BPF_ANY,
    BPF_BTF_GET_FD_BY_ID,
    BPF_BTF_GET_NEXT_ID,
    BPF_BTF_LOAD,
    BPF_ENABLE_STATS,
    BPF_ITER_CREATE,
    BPF_LINK_CREATE,
    BPF_MAP_CREATE,
    BPF_MAP_DELETE_ELEM,
    BPF_MAP_FREEZE,
    BPF_MAP_GET_NEXT_KEY,
    BPF_MAP_LOOKUP_BATCH,
    BPF_MAP_LOOKUP_ELEM,
    BPF_MAP_UPDATE_ELEM,
    BPF_OBJ_GET_INFO_BY_FD,
    BPF_OBJ_NAME_LEN,
    BPF_PROG_BIND_MAP,
    BPF_PROG_LOAD,
    BPF_RAW_TRACEPOINT_OPEN,
    BPF_STATS_RUN_TIME,
)
from gfxbpf.bpf.errors import KernelError
from gfxbpf.bpf.sysattr import (
    BpfAttr,
    BpfBtfInfo,
    BpfMapInfo,
    BpfProgInfo,
    u32,
)

SYS_BPF = 321  # x86-64

COMMAND_NAMES = {
    BPF_MAP_CREATE: "BPF_MAP_CREATE",
    BPF_MAP_LOOKUP_ELEM: "BPF_MAP_LOOKUP_ELEM",
    BPF_MAP_UPDATE_ELEM: "BPF_MAP_UPDATE_ELEM",
    BPF_MAP_DELETE_ELEM: "BPF_MAP_DELETE_ELEM",
    BPF_MAP_GET_NEXT_KEY: "BPF_MAP_GET_NEXT_KEY",
    BPF_PROG_LOAD: "BPF_PROG_LOAD",
    BPF_OBJ_GET_INFO_BY_FD: "BPF_OBJ_GET_INFO_BY_FD",
    BPF_RAW_TRACEPOINT_OPEN: "BPF_RAW_TRACEPOINT_OPEN",
    BPF_BTF_LOAD: "BPF_BTF_LOAD",
    BPF_MAP_FREEZE: "BPF_MAP_FREEZE",
    BPF_MAP_LOOKUP_BATCH: "BPF_MAP_LOOKUP_BATCH",
    BPF_LINK_CREATE: "BPF_LINK_CREATE",
    BPF_ENABLE_STATS: "BPF_ENABLE_STATS",
    BPF_ITER_CREATE: "BPF_ITER_CREATE",
    BPF_BTF_GET_FD_BY_ID: "BPF_BTF_GET_FD_BY_ID",
    BPF_BTF_GET_NEXT_ID: "BPF_BTF_GET_NEXT_ID",
    BPF_PROG_BIND_MAP: "BPF_PROG_BIND_MAP",
}

# The kernel-internal "not supported" errno that bpf(2) leaks to user space.
ENOTSUPP = 524

LOG_BUF_SIZE = 16 << 20  # first verifier-log buffer
LOG_BUF_MAX = 1 << 30  # the kernel refuses log_size above UINT_MAX >> 2

_NAME_RE = re.compile(r"[A-Za-z0-9_.]*")

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_syscall.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint]

# --- errors and the raw call ---


class BpfError(OSError, KernelError):
    """A failed bpf(2) command: .errno, .command (e.g. "BPF_PROG_LOAD"), .log."""

    def __init__(self, err: int, command: str, log: str | None = None, hint: str = "") -> None:
        super().__init__(err, _strerror(err))
        self.command = command
        self.log = log
        self.hint = hint

    def __str__(self) -> str:
        code = self.errno if self.errno is not None else -1  # always set by __init__
        name = _errno.errorcode.get(code, "ENOTSUPP" if code == ENOTSUPP else "?")
        text = f"{self.command} failed: [{name} {self.errno}] {self.strerror}"
        if self.hint:
            text += f" ({self.hint})"
        if self.log:
            text += "\nlog:\n" + self.log.rstrip("\n")
        elif self.log is not None:
            text += " (the kernel wrote no log)"
        return text


def _strerror(err: int) -> str:
    if err == ENOTSUPP:
        return "Operation not supported by this map or program type"
    return os.strerror(err)


def _hint(err: int) -> str:
    if err == _errno.EPERM:
        return (
            "needs CAP_BPF (CAP_PERFMON for tracing), or the fd is read-only, "
            "or kernel.unprivileged_bpf_disabled blocks this command"
        )
    return ""


def _call(cmd: int, attr: BpfAttr) -> int:
    """bpf(cmd, &attr, sizeof attr); returns the result or -errno."""
    ret = _syscall(SYS_BPF, cmd, ctypes.addressof(attr), ctypes.sizeof(attr))
    if ret < 0:
        return -ctypes.get_errno()
    return ret


def check(cmd: int, attr: BpfAttr, log: str | None = None) -> int:
    ret = _call(cmd, attr)
    if ret < 0:
        raise BpfError(-ret, COMMAND_NAMES.get(cmd, f"bpf cmd {cmd}"), log, _hint(-ret))
    return ret


def _obj_name(name: str, what: str) -> bytes:
    """Object names: [A-Za-z0-9_.], truncated to 15 characters (BPF_OBJ_NAME_LEN - 1)."""
    if not _NAME_RE.fullmatch(name):
        raise ValueError(
            f"invalid {what} name {name!r}: the kernel accepts only letters, digits, '_' and '.'"
        )
    return name[: BPF_OBJ_NAME_LEN - 1].encode("ascii")


def _ptr(buf: ctypes.Array | None) -> int:
    return 0 if buf is None else ctypes.addressof(buf)


def _in_buf(data: bytes) -> ctypes.Array:
    """A C copy of data that stays alive as long as the caller holds it."""
    return ctypes.create_string_buffer(bytes(data), len(data))


# --- maps ---


def map_create(
    map_type: int,
    key_size: int,
    value_size: int,
    max_entries: int,
    flags: int = 0,
    name: str = "",
    btf_fd: int = 0,
    btf_key_type_id: int = 0,
    btf_value_type_id: int = 0,
    map_extra: int = 0,
    numa_node: int = 0,
    inner_map_fd: int = 0,
) -> int:
    """Create a map; returns its fd. inner_map_fd: map-in-map's template of its values."""
    attr = BpfAttr()
    a = attr.map_create
    a.map_type = map_type
    a.key_size = key_size
    a.value_size = value_size
    a.max_entries = max_entries
    a.map_flags = flags
    a.numa_node = numa_node
    a.map_name = _obj_name(name, "map")
    a.btf_fd = btf_fd
    a.btf_key_type_id = btf_key_type_id
    a.btf_value_type_id = btf_value_type_id
    a.map_extra = map_extra
    a.inner_map_fd = inner_map_fd
    return check(BPF_MAP_CREATE, attr)


def map_lookup_elem(fd: int, key: bytes, value_size: int) -> bytes | None:
    """The value stored under key, or None if there is none.

    value_size is the whole buffer: for per-CPU maps round_up(value_size, 8)
    times possible_cpus().
    """
    kbuf = _in_buf(key)
    vbuf = ctypes.create_string_buffer(value_size)
    attr = BpfAttr()
    attr.elem.map_fd = fd
    attr.elem.key = ctypes.addressof(kbuf)
    attr.elem.value = ctypes.addressof(vbuf)
    ret = _call(BPF_MAP_LOOKUP_ELEM, attr)
    if ret == -_errno.ENOENT:
        return None
    if ret < 0:
        raise BpfError(-ret, "BPF_MAP_LOOKUP_ELEM", hint=_hint(-ret))
    return vbuf.raw


def map_lookup_elems(
    fd: int, keys: Iterable[bytes], key_size: int, value_size: int
) -> list[tuple[bytes, bytes]]:
    """(key, value) of each key present, one lookup each (maps without batch
    ops, e.g. a stack table): one attr and one pair of buffers for all of them,
    which is most of the cost of a lookup from Python."""
    kbuf = ctypes.create_string_buffer(key_size)
    vbuf = ctypes.create_string_buffer(value_size)
    attr = BpfAttr()
    attr.elem.map_fd = fd
    attr.elem.key = ctypes.addressof(kbuf)
    attr.elem.value = ctypes.addressof(vbuf)
    size = ctypes.sizeof(attr)
    out = []
    for key in keys:
        if len(key) != key_size:
            raise ValueError(f"key of {len(key)} bytes for a map with {key_size}-byte keys")
        kbuf.raw = key
        ret = _syscall(SYS_BPF, BPF_MAP_LOOKUP_ELEM, ctypes.addressof(attr), size)
        if ret >= 0:
            out.append((key, vbuf.raw))
            continue
        err = ctypes.get_errno()
        if err != _errno.ENOENT:
            raise BpfError(err, "BPF_MAP_LOOKUP_ELEM", hint=_hint(err))
    return out


def map_update_elem(fd: int, key: bytes, value: bytes, flags: int = BPF_ANY) -> None:
    kbuf = _in_buf(key)
    vbuf = _in_buf(value)
    attr = BpfAttr()
    attr.elem.map_fd = fd
    attr.elem.key = ctypes.addressof(kbuf)
    attr.elem.value = ctypes.addressof(vbuf)
    attr.elem.flags = flags
    check(BPF_MAP_UPDATE_ELEM, attr)


def map_delete_elem(fd: int, key: bytes) -> bool:
    """Delete key; False if it was absent."""
    kbuf = _in_buf(key)
    attr = BpfAttr()
    attr.elem.map_fd = fd
    attr.elem.key = ctypes.addressof(kbuf)
    ret = _call(BPF_MAP_DELETE_ELEM, attr)
    if ret == -_errno.ENOENT:
        return False
    if ret < 0:
        hint = "array elements cannot be deleted" if ret == -_errno.EINVAL else _hint(-ret)
        raise BpfError(-ret, "BPF_MAP_DELETE_ELEM", hint=hint)
    return True


def map_get_next_key(fd: int, key: bytes | None, key_size: int) -> bytes | None:
    """The key after key (the first key if key is None or absent); None at the end."""
    kbuf = None if key is None else _in_buf(key)
    nbuf = ctypes.create_string_buffer(key_size)
    attr = BpfAttr()
    attr.elem.map_fd = fd
    attr.elem.key = _ptr(kbuf)
    attr.elem.value = ctypes.addressof(nbuf)
    ret = _call(BPF_MAP_GET_NEXT_KEY, attr)
    if ret == -_errno.ENOENT:
        return None
    if ret < 0:
        raise BpfError(-ret, "BPF_MAP_GET_NEXT_KEY", hint=_hint(-ret))
    return nbuf.raw


def map_lookup_batch(
    fd: int, key_size: int, value_size: int, count: int, in_batch: bytes | None
) -> tuple[bytes, bytes, int, bytes | None]:
    """Up to count elements starting at batch token in_batch (None = the start).

    Returns (keys, values, n, next_token): keys holds n * key_size bytes,
    values n * value_size (the whole per-CPU buffer per element for per-CPU
    maps); next_token is None once the map is exhausted. Raises BpfError
    ENOSPC when one hash bucket holds more than count elements (retry larger).
    """
    if count <= 0:
        raise ValueError(f"batch count must be positive, got {count}")
    # Hash maps use a u32 bucket index as the token, arrays a key.
    token_size = max(key_size, 8)
    in_buf = None if in_batch is None else _in_buf(in_batch.ljust(token_size, b"\0"))
    out_buf = ctypes.create_string_buffer(token_size)
    kbuf = ctypes.create_string_buffer(key_size * count)
    vbuf = ctypes.create_string_buffer(value_size * count)
    attr = BpfAttr()
    b = attr.batch
    b.in_batch = _ptr(in_buf)
    b.out_batch = ctypes.addressof(out_buf)
    b.keys = ctypes.addressof(kbuf)
    b.values = ctypes.addressof(vbuf)
    b.count = count
    b.map_fd = fd
    ret = _call(BPF_MAP_LOOKUP_BATCH, attr)
    done = ret == -_errno.ENOENT  # the kernel still reports the count it copied
    if ret < 0 and not done:
        raise BpfError(-ret, "BPF_MAP_LOOKUP_BATCH", hint=_hint(-ret))
    n = b.count
    if n > count:
        raise BpfError(_errno.EIO, "BPF_MAP_LOOKUP_BATCH", hint=f"kernel returned {n} > {count}")
    keys = ctypes.string_at(kbuf, n * key_size)
    values = ctypes.string_at(vbuf, n * value_size)
    return keys, values, n, None if done else out_buf.raw


def map_freeze(fd: int) -> None:
    attr = BpfAttr()
    attr.map_freeze.map_fd = fd
    check(BPF_MAP_FREEZE, attr)


# --- programs and BTF ---


def prog_load(
    prog_type: int,
    insns: bytes,
    license: str,
    name: str = "",
    expected_attach_type: int = 0,
    prog_btf_fd: int = 0,
    func_info: bytes = b"",
    func_info_rec_size: int = 0,
    line_info: bytes = b"",
    line_info_rec_size: int = 0,
    prog_flags: int = 0,
    kern_version: int = 0,
    attach_btf_id: int = 0,
    attach_btf_obj_fd: int = 0,
) -> int:
    """Load a program; its fd. attach_btf_id/_obj_fd: a target's BTF id and module BTF fd.
    Loads without a log, then again with log_level 1 so the BpfError has the verifier's log."""
    if len(insns) % 8 or not insns:
        raise ValueError(f"instructions must be a non-empty multiple of 8 bytes, got {len(insns)}")
    if func_info and (func_info_rec_size <= 0 or len(func_info) % func_info_rec_size):
        raise ValueError("func_info length must be a multiple of a positive func_info_rec_size")
    if line_info and (line_info_rec_size <= 0 or len(line_info) % line_info_rec_size):
        raise ValueError("line_info length must be a multiple of a positive line_info_rec_size")
    pname = _obj_name(name, "program")
    # These buffers must outlive every syscall below: keep them in locals.
    insn_buf = _in_buf(insns)
    lic_buf = ctypes.create_string_buffer(license.encode())
    fi_buf = _in_buf(func_info) if func_info else None
    li_buf = _in_buf(line_info) if line_info else None

    def attempt(log_buf: ctypes.Array | None) -> tuple[int, BpfAttr]:
        attr = BpfAttr()
        a = attr.prog_load
        a.prog_type = prog_type
        a.insn_cnt = len(insns) // 8
        a.insns = ctypes.addressof(insn_buf)
        a.license = ctypes.addressof(lic_buf)
        a.kern_version = kern_version
        a.prog_flags = prog_flags
        a.prog_name = pname
        a.expected_attach_type = expected_attach_type
        a.prog_btf_fd = prog_btf_fd
        a.attach_btf_id, a.attach_btf_obj_fd = attach_btf_id, attach_btf_obj_fd  # fd 0: vmlinux
        if fi_buf is not None:
            a.func_info_rec_size = func_info_rec_size
            a.func_info = ctypes.addressof(fi_buf)
            a.func_info_cnt = len(func_info) // func_info_rec_size
        if li_buf is not None:
            a.line_info_rec_size = line_info_rec_size
            a.line_info = ctypes.addressof(li_buf)
            a.line_info_cnt = len(line_info) // line_info_rec_size
        if log_buf is not None:
            a.log_level = 1
            a.log_size = len(log_buf)
            a.log_buf = ctypes.addressof(log_buf)
        return _call(BPF_PROG_LOAD, attr), attr

    return _load_with_log("BPF_PROG_LOAD", attempt, lambda a: a.prog_load.log_true_size)


def prog_bind_map(prog_fd: int, map_fd: int) -> None:
    """Make a loaded program hold a map it does not reference (libbpf does so with .rodata)."""
    attr = BpfAttr()
    attr.prog_bind_map.prog_fd = prog_fd
    attr.prog_bind_map.map_fd = map_fd
    check(BPF_PROG_BIND_MAP, attr)


def btf_load(data: bytes) -> int:
    """Load BTF; returns its fd. On failure the BpfError carries the BTF log."""
    if not data:
        raise ValueError("BTF data is empty")
    data_buf = _in_buf(data)

    def attempt(log_buf: ctypes.Array | None) -> tuple[int, BpfAttr]:
        attr = BpfAttr()
        a = attr.btf_load
        a.btf = ctypes.addressof(data_buf)
        a.btf_size = len(data)
        if log_buf is not None:
            a.btf_log_level = 1
            a.btf_log_size = len(log_buf)
            a.btf_log_buf = ctypes.addressof(log_buf)
        return _call(BPF_BTF_LOAD, attr), attr

    return _load_with_log("BPF_BTF_LOAD", attempt, lambda a: a.btf_load.btf_log_true_size)


def _load_with_log(
    command: str,
    attempt: Callable[[ctypes.Array | None], tuple[int, BpfAttr]],
    true_size: Callable[[BpfAttr], int],
) -> int:
    """Load once without a log (as libbpf does); on failure again with a log,
    growing the buffer while the kernel says it is too small, and raise
    BpfError carrying that log."""
    ret, _ = attempt(None)
    if ret >= 0:
        return ret
    first_err = -ret
    size = LOG_BUF_SIZE
    while True:
        log_buf = ctypes.create_string_buffer(size)
        ret, attr = attempt(log_buf)
        if ret >= 0:  # succeeded with a log (the first failure was transient)
            return ret
        log = _log_text(log_buf)
        if -ret == _errno.ENOSPC and size < LOG_BUF_MAX:
            size = _grow(size, true_size(attr))
            continue
        # With a log the kernel may report ENOSPC for a truncated log: keep
        # the real reason from the first attempt then.
        err = first_err if -ret == _errno.ENOSPC else -ret
        raise BpfError(err, command, log, _hint(err))


def _grow(size: int, true_size: int) -> int:
    return min(LOG_BUF_MAX, max(size * 4, true_size + 1))


def _log_text(buf: ctypes.Array) -> str:
    return buf.value.decode("utf-8", "replace")


# --- object info ---


# NamedTuples, not dataclasses: see bpf/maps.py's Page.
class ProgInfo(NamedTuple):
    type: int
    id: int
    tag: bytes
    name: str
    xlated_prog_len: int
    nr_map_ids: int
    map_ids: list[int]
    btf_id: int = 0
    run_time_ns: int = 0
    run_cnt: int = 0
    recursion_misses: int = 0


class MapInfo(NamedTuple):
    type: int
    id: int
    key_size: int
    value_size: int
    max_entries: int
    map_flags: int
    name: str
    btf_id: int = 0
    btf_key_type_id: int = 0
    btf_value_type_id: int = 0


def _get_info(fd: int, info: ctypes.Structure) -> None:
    attr = BpfAttr()
    attr.info.bpf_fd = fd
    attr.info.info_len = ctypes.sizeof(info)
    attr.info.info = ctypes.addressof(info)
    check(BPF_OBJ_GET_INFO_BY_FD, attr)


def btf_next_id(start_id: int) -> int | None:
    """The next BTF object id after start_id (kernel and loaded BTF alike); None at the end."""
    attr = BpfAttr()
    attr.obj_id.id = start_id
    try:
        check(BPF_BTF_GET_NEXT_ID, attr)
    except BpfError as e:
        if e.errno == _errno.ENOENT:
            return None
        raise
    return int(attr.obj_id.next_id)


def btf_fd_by_id(btf_id: int) -> int:
    attr = BpfAttr()
    attr.obj_id.id = btf_id
    return check(BPF_BTF_GET_FD_BY_ID, attr)


def btf_name(fd: int) -> tuple[str, bool]:
    """(name, is kernel BTF) of a BTF object: "vmlinux" or a module's name for the kernel's."""
    name = ctypes.create_string_buffer(64)
    info = BpfBtfInfo()
    info.name = ctypes.addressof(name)
    info.name_len = len(name)
    _get_info(fd, info)
    return name.value.decode("utf-8", "replace"), bool(info.kernel_btf)


def prog_info(fd: int) -> ProgInfo:
    info = BpfProgInfo()
    _get_info(fd, info)
    map_ids: list[int] = []
    if info.nr_map_ids:
        # Second call with room for the ids; the set may change in between.
        ids = (u32 * info.nr_map_ids)()
        info2 = BpfProgInfo()
        info2.nr_map_ids = info.nr_map_ids
        info2.map_ids = ctypes.addressof(ids)
        _get_info(fd, info2)
        map_ids = list(ids[: min(info.nr_map_ids, info2.nr_map_ids)])
    return ProgInfo(
        type=info.type,
        id=info.id,
        tag=bytes(info.tag),
        name=info.name.decode("ascii", "replace"),
        xlated_prog_len=info.xlated_prog_len,
        nr_map_ids=info.nr_map_ids,
        map_ids=map_ids,
        btf_id=info.btf_id,
        run_time_ns=info.run_time_ns,
        run_cnt=info.run_cnt,
        recursion_misses=info.recursion_misses,
    )


def prog_xlated(fd: int) -> bytes:
    """The program's instructions as the kernel rewrote them (empty if hidden)."""
    info = BpfProgInfo()
    _get_info(fd, info)
    n = info.xlated_prog_len
    if not n:  # no CAP_BPF/CAP_SYS_ADMIN or kernel.kptr_restrict hides them
        return b""
    buf = ctypes.create_string_buffer(n)
    info2 = BpfProgInfo()
    info2.xlated_prog_len = n
    info2.xlated_prog_insns = ctypes.addressof(buf)
    _get_info(fd, info2)
    return buf.raw[: min(n, info2.xlated_prog_len)]


def map_info(fd: int) -> MapInfo:
    info = BpfMapInfo()
    _get_info(fd, info)
    return MapInfo(
        type=info.type,
        id=info.id,
        key_size=info.key_size,
        value_size=info.value_size,
        max_entries=info.max_entries,
        map_flags=info.map_flags,
        name=info.name.decode("ascii", "replace"),
        btf_id=info.btf_id,
        btf_key_type_id=info.btf_key_type_id,
        btf_value_type_id=info.btf_value_type_id,
    )


# --- stats and CPUs (the commands that make links: link/bpflink.py) ---


def enable_stats(stats_type: int = BPF_STATS_RUN_TIME) -> int:
    """Run-time statistics count while the returned fd stays open."""
    attr = BpfAttr()
    attr.enable_stats.type = stats_type
    return check(BPF_ENABLE_STATS, attr)


@cache
def possible_cpus() -> int:
    """Number of possible CPUs: per-CPU map values hold one slot for each."""
    with open("/sys/devices/system/cpu/possible") as f:
        text = f.read().strip()
    return _count_cpu_list(text)


def _count_cpu_list(text: str) -> int:
    """Count CPUs in a list such as "0-3,5,7-8"."""
    n = 0
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"cannot parse CPU list {text!r}") from None
        if last < first:
            raise ValueError(f"bad range {part!r} in CPU list {text!r}")
        n += last - first + 1
    if n == 0:
        raise ValueError(f"empty CPU list {text!r}")
    return n
