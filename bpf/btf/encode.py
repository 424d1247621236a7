"""BtfType objects -> the raw type section of a BTF blob (the inverse of btf_parse)."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

from gfxbpf.bpf.btf.kinds import (
    KIND_ENUM,
    Array,
    BtfError,
    BtfType,
    Composite,
    Datasec,
    DeclTag,
    Enum,
    Float,
    Func,
    FuncProto,
    Fwd,
    Int,
    Ref,
    Var,
)

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_III = struct.Struct("<III")
_II = struct.Struct("<II")


def encode_types(types: Sequence[BtfType]) -> bytes:
    """The type section for `types` (types[0], void, is implicit and not written)."""
    parts: list[bytes] = []
    add = parts.append
    for t in types[1:]:
        _encode(t, add)
    return b"".join(parts)


def _head(t: BtfType, vlen: int, size_or_type: int) -> bytes:
    info = (0x80000000 if t.kind_flag else 0) | t.kind << 24 | vlen
    return _III.pack(t.name_off, info, size_or_type)


def _encode(t: BtfType, add: Callable[[bytes], object]) -> None:
    pack3 = _III.pack
    match t:
        case Func():
            add(_head(t, t.linkage, t.type))
        case FuncProto():
            add(_head(t, len(t.params), t.type))
            for p in t.params:
                add(_II.pack(p.name_off, p.type))
        case Ref():
            add(_head(t, 0, t.type))
        case Composite():
            _encode_composite(t, add)
        case Array():
            add(_head(t, 0, 0))
            add(pack3(t.type, t.index_type, t.nelems))
        case Int():
            add(_head(t, 0, t.size))
            add(_U32.pack(t.encoding << 24 | t.bit_offset << 16 | t.bits))
        case Enum():
            _encode_enum(t, add)
        case Var():
            add(_head(t, 0, t.type))
            add(_U32.pack(t.linkage))
        case Datasec():
            add(_head(t, len(t.secinfos), t.size))
            for s in t.secinfos:
                add(pack3(s.type, s.offset, s.size))
        case Fwd():
            add(_head(t, 0, 0))
        case Float():
            add(_head(t, 0, t.size))
        case DeclTag():
            add(_head(t, 0, t.type))
            add(_I32.pack(t.component_idx))
        case _:
            raise BtfError(f"cannot encode type id {t.id}: unknown kind {t.kind}")


def _encode_composite(t: Composite, add: Callable[[bytes], object]) -> None:
    add(_head(t, len(t.members), t.size))
    for m in t.members:
        bits = m.bitfield_size << 24 | m.bit_offset if t.kind_flag else m.bit_offset
        add(_III.pack(m.name_off, m.type, bits))


def _encode_enum(t: Enum, add: Callable[[bytes], object]) -> None:
    add(_head(t, len(t.values), t.size))
    if t.kind == KIND_ENUM:
        for v in t.values:
            add(_II.pack(v.name_off, v.value & 0xFFFFFFFF))
    else:
        for v in t.values:
            u = v.value & 0xFFFFFFFFFFFFFFFF
            add(_III.pack(v.name_off, u & 0xFFFFFFFF, u >> 32))
