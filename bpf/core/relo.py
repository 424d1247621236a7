"""CO-RE relocation records: their kinds, access strings and parsed specs.

clang writes one `bpf_core_relo` record per relocatable instruction into
.BTF.ext (btf/ext.py reads them: insn_off, type_id, access_str_off, kind).
This module turns a record into a Spec: the chain of accessors that the
access string "0:1:2" walks through the object's own (local) BTF, and the
bit offset it reaches. match.py finds the same chain in a target BTF;
resolve.py computes the values; patch.py writes them into code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from gfxbpf.bpf.btf.kinds import Array, BtfError, Composite, Enum
from gfxbpf.bpf.btf.table import TypeTable
from gfxbpf.bpf.errors import InputError

# libbpf's limit on the accessors of one spec (and on target nesting).
SPEC_MAX_LEN = 64


class CoreKind(IntEnum):
    """enum bpf_core_relo_kind."""

    FIELD_BYTE_OFFSET = 0
    FIELD_BYTE_SIZE = 1
    FIELD_EXISTS = 2
    FIELD_SIGNED = 3
    FIELD_LSHIFT_U64 = 4
    FIELD_RSHIFT_U64 = 5
    TYPE_ID_LOCAL = 6
    TYPE_ID_TARGET = 7
    TYPE_EXISTS = 8
    TYPE_SIZE = 9
    ENUMVAL_EXISTS = 10
    ENUMVAL_VALUE = 11
    TYPE_MATCHES = 12


# The short names libbpf prints, used by `inspect` too.
KIND_NAMES = {
    CoreKind.FIELD_BYTE_OFFSET: "byte_off",
    CoreKind.FIELD_BYTE_SIZE: "byte_sz",
    CoreKind.FIELD_EXISTS: "field_exists",
    CoreKind.FIELD_SIGNED: "signed",
    CoreKind.FIELD_LSHIFT_U64: "lshift_u64",
    CoreKind.FIELD_RSHIFT_U64: "rshift_u64",
    CoreKind.TYPE_ID_LOCAL: "local_type_id",
    CoreKind.TYPE_ID_TARGET: "target_type_id",
    CoreKind.TYPE_EXISTS: "type_exists",
    CoreKind.TYPE_MATCHES: "type_matches",
    CoreKind.TYPE_SIZE: "type_size",
    CoreKind.ENUMVAL_EXISTS: "enumval_exists",
    CoreKind.ENUMVAL_VALUE: "enumval_value",
}

FIELD_KINDS = frozenset(range(CoreKind.FIELD_BYTE_OFFSET, CoreKind.FIELD_RSHIFT_U64 + 1))
TYPE_KINDS = frozenset(
    {
        CoreKind.TYPE_ID_LOCAL,
        CoreKind.TYPE_ID_TARGET,
        CoreKind.TYPE_EXISTS,
        CoreKind.TYPE_SIZE,
        CoreKind.TYPE_MATCHES,
    }
)
ENUMVAL_KINDS = frozenset({CoreKind.ENUMVAL_EXISTS, CoreKind.ENUMVAL_VALUE})


class CoreError(ValueError, InputError):
    """A CO-RE relocation cannot be applied (libbpf refuses the object too)."""


def kind_name(kind: int) -> str:
    try:
        return KIND_NAMES[CoreKind(kind)]
    except ValueError:
        return f"kind {kind}"


def essential_name(name: str) -> str:
    """The name without its `___flavour` suffix: the part before the last X___Y.

    X and Y must not be underscores themselves, so `a____b` (four) is not
    a flavour separator at its first underscore but may be at a later one.
    """
    for i in range(len(name) - 5, -1, -1):
        if name[i] != "_" and name[i + 1 : i + 4] == "___" and name[i + 4] != "_":
            return name[: i + 1]
    return name


@dataclass(frozen=True, slots=True)
class Accessor:
    """One semantically meaningful step: a named member, or an array index (name None)."""

    type_id: int  # the composite (member) or element type (index)
    idx: int
    name: str | None


@dataclass(slots=True)
class Spec:
    """A relocation's access chain in one BTF (local or a candidate target)."""

    btf: TypeTable
    root_type_id: int
    kind: int
    accessors: list[Accessor] = field(default_factory=list)
    raw: list[int] = field(default_factory=list)  # every step, anonymous members included
    bit_offset: int = 0

    def describe(self) -> str:
        """C-like view of the access: `task_struct.pid`, `[0]`, `::VALUE`, or the type."""
        t = self.btf.types[self.root_type_id]
        root = f"{t.kind_name.lower()} {t.name or '<anon>'}"
        if self.kind in TYPE_KINDS:
            return root
        if self.kind in ENUMVAL_KINDS:
            return f"{root}::{self.accessors[0].name}"
        path = ""
        for i, acc in enumerate(self.accessors):
            if acc.name is not None:
                path += f".{acc.name}"
            elif i > 0 or acc.idx > 0:
                path += f"[{acc.idx}]"
        return root + path


def parse_access(text: str) -> list[int]:
    """'0:1:2' -> [0, 1, 2]; CoreError on anything else."""
    if not text or text.startswith(":"):
        raise CoreError(f"access string {text!r} is empty or starts with ':'")
    out = []
    for part in text.split(":"):
        if not part or not (part.isdigit() or (part[0] == "-" and part[1:].isdigit())):
            raise CoreError(f"access string {text!r} is not colon-separated numbers")
        out.append(int(part))
    if len(out) > SPEC_MAX_LEN:
        raise CoreError(f"access string {text!r} has more than {SPEC_MAX_LEN} steps")
    return out


def size_of(btf: TypeTable, type_id: int) -> int:
    try:
        return btf.size_of(type_id)
    except BtfError as e:
        raise CoreError(str(e)) from None


def is_flex_array(btf: TypeTable, parent: Accessor | None, arr: Array) -> bool:
    """An array of 0 elements that is the last member of the struct it was reached by name."""
    if parent is None or parent.name is None or arr.nelems > 0:
        return False
    t = btf.types[parent.type_id]
    return isinstance(t, Composite) and parent.idx == len(t.members) - 1


def parse_spec(btf: TypeTable, type_id: int, access: str, kind: int) -> Spec:
    """The local spec of one record: its accessors and bit offset in `btf`."""
    if not 0 < type_id < len(btf.types):
        raise CoreError(f"relocation type id {type_id} is not a type of the object's BTF")
    spec = Spec(btf, type_id, kind)
    if kind in TYPE_KINDS:
        if access != "0":
            raise CoreError(f"type relocation with access string {access!r} (expected '0')")
        return spec
    spec.raw = parse_access(access)
    tid = btf.resolve(type_id)
    first = spec.raw[0]
    if kind in ENUMVAL_KINDS:
        t = btf.types[tid]
        if not isinstance(t, Enum) or len(spec.raw) > 1 or not 0 <= first < len(t.values):
            raise CoreError(f"enum relocation on [{type_id}] {access!r} is not an enumerator")
        spec.accessors.append(Accessor(tid, first, t.values[first].name))
        return spec
    if kind not in FIELD_KINDS:
        raise CoreError(f"unknown CO-RE relocation kind {kind}")
    spec.accessors.append(Accessor(tid, first, None))
    spec.bit_offset = first * size_of(btf, tid) * 8
    for step in spec.raw[1:]:
        tid = _walk(spec, btf, tid, step, access)
    return spec


def _walk(spec: Spec, btf: TypeTable, tid: int, step: int, access: str) -> int:
    """One step of the access string from type tid; returns the type reached."""
    t = btf.resolve_type(tid)
    tid = t.id
    if isinstance(t, Composite):
        if not 0 <= step < len(t.members):
            raise CoreError(f"access {access!r}: member #{step} of [{tid}] does not exist")
        m = t.members[step]
        spec.bit_offset += m.bit_offset
        if m.name:
            spec.accessors.append(Accessor(tid, step, m.name))
        return m.type
    if isinstance(t, Array):
        elem = btf.resolve(t.type)
        parent = spec.accessors[-1] if spec.accessors else None
        if not is_flex_array(btf, parent, t) and not 0 <= step < t.nelems:
            raise CoreError(f"access {access!r}: index {step} past the {t.nelems} elements")
        spec.accessors.append(Accessor(elem, step, None))
        spec.bit_offset += step * size_of(btf, elem) * 8
        return elem
    raise CoreError(
        f"access {access!r} steps into [{tid}] {t.kind_name} '{t.name}', "
        "which is neither a struct, a union nor an array"
    )
