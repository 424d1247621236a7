"""The BTF that CO-RE relocations resolve against: vmlinux, then kernel modules.

Candidates are looked for in vmlinux first; only when vmlinux has none for
a type are the modules' BTFs (split BTF on top of vmlinux, under
/sys/kernel/btf/<module>) searched, all of them, as libbpf does. Each is a
LazyTable (btf/index.py): the raw blob, indexed, decoded type by type, so
the broker never holds vmlinux as Python objects. A Target is built from
blobs: stored ones offline, the running kernel's by kernel/vmlinux.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gfxbpf.bpf.btf.index import LazyTable
from gfxbpf.bpf.btf.kinds import KIND_ENUM, KIND_ENUM64, BtfError, BtfType
from gfxbpf.bpf.btf.parse import BtfBytes
from gfxbpf.bpf.core.relo import CoreError, essential_name
from gfxbpf.bpf.core.resolve import Candidate

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
        return cls(base, lambda: [split(n, b, base.table) for n, b in mods])

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


def split(name: str, data: BtfBytes, base: LazyTable) -> TargetBtf:
    """A module's split BTF on top of base (vmlinux's table)."""
    try:
        table = LazyTable(data, base)
    except BtfError as e:
        raise CoreError(f"module {name!r}: bad BTF: {e}") from None
    return TargetBtf(name, table, table.start_id)
