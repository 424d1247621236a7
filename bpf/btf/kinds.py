"""BTF's vocabulary: kind numbers, encoding bits, BtfError and a class per kind.

Leaf module: everything else in the btf_* modules builds on it. Code
dispatches on a type's class (match): Ptr, Typedef, Const... share Ref's
fields, Struct and Union share Composite's. ENUM and ENUM64 are both an
Enum, told apart by `kind` (only their encoding differs). `kind` is also
kept on every type: it is what the blob holds.
"""

from __future__ import annotations

from collections.abc import Iterator

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


class _Record:
    """Equality and repr over every field (__slots__, base class first).

    Plain slotted classes, not dataclasses: 26 @dataclass(slots=True) cost
    ~49 M instructions (~6 ms) at every import of the client, which decodes
    with BTF (issue #15). Each __init__ sets every field itself (no chained
    base __init__): the broker builds ~127,000 of these from vmlinux BTF.
    Unhashable, as the dataclasses were.
    """

    __slots__ = ()

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, n) for n in _field_names(type(self)))

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._fields() == other._fields()

    def __repr__(self) -> str:
        pairs = ", ".join(f"{n}={getattr(self, n)!r}" for n in _field_names(type(self)))
        return f"{type(self).__name__}({pairs})"


def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(n for c in reversed(cls.__mro__) for n in c.__dict__.get("__slots__", ()))


class BtfType(_Record):
    """Common part of every type: id (0 = void), kind (KIND_*), name."""

    __slots__ = ("id", "kind", "name", "name_off", "kind_flag")

    def __init__(self, id: int, kind: int, name: str, name_off: int, kind_flag: bool) -> None:
        self.id = id
        self.kind = kind
        self.name = name
        self.name_off = name_off
        self.kind_flag = kind_flag

    @property
    def kind_name(self) -> str:
        return KIND_NAMES.get(self.kind, f"KIND_{self.kind}")


class Void(BtfType):
    """Type id 0."""

    __slots__ = ()


class Int(BtfType):
    __slots__ = ("size", "encoding", "bit_offset", "bits")
    # encoding: INT_SIGNED | INT_CHAR | INT_BOOL

    def __init__(
        self,
        id: int,
        kind: int,
        name: str,
        name_off: int,
        kind_flag: bool,
        size: int,
        encoding: int,
        bit_offset: int,
        bits: int,
    ) -> None:
        self.id = id
        self.kind = kind
        self.name = name
        self.name_off = name_off
        self.kind_flag = kind_flag
        self.size = size
        self.encoding = encoding
        self.bit_offset = bit_offset
        self.bits = bits

    @property
    def signed(self) -> bool:
        return bool(self.encoding & INT_SIGNED)


class Ref(BtfType):
    """PTR, TYPEDEF, VOLATILE, CONST, RESTRICT, TYPE_TAG: a reference to `type`."""

    __slots__ = ("type",)

    def __init__(
        self,
        id: int,
        kind: int,
        name: str,
        name_off: int,
        kind_flag: bool,
        type: int,
    ) -> None:
        self.id = id
        self.kind = kind
        self.name = name
        self.name_off = name_off
        self.kind_flag = kind_flag
        self.type = type


class Ptr(Ref):
    """PTR: the only Ref resolve() does not skip."""

    __slots__ = ()


class Typedef(Ref):
    """TYPEDEF: `name` is the typedef's own name."""

    __slots__ = ()


class Volatile(Ref):
    """VOLATILE qualifier."""

    __slots__ = ()


class Const(Ref):
    """CONST qualifier."""

    __slots__ = ()


class Restrict(Ref):
    """RESTRICT qualifier."""

    __slots__ = ()


class TypeTag(Ref):
    """TYPE_TAG: an attribute (`__user`...) on the type it refers to."""

    __slots__ = ()


# The Ref class of each Ref kind.
REF_CLASSES: dict[int, type[Ref]] = {
    KIND_PTR: Ptr,
    KIND_TYPEDEF: Typedef,
    KIND_VOLATILE: Volatile,
    KIND_CONST: Const,
    KIND_RESTRICT: Restrict,
    KIND_TYPE_TAG: TypeTag,
}


class Array(BtfType):
    __slots__ = ("type", "index_type", "nelems")

    def __init__(
        self,
        id: int,
        kind: int,
        name: str,
        name_off: int,
        kind_flag: bool,
        type: int,
        index_type: int,
        nelems: int,
    ) -> None:
        self.id = id
        self.kind = kind
        self.name = name
        self.name_off = name_off
        self.kind_flag = kind_flag
        self.type = type
        self.index_type = index_type
        self.nelems = nelems


class Member(_Record):
    __slots__ = ("name", "name_off", "type", "bit_offset", "bitfield_size")
    # bitfield_size: 0 unless the struct's kind_flag is set and this is a bitfield

    def __init__(
        self,
        name: str,
        name_off: int,
        type: int,
        bit_offset: int,
        bitfield_size: int,
    ) -> None:
        self.name = name
        self.name_off = name_off
        self.type = type
        self.bit_offset = bit_offset
        self.bitfield_size = bitfield_size


class Composite(BtfType):
    """STRUCT or UNION."""

    __slots__ = ("size", "members")

    def __init__(
        self,
        id: int,
        kind: int,
        name: str,
        name_off: int,
        kind_flag: bool,
        size: int,
        members: list[Member],
    ) -> None:
        self.id = id
        self.kind = kind
        self.name = name
        self.name_off = name_off
        self.kind_flag = kind_flag
        self.size = size
        self.members = members


class Struct(Composite):
    """STRUCT."""

    __slots__ = ()


class Union(Composite):
    """UNION: every member at offset 0."""

    __slots__ = ()


class EnumValue(_Record):
    __slots__ = ("name", "name_off", "value")

    def __init__(self, name: str, name_off: int, value: int) -> None:
        self.name = name
        self.name_off = name_off
        self.value = value


class Enum(BtfType):
    """ENUM or ENUM64; kind_flag set = signed values."""

    __slots__ = ("size", "values")

    def __init__(
        self,
        id: int,
        kind: int,
        name: str,
        name_off: int,
        kind_flag: bool,
        size: int,
        values: list[EnumValue],
    ) -> None:
        self.id = id
        self.kind = kind
        self.name = name
        self.name_off = name_off
        self.kind_flag = kind_flag
        self.size = size
        self.values = values

    @property
    def signed(self) -> bool:
        return self.kind_flag


class Fwd(BtfType):
    """Forward declaration; kind_flag set = union, else struct."""

    __slots__ = ()


class _Linked(BtfType):
    """A type with linkage: FUNC (type: its FUNC_PROTO id) and VAR (type: the variable's)."""

    __slots__ = ("type", "linkage")

    def __init__(
        self,
        id: int,
        kind: int,
        name: str,
        name_off: int,
        kind_flag: bool,
        type: int,
        linkage: int,
    ) -> None:
        self.id = id
        self.kind = kind
        self.name = name
        self.name_off = name_off
        self.kind_flag = kind_flag
        self.type = type
        self.linkage = linkage


class Func(_Linked):
    __slots__ = ()


class Param(_Record):
    __slots__ = ("name", "name_off", "type")

    def __init__(self, name: str, name_off: int, type: int) -> None:
        self.name = name
        self.name_off = name_off
        self.type = type


class FuncProto(BtfType):
    __slots__ = ("type", "params")
    # type: return type (0 = void)

    def __init__(
        self,
        id: int,
        kind: int,
        name: str,
        name_off: int,
        kind_flag: bool,
        type: int,
        params: list[Param],
    ) -> None:
        self.id = id
        self.kind = kind
        self.name = name
        self.name_off = name_off
        self.kind_flag = kind_flag
        self.type = type
        self.params = params


class Var(_Linked):
    __slots__ = ()


class VarSecinfo(_Record):
    __slots__ = ("type", "offset", "size")
    # type: VAR (or FUNC for .ksyms) id

    def __init__(self, type: int, offset: int, size: int) -> None:
        self.type = type
        self.offset = offset
        self.size = size


class Datasec(BtfType):
    __slots__ = ("size", "secinfos")

    def __init__(
        self,
        id: int,
        kind: int,
        name: str,
        name_off: int,
        kind_flag: bool,
        size: int,
        secinfos: list[VarSecinfo],
    ) -> None:
        self.id = id
        self.kind = kind
        self.name = name
        self.name_off = name_off
        self.kind_flag = kind_flag
        self.size = size
        self.secinfos = secinfos


class Float(BtfType):
    __slots__ = ("size",)

    def __init__(
        self,
        id: int,
        kind: int,
        name: str,
        name_off: int,
        kind_flag: bool,
        size: int,
    ) -> None:
        self.id = id
        self.kind = kind
        self.name = name
        self.name_off = name_off
        self.kind_flag = kind_flag
        self.size = size


class DeclTag(BtfType):
    __slots__ = ("type", "component_idx")
    # component_idx: -1: the type itself, else member/param index

    def __init__(
        self,
        id: int,
        kind: int,
        name: str,
        name_off: int,
        kind_flag: bool,
        type: int,
        component_idx: int,
    ) -> None:
        self.id = id
        self.kind = kind
        self.name = name
        self.name_off = name_off
        self.kind_flag = kind_flag
        self.type = type
        self.component_idx = component_idx


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
