"""An object's BTF rewritten for a kernel that lacks some BTF kinds, as libbpf does.

clang writes FLOAT, DECL_TAG, TYPE_TAG and ENUM64 types (and libbpf-style
`?` DATASEC names) that older kernels refuse in BPF_BTF_LOAD, which would
refuse the whole BTF. Before loading, libbpf probes which of these the
kernel accepts (a tiny BTF blob each) and rewrites what it does not into
kinds every supported kernel knows, keeping every type id and record size
so func/line info and map type ids still point where they did:

- DECL_TAG -> a 1-byte INT (name kept);
- TYPE_TAG -> an anonymous CONST of the same type;
- FLOAT -> an anonymous STRUCT of the same size without members;
- ENUM64 -> a UNION of the same size whose members (the enumerators' names)
  are one added 1-byte INT `enum64_placeholder`; a signed ENUM loses its
  kind_flag (signed enums came with ENUM64);
- a DATASEC named `?...` -> `_...`.

The object's own Btf is never changed: sanitize() works on a copy.
"""

from __future__ import annotations

import os

from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.btf.facade import Btf
from gfxbpf.bpf.btf.kinds import (
    INT_SIGNED,
    KIND_CONST,
    KIND_DATASEC,
    KIND_DECL_TAG,
    KIND_ENUM,
    KIND_ENUM64,
    KIND_FLOAT,
    KIND_INT,
    KIND_PTR,
    KIND_STRUCT,
    KIND_TYPE_TAG,
    KIND_UNION,
    KIND_VAR,
    LINKAGE_STATIC,
    BtfType,
    Const,
    Datasec,
    DeclTag,
    Enum,
    EnumValue,
    Float,
    Int,
    Member,
    Ptr,
    Struct,
    TypeTag,
    Union,
    Var,
    VarSecinfo,
    Void,
)

FEATURES = ("float", "decl_tag", "type_tag", "enum64", "qmark_datasec")


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


def needs_sanitizing(btf: Btf, missing: frozenset[str]) -> bool:
    if not missing:
        return False
    return any(_fix_for(t, missing) for t in btf.types)


def _fix_for(t: BtfType, missing: frozenset[str]) -> bool:
    match t:
        case DeclTag():
            return "decl_tag" in missing
        case TypeTag():
            return "type_tag" in missing
        case Float():
            return "float" in missing
        case Enum():
            return "enum64" in missing and (t.kind == KIND_ENUM64 or t.kind_flag)
        case Datasec():
            return "qmark_datasec" in missing and t.name.startswith("?")
    return False


def sanitize(btf: Btf, missing: frozenset[str]) -> Btf:
    """A copy of `btf` this kernel accepts, given the features it lacks."""
    out = Btf.parse(btf.to_bytes())
    placeholder = 0
    for i, t in enumerate(out.types):
        if not _fix_for(t, missing):
            continue
        if isinstance(t, Enum) and t.kind == KIND_ENUM64 and not placeholder:
            placeholder = _add_placeholder(out)
        out.types[i] = _rewrite(out, t, placeholder)
    out._by_name = None
    out._forget()
    return out


def _rewrite(btf: Btf, t: BtfType, placeholder: int) -> BtfType:
    match t:
        case DeclTag():
            return Int(t.id, KIND_INT, t.name, t.name_off, False, 1, 0, 0, 8)
        case TypeTag():
            return Const(t.id, KIND_CONST, "", 0, False, t.type)
        case Float():
            return Struct(t.id, KIND_STRUCT, "", 0, False, t.size, [])
        case Enum() if t.kind == KIND_ENUM64:
            members = [Member(v.name, v.name_off, placeholder, 0, 0) for v in t.values]
            return Union(t.id, KIND_UNION, t.name, t.name_off, False, t.size, members)
        case Enum():
            return Enum(t.id, KIND_ENUM, t.name, t.name_off, False, t.size, t.values)
        case Datasec():
            _rename_qmark(btf, t)
            return t
    return t


def _add_placeholder(btf: Btf) -> int:
    tid = len(btf.types)
    off = btf.add_string("enum64_placeholder")
    btf.types.append(Int(tid, KIND_INT, "enum64_placeholder", off, False, 1, 0, 0, 8))
    return tid


def _rename_qmark(btf: Btf, t: Datasec) -> None:
    """'?' -> '_' in the string itself, as libbpf does (every user of it sees the change)."""
    s = bytearray(btf.strings)
    s[t.name_off] = ord("_")
    btf.strings = bytes(s)
    btf._str_cache.clear()
    t.name = "_" + t.name[1:]
