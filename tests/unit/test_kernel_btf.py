"""Attach targets by name: vmlinux first, then a module's split BTF (offline, stored BTF)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from gfxbpf.bpf.btf.encode import encode_types
from gfxbpf.bpf.btf.kinds import KIND_TYPEDEF, Int, Typedef, Void
from gfxbpf.bpf.core.target import Target
from gfxbpf.bpf.kernel.vmlinux import KernelBtfError, KernelType, find_type
from gfxbpf.bpf.object import ObjectSpec

DATA = Path(__file__).resolve().parent.parent / "data" / "core"


def _base() -> bytes:
    return ObjectSpec.from_file(str(DATA / "target_old.bpf.o")).btf_bytes


def _module_with_typedef(base: bytes, name: str) -> bytes:
    """A module's split BTF on top of base: `typedef int <name>;` (as btf_trace_* are)."""
    table = Target.from_blobs(base).vmlinux.table
    int_id = next(t.id for t in table.types if isinstance(t, Int))
    strings = name.encode() + b"\0"
    td = Typedef(len(table.types), KIND_TYPEDEF, name, len(table.strings), False, int_id)
    types = encode_types([Void(0, 0, "", 0, False), td])  # void is never written
    hdr = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strings))
    return hdr + types + strings


def test_vmlinux_first_then_modules() -> None:
    base = _base()
    n_base = len(Target.from_blobs(base).vmlinux.table.types)
    mod = _module_with_typedef(base, "btf_trace_gfx_request")
    target = Target.from_blobs(base, {"i915": mod})
    assert find_type("btf_trace_gfx_request", KIND_TYPEDEF, target) == KernelType("i915", n_base)
    # A name vmlinux has resolves there, even when a module has one too.
    in_base = next(t for t in target.vmlinux.table.types if isinstance(t, Int) and t.name)
    both = Target.from_blobs(base, {"i915": _module_with_typedef(base, in_base.name)})
    assert find_type(in_base.name, in_base.kind, both) == KernelType("vmlinux", in_base.id)
    assert find_type(in_base.name, KIND_TYPEDEF, both) == KernelType("i915", n_base)


def test_missing_everywhere_says_so() -> None:
    target = Target.from_blobs(_base(), {"i915": _module_with_typedef(_base(), "btf_trace_x")})
    with pytest.raises(KernelBtfError, match="in vmlinux or a loaded module"):
        find_type("btf_trace_nowhere", KIND_TYPEDEF, target)
