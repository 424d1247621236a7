"""An object's BTF rewritten for a kernel that lacks some BTF kinds, as libbpf does.

clang writes FLOAT, DECL_TAG, TYPE_TAG and ENUM64 types (and libbpf-style
`?` DATASEC names) that older kernels refuse in BPF_BTF_LOAD, which would
refuse the whole BTF. Before loading, libbpf probes which of these the
kernel accepts (a tiny BTF blob each: kernel/btfprobe.py here) and rewrites
what it does not into kinds every supported kernel knows, keeping every type
id and record size so func/line info and map type ids still point where
they did:

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

from gfxbpf.bpf.btf.facade import Btf
from gfxbpf.bpf.btf.kinds import (
    KIND_CONST,
    KIND_ENUM,
    KIND_ENUM64,
    KIND_INT,
    KIND_STRUCT,
    KIND_UNION,
    BtfType,
    Const,
    Datasec,
    DeclTag,
    Enum,
    Float,
    Int,
    Member,
    Struct,
    TypeTag,
    Union,
)

FEATURES = ("float", "decl_tag", "type_tag", "enum64", "qmark_datasec")


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
