"""Which BTF kinds this kernel's BPF_BTF_LOAD accepts, probed once per
process with a tiny BTF blob each, as libbpf does; btf/sanitize.py rewrites
what it refuses."""

from __future__ import annotations

import os

from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.btf.facade import Btf
from gfxbpf.bpf.btf.kinds import (
    INT_SIGNED,
    KIND_DATASEC,
    KIND_DECL_TAG,
    KIND_ENUM64,
    KIND_FLOAT,
    KIND_INT,
    KIND_PTR,
    KIND_TYPE_TAG,
    KIND_VAR,
    LINKAGE_STATIC,
    BtfType,
    Datasec,
    DeclTag,
    Enum,
    EnumValue,
    Float,
    Int,
    Ptr,
    TypeTag,
    Var,
    VarSecinfo,
    Void,
)
from gfxbpf.bpf.btf.sanitize import FEATURES


def _probe_blob(feature: str) -> bytes:
    """A minimal BTF using `feature` (the shapes libbpf probes with)."""
    void = Void(0, 0, "", 0, False)
    int_t = Int(1, KIND_INT, "int", 1, False, 4, INT_SIGNED, 0, 32)
    strs = b"\0int\0x\0tag\0?.data\0"
    var = Var(2, KIND_VAR, "x", 5, False, 1, LINKAGE_STATIC)
    types: list[BtfType]
    if feature == "int":  # the baseline: plain BTF
        types = [void, int_t]
    elif feature == "float":
        types = [void, Float(1, KIND_FLOAT, "int", 1, False, 4)]
    elif feature == "decl_tag":
        types = [void, int_t, var, DeclTag(3, KIND_DECL_TAG, "tag", 7, False, 2, -1)]
    elif feature == "type_tag":
        tag = TypeTag(2, KIND_TYPE_TAG, "tag", 7, False, 1)
        types = [void, int_t, tag, Ptr(3, KIND_PTR, "", 0, False, 2)]
    elif feature == "enum64":
        types = [void, Enum(1, KIND_ENUM64, "x", 5, False, 8, [EnumValue("tag", 7, 1 << 40)])]
    else:  # qmark_datasec
        sec = Datasec(3, KIND_DATASEC, "?.data", 11, False, 4, [VarSecinfo(2, 0, 4)])
        types = [void, int_t, var, sec]
    return Btf(types, strs).to_bytes()


_MISSING: frozenset[str] | None = None


def missing_features() -> frozenset[str]:
    """The BTF features this kernel refuses, probed once per process.

    Only where the kernel loads plain BTF at all: if even that fails (no
    permission, no BTF support), nothing is rewritten nor remembered, and
    the object's own load says why.
    """
    global _MISSING
    if _MISSING is not None:
        return _MISSING
    if not _loads(_probe_blob("int")):
        return frozenset()
    _MISSING = frozenset(f for f in FEATURES if not _loads(_probe_blob(f)))
    return _MISSING


def _loads(blob: bytes) -> bool:
    try:
        fd = bpfsys.btf_load(blob)
    except bpfsys.BpfError:
        return False
    os.close(fd)
    return True
