"""The running kernel's BTF (/sys/kernel/btf/vmlinux), parsed once per process.

BTF-typed programs (tp_btf, fentry, fexit, iter) name their attach target by
vmlinux type id, and typed __ksym externs name kernel variables the same way.
Targets in module BTF are not looked up: such objects get a clear error.
"""

from __future__ import annotations

import functools

from gfxbpf.bpf.btf import Btf, BtfError
from gfxbpf.bpf.errors import KernelError

VMLINUX_BTF = "/sys/kernel/btf/vmlinux"
MAX_BTF_BYTES = 256 << 20  # vmlinux BTF is a few MiB; bounds a hostile file


class KernelBtfError(KernelError):
    """The kernel has no usable BTF, or lacks a type an object names."""


@functools.lru_cache(maxsize=1)
def vmlinux() -> Btf:
    try:
        with open(VMLINUX_BTF, "rb") as f:
            data = f.read(MAX_BTF_BYTES + 1)
    except OSError as e:
        raise KernelBtfError(
            f"cannot read {VMLINUX_BTF} ({e.strerror}): this kernel was built without "
            "CONFIG_DEBUG_INFO_BTF, so BTF-typed programs cannot load here"
        ) from None
    try:
        return Btf.parse(data)
    except BtfError as e:
        raise KernelBtfError(f"{VMLINUX_BTF} is not valid BTF: {e}") from None


def vmlinux_type_id(name: str, kind: int) -> int:
    """The id of vmlinux's type `name` of `kind`; KernelBtfError if it has none."""
    tid = vmlinux().find(name, kind)
    if tid is None:
        raise KernelBtfError(
            f"the running kernel's BTF has no {name!r} (is the target spelled right, "
            "does this kernel have it, or is it in a module?)"
        )
    return tid
