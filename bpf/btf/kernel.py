"""Attach targets and ksyms by name in the running kernel's BTF: vmlinux, then modules.

BTF-typed programs (tp_btf, fentry, fexit, iter) name their target by type
id (PROG_LOAD's attach_btf_id) in vmlinux or in a module's split BTF; a
module's target also needs an fd of that module's kernel BTF object
(attach_btf_obj_fd), found by walking BTF object ids as libbpf does. The
BTF itself is read through core/target.py (vmlinux read and indexed once per
process, decoded type by type; modules when vmlinux lacks the name). Typed
__ksym and kfunc externs are looked up in vmlinux only (module ones would
need the fd_array).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.btf.kinds import KIND_TYPEDEF
from gfxbpf.bpf.core.relo import CoreError
from gfxbpf.bpf.core.target import Target
from gfxbpf.bpf.errors import KernelError

BTF_TRACE_PREFIX = "btf_trace_"  # the typedef each tracepoint has in BTF


class KernelBtfError(KernelError):
    """The kernel has no usable BTF, or lacks a type an object names."""


@dataclass(frozen=True)
class KernelType:
    module: str  # "vmlinux", or the module whose BTF holds the type
    type_id: int


def _kernel() -> Target:
    try:
        return Target.kernel()
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
