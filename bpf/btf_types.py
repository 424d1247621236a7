"""BTF's vocabulary: kind numbers, encoding bits, BtfError and a dataclass per kind.

Leaf module: everything else in the btf_* modules builds on it. Code
dispatches on a type's class (match): Ptr, Typedef, Const... share Ref's
fields, Struct and Union share Composite's. ENUM and ENUM64 are both an
Enum, told apart by `kind` (only their encoding differs). `kind` is also
kept on every type: it is what the blob holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from gfxbpf.bpf.errors import InputError

BTF_MAGIC = 0xEB9F
BTF_VERSION = 1
BTF_HEADER_LEN = 24

KIND_VOID = 0
KIND_INT = 1
KIND_PTR = 2
KIND_ARRAY = 3
KIND_STRUCT = 4
KIND_UNION = 5
KIND_ENUM = 6
KIND_FWD = 7
KIND_TYPEDEF = 8
KIND_VOLATILE = 9
KIND_CONST = 10
KIND_RESTRICT = 11
KIND_FUNC = 12
KIND_FUNC_PROTO = 13
KIND_VAR = 14
KIND_DATASEC = 15
KIND_FLOAT = 16
KIND_DECL_TAG = 17
KIND_TYPE_TAG = 18
KIND_ENUM64 = 19

KIND_NAMES = {
    KIND_VOID: "VOID",
    KIND_INT: "INT",
    KIND_PTR: "PTR",
    KIND_ARRAY: "ARRAY",
    KIND_STRUCT: "STRUCT",
    KIND_UNION: "UNION",
    KIND_ENUM: "ENUM",
    KIND_FWD: "FWD",
    KIND_TYPEDEF: "TYPEDEF",
    KIND_VOLATILE: "VOLATILE",
    KIND_CONST: "CONST",
    KIND_RESTRICT: "RESTRICT",
    KIND_FUNC: "FUNC",
    KIND_FUNC_PROTO: "FUNC_PROTO",
    KIND_VAR: "VAR",
    KIND_DATASEC: "DATASEC",
    KIND_FLOAT: "FLOAT",
    KIND_DECL_TAG: "DECL_TAG",
    KIND_TYPE_TAG: "TYPE_TAG",
    KIND_ENUM64: "ENUM64",
}

# BTF_INT_* encoding bits.
INT_SIGNED = 1
INT_CHAR = 2
INT_BOOL = 4

# FUNC linkage (kept in vlen) and VAR linkage.
LINKAGE_STATIC = 0
LINKAGE_GLOBAL = 1
LINKAGE_EXTERN = 2

REF_KINDS = frozenset(
    {KIND_PTR, KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT, KIND_TYPE_TAG}
)
# Nesting limit for recursive walks (arrays of arrays, structs in structs):
# legitimate types nest far less; corrupt ones must not blow the stack.
MAX_DEPTH = 64
PTR_SIZE = 8  # BPF is a 64-bit target


class BtfError(ValueError, InputError):
    """A BTF blob, .BTF.ext blob or BTF map definition is corrupt or unsupported."""


@dataclass(slots=True)
class BtfType:
    """Common part of every type: id (0 = void), kind (KIND_*), name."""

    id: int
    kind: int
    name: str
    name_off: int
    kind_flag: bool

    @property
    def kind_name(self) -> str:
        return KIND_NAMES.get(self.kind, f"KIND_{self.kind}")


@dataclass(slots=True)
class Void(BtfType):
    """Type id 0."""


@dataclass(slots=True)
class Int(BtfType):
    size: int
    encoding: int  # INT_SIGNED | INT_CHAR | INT_BOOL
    bit_offset: int
    bits: int

    @property
    def signed(self) -> bool:
        return bool(self.encoding & INT_SIGNED)


@dataclass(slots=True)
class Ref(BtfType):
    """PTR, TYPEDEF, VOLATILE, CONST, RESTRICT, TYPE_TAG: a reference to `type`."""

    type: int


@dataclass(slots=True)
class Ptr(Ref):
    """PTR: the only Ref resolve() does not skip."""


@dataclass(slots=True)
class Typedef(Ref):
    """TYPEDEF: `name` is the typedef's own name."""


@dataclass(slots=True)
class Volatile(Ref):
    """VOLATILE qualifier."""


@dataclass(slots=True)
class Const(Ref):
    """CONST qualifier."""


@dataclass(slots=True)
class Restrict(Ref):
    """RESTRICT qualifier."""


@dataclass(slots=True)
class TypeTag(Ref):
    """TYPE_TAG: an attribute (`__user`...) on the type it refers to."""


# The Ref class of each Ref kind.
REF_CLASSES: dict[int, type[Ref]] = {
    KIND_PTR: Ptr,
    KIND_TYPEDEF: Typedef,
    KIND_VOLATILE: Volatile,
    KIND_CONST: Const,
    KIND_RESTRICT: Restrict,
    KIND_TYPE_TAG: TypeTag,
}


@dataclass(slots=True)
class Array(BtfType):
    type: int
    index_type: int
    nelems: int


@dataclass(slots=True)
class Member:
    name: str
    name_off: int
    type: int
    bit_offset: int
    bitfield_size: int  # 0 unless the struct's kind_flag is set and this is a bitfield


@dataclass(slots=True)
class Composite(BtfType):
    """STRUCT or UNION."""

    size: int
    members: list[Member]


@dataclass(slots=True)
class Struct(Composite):
    """STRUCT."""


@dataclass(slots=True)
class Union(Composite):
    """UNION: every member at offset 0."""


@dataclass(slots=True)
class EnumValue:
    name: str
    name_off: int
    value: int


@dataclass(slots=True)
class Enum(BtfType):
    """ENUM or ENUM64; kind_flag set = signed values."""

    size: int
    values: list[EnumValue]

    @property
    def signed(self) -> bool:
        return self.kind_flag


@dataclass(slots=True)
class Fwd(BtfType):
    """Forward declaration; kind_flag set = union, else struct."""


@dataclass(slots=True)
class Func(BtfType):
    type: int  # FUNC_PROTO id
    linkage: int


@dataclass(slots=True)
class Param:
    name: str
    name_off: int
    type: int


@dataclass(slots=True)
class FuncProto(BtfType):
    type: int  # return type (0 = void)
    params: list[Param]


@dataclass(slots=True)
class Var(BtfType):
    type: int
    linkage: int


@dataclass(slots=True)
class VarSecinfo:
    type: int  # VAR (or FUNC for .ksyms) id
    offset: int
    size: int


@dataclass(slots=True)
class Datasec(BtfType):
    size: int
    secinfos: list[VarSecinfo]


@dataclass(slots=True)
class Float(BtfType):
    size: int


@dataclass(slots=True)
class DeclTag(BtfType):
    type: int
    component_idx: int  # -1: the type itself, else member/param index


def refs(t: BtfType) -> Iterator[int]:
    """Every type id `t` refers to."""
    match t:
        case Ref() | Func() | Var() | DeclTag():
            yield t.type
        case Array():
            yield t.type
            yield t.index_type
        case FuncProto():
            yield t.type
            for p in t.params:
                yield p.type
        case Composite():
            for m in t.members:
                yield m.type
        case Datasec():
            for s in t.secinfos:
                yield s.type
