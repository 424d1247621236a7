"""The running kernel's BTF: vmlinux and the modules' split BTF, read from
/sys/kernel/btf into a CO-RE Target (kernel_target), and attach targets and
ksyms found by name in it: vmlinux first, then modules.

BTF-typed programs (tp_btf, fentry, fexit, iter) name their target by type
id (PROG_LOAD's attach_btf_id) in vmlinux or in a module's split BTF; a
module's target also needs an fd of that module's kernel BTF object
(attach_btf_obj_fd), found by walking BTF object ids as libbpf does. The
BTF itself is read here once per process (vmlinux mapped or read, and
indexed; decoded type by type by btf/index.py; modules when vmlinux lacks
the name). Typed
__ksym and kfunc externs are looked up in vmlinux only (module ones would
need the fd_array).
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.btf.index import LazyTable
from gfxbpf.bpf.btf.kinds import KIND_TYPEDEF, BtfError
from gfxbpf.bpf.btf.parse import BtfBytes
from gfxbpf.bpf.core.relo import CoreError
from gfxbpf.bpf.core.target import Target, TargetBtf, split
from gfxbpf.bpf.errors import KernelError

BTF_TRACE_PREFIX = "btf_trace_"  # the typedef each tracepoint has in BTF
SYSFS_BTF = "/sys/kernel/btf"
MAX_BTF_BYTES = 256 << 20  # vmlinux BTF is a few MiB; bounds a hostile file


class KernelBtfError(KernelError):
    """The kernel has no usable BTF, or lacks a type an object names."""


@dataclass(frozen=True)
class KernelType:
    module: str  # "vmlinux", or the module whose BTF holds the type
    type_id: int


def kernel_target(root: str = SYSFS_BTF) -> Target:
    """The running kernel's BTF (vmlinux parsed once per process); CoreError
    when it cannot be read."""
    vmlinux = _vmlinux(os.path.join(root, "vmlinux"))
    return Target(vmlinux, lambda: _kernel_modules(root, vmlinux.table))


def _kernel() -> Target:
    try:
        return kernel_target()
    except CoreError as e:
        raise KernelBtfError(str(e)) from None


def find_type(name: str, kind: int, target: Target | None = None) -> KernelType:
    """The first type `name` of `kind`: in vmlinux, else in the modules (oldest first)."""
    t = target if target is not None else _kernel()
    tid = t.vmlinux.table.find(name, kind)
    if tid is not None:
        return KernelType("vmlinux", tid)
    try:
        modules = t.modules()
    except CoreError as e:
        raise KernelBtfError(str(e)) from None
    for mod in modules:
        ids = [i for i in mod.table.find_all(name, kind) if i >= mod.start_id]
        if ids:
            return KernelType(mod.name, ids[0])
    raise KernelBtfError(
        f"the running kernel's BTF has no {name!r}, in vmlinux or a loaded module "
        "(is the target spelled right, and its module loaded?)"
    )


def tp_btf_target_exists(name: str) -> bool:
    """Whether a tp_btf program can attach to tracepoint `name` here: the
    kernel has BTF (/sys/kernel/btf/vmlinux) with a btf_trace_<name> type."""
    try:
        find_type(BTF_TRACE_PREFIX + name, KIND_TYPEDEF)
    except KernelBtfError:
        return False
    return True


def vmlinux_type_id(name: str, kind: int) -> int:
    """The id of vmlinux's type `name` of `kind`; KernelBtfError if it has none."""
    tid = _kernel().vmlinux.table.find(name, kind)
    if tid is None:
        raise KernelBtfError(f"the running kernel's vmlinux BTF has no {name!r}")
    return tid


def module_btf_fd(module: str) -> int:
    """An fd of the kernel BTF object of `module` (the caller closes it)."""
    btf_id = 0
    while (next_id := bpfsys.btf_next_id(btf_id)) is not None:
        btf_id = next_id
        try:
            fd = bpfsys.btf_fd_by_id(btf_id)
        except bpfsys.BpfError:
            continue  # freed meanwhile
        try:
            name, is_kernel = bpfsys.btf_name(fd)
        except bpfsys.BpfError:
            name, is_kernel = "", False
        if is_kernel and name == module:
            return fd
        os.close(fd)
    raise KernelBtfError(f"no kernel BTF object for module {module!r} (unloaded meanwhile?)")


# vmlinux does not change while the kernel runs: mapped (or read) and indexed
# once (the index is ~1 MiB; decoded types are bounded by the table).
_VMLINUX_CACHE: dict[tuple[str, int, int], TargetBtf] = {}


def _read(path: str, mapped: bool = False) -> BtfBytes:
    """The file's bytes; with `mapped`, a read-only private mapping where the
    kernel allows one (/sys/kernel/btf/vmlinux, kernel 6.16+, as libbpf does):
    the kernel's own pages, neither copied nor counted in this process's RSS
    (the mapping keeps a duplicate of the fd open while it lives)."""
    try:
        with open(path, "rb") as f:
            # The size first: read(MAX) would allocate MAX bytes up front.
            size = os.fstat(f.fileno()).st_size
            if size > MAX_BTF_BYTES:
                raise CoreError(f"kernel BTF {path} is larger than {MAX_BTF_BYTES} bytes")
            if mapped and size:
                try:
                    return mmap.mmap(f.fileno(), size, mmap.MAP_PRIVATE, mmap.PROT_READ)
                except (OSError, ValueError):
                    pass  # an older kernel: sysfs cannot map it
            return f.read()
    except OSError as e:
        raise CoreError(
            f"cannot read kernel BTF {path}: {e.strerror}; CO-RE needs a kernel built with "
            "CONFIG_DEBUG_INFO_BTF"
        ) from None


def _vmlinux(path: str) -> TargetBtf:
    try:
        st = os.stat(path)
    except OSError as e:
        raise CoreError(
            f"cannot read kernel BTF {path}: {e.strerror}; CO-RE needs a kernel built with "
            "CONFIG_DEBUG_INFO_BTF"
        ) from None
    key = (path, st.st_size, st.st_mtime_ns)
    cached = _VMLINUX_CACHE.get(key)
    if cached is None:
        try:
            # Mapped only from sysfs: a regular file could shrink under the mapping.
            blob = _read(path, mapped=path.startswith("/sys/"))
            cached = TargetBtf("vmlinux", LazyTable(blob), 1)
        except BtfError as e:
            raise CoreError(f"kernel BTF {path} is unreadable: {e}") from None
        _VMLINUX_CACHE.clear()
        _VMLINUX_CACHE[key] = cached
    return cached


def module_order(root: str = SYSFS_BTF, proc_modules: str = "/proc/modules") -> list[str]:
    """Modules with BTF, oldest loaded first (libbpf walks BTF object ids, which grow)."""
    try:
        names = [n for n in os.listdir(root) if n != "vmlinux"]
    except OSError:
        return []
    try:
        with open(proc_modules) as f:
            newest_first = [line.split(" ", 1)[0] for line in f]
    except OSError:
        newest_first = []
    rank = {n: i for i, n in enumerate(reversed(newest_first))}
    return sorted(names, key=lambda n: (rank.get(n, len(rank)), n))


def _kernel_modules(root: str, base: LazyTable) -> list[TargetBtf]:
    out = []
    for name in module_order(root):
        try:
            data = _read(os.path.join(root, name))
        except CoreError:
            continue  # unloaded meanwhile
        out.append(split(name, data, base))
    return out
