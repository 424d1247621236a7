"""The BTF that CO-RE relocations resolve against: vmlinux, then kernel modules.

Candidates are looked for in vmlinux first; only when vmlinux has none for
a type are the modules' BTFs (split BTF on top of vmlinux, under
/sys/kernel/btf/<module>) searched, all of them, as libbpf does. Each is a
LazyTable (btf/index.py): the raw blob, indexed, decoded type by type, so
the broker never holds vmlinux as Python objects. A Target can also be
built from stored blobs, which makes resolution testable offline.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass

from gfxbpf.bpf.btf.index import BtfBytes, LazyTable
from gfxbpf.bpf.btf.kinds import KIND_ENUM, KIND_ENUM64, BtfError, BtfType
from gfxbpf.bpf.core.relo import CoreError, essential_name
from gfxbpf.bpf.core.resolve import Candidate

SYSFS_BTF = "/sys/kernel/btf"
MAX_BTF_BYTES = 256 << 20  # vmlinux BTF is a few MiB; bounds a hostile file


_ENUMS = frozenset({KIND_ENUM, KIND_ENUM64})


@dataclass
class TargetBtf:
    """One target BTF; types before start_id belong to its base (vmlinux)."""

    name: str
    table: LazyTable
    start_id: int

    def candidates(self, local: BtfType) -> list[int]:
        """This BTF's own types with local's essential name and a compatible kind
        (the same, or ENUM with ENUM64), in id order."""
        kinds = _ENUMS if local.kind in _ENUMS else {local.kind}
        ids = self.table.ids_named(essential_name(local.name), essential_name)
        return [i for i in ids if self.table.kind_of(i) in kinds]


class Target:
    """vmlinux BTF, and module BTFs loaded on first need."""

    def __init__(
        self, vmlinux: TargetBtf, modules: Callable[[], list[TargetBtf]] | None = None
    ) -> None:
        self.vmlinux = vmlinux
        self._load_modules = modules
        self._modules: list[TargetBtf] | None = None

    @classmethod
    def from_blobs(cls, vmlinux: bytes, modules: dict[str, bytes] | None = None) -> Target:
        """A target from raw BTF: vmlinux's, and modules' split BTF in the given order."""
        try:
            base = TargetBtf("vmlinux", LazyTable(bytes(vmlinux)), 1)
        except BtfError as e:
            raise CoreError(f"bad target BTF: {e}") from None
        mods = [(name, blob) for name, blob in (modules or {}).items()]
        return cls(base, lambda: [_split(n, b, base.table) for n, b in mods])

    @classmethod
    def kernel(cls, root: str = SYSFS_BTF) -> Target:
        """The running kernel's BTF (vmlinux parsed once per process)."""
        vmlinux = _vmlinux(os.path.join(root, "vmlinux"))
        return cls(vmlinux, lambda: _kernel_modules(root, vmlinux.table))

    def modules(self) -> list[TargetBtf]:
        if self._modules is None:
            self._modules = self._load_modules() if self._load_modules else []
        return self._modules

    def candidates(self, local: BtfType) -> list[Candidate]:
        """Target types with local's essential name and a compatible kind, in id order."""
        found = [
            Candidate("vmlinux", self.vmlinux.table, i) for i in self.vmlinux.candidates(local)
        ]
        if found:
            return found
        for mod in self.modules():
            found += [Candidate(mod.name, mod.table, i) for i in mod.candidates(local)]
        return found


def _split(name: str, data: BtfBytes, base: LazyTable) -> TargetBtf:
    try:
        table = LazyTable(data, base)
    except BtfError as e:
        raise CoreError(f"module {name!r}: bad BTF: {e}") from None
    return TargetBtf(name, table, table.start_id)


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
        out.append(_split(name, data, base))
    return out
