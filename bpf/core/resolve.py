"""Resolve one CO-RE relocation: the value the instruction had, and the one it gets.

A pure function of the object's BTF, the record and the target's candidate
types (target.py finds them). Every matching candidate must agree on
the bit offset and the new value, or the relocation is ambiguous and fails.
When no candidate matches, existence kinds resolve to 0 and the others are
poisoned (patch.py turns the instruction into a call of an invalid
helper, which the verifier accepts only in dead code).
"""

from __future__ import annotations

from dataclasses import dataclass

from gfxbpf.bpf.btf.kinds import KIND_ENUM, Composite, Enum, Int, Ptr
from gfxbpf.bpf.btf.table import TypeTable
from gfxbpf.bpf.core.match import match_spec
from gfxbpf.bpf.core.relo import (
    ENUMVAL_KINDS,
    FIELD_KINDS,
    TYPE_KINDS,
    CoreError,
    CoreKind,
    Spec,
    kind_name,
    size_of,
)


@dataclass(slots=True)
class Candidate:
    """A target type with the local type's essential name, and the BTF it lives in."""

    btf_name: str  # "vmlinux" or a module's name
    btf: TypeTable
    type_id: int


@dataclass(slots=True)
class Resolution:
    """What a relocation resolved to (libbpf's bpf_core_relo_res, plus why)."""

    orig_val: int = 0
    new_val: int = 0
    poison: bool = False
    validate: bool = True  # check that the instruction holds orig_val before patching
    fail_memsz_adjust: bool = False  # the load/store size cannot safely change
    orig_sz: int = 0
    new_sz: int = 0
    orig_type_id: int = 0
    new_type_id: int = 0
    target: Spec | None = None
    target_btf: str = ""
    why: str = ""  # why it is poisoned


class _Poison(Exception):
    """The value cannot be computed: poison the instruction."""


@dataclass(slots=True)
class _Field:
    val: int
    size: int = 0  # memory size of a plain field, for load/store size adjustment
    type_id: int = 0
    validate: bool = True


def _field_value(kind: int, spec: Spec | None) -> _Field:
    """A field relocation's value in one spec (None: no target had the field)."""
    if kind == CoreKind.FIELD_EXISTS:
        return _Field(1 if spec else 0)
    if spec is None:
        raise _Poison("the field does not exist in the target")
    btf = spec.btf
    acc = spec.accessors[-1]
    if acc.name is None:  # the access ends in an array element
        sz = size_of(btf, acc.type_id)
        if kind == CoreKind.FIELD_BYTE_OFFSET:
            return _Field(spec.bit_offset // 8, sz, acc.type_id)
        if kind == CoreKind.FIELD_BYTE_SIZE:
            return _Field(sz)
        raise CoreError(f"{kind_name(kind)} relocation cannot apply to an array element")
    t = btf.types[acc.type_id]
    if not isinstance(t, Composite) or not 0 <= acc.idx < len(t.members):
        raise CoreError(f"accessor [{acc.type_id}] #{acc.idx} is not a member")
    member = t.members[acc.idx]
    mt = btf.resolve_type(member.type)
    bit_off, bit_sz = spec.bit_offset, member.bitfield_size
    if bit_sz:
        byte_sz, byte_off = _bitfield_load(mt, bit_off, bit_sz)
    else:
        byte_sz = size_of(btf, mt.id)
        byte_off = bit_off // 8
        bit_sz = byte_sz * 8
    # Offsets and sizes of bitfields are the loader's choice and may differ from
    # clang's, so only signedness and right shifts are checked against the code.
    validate = not member.bitfield_size
    if kind == CoreKind.FIELD_BYTE_OFFSET:
        if member.bitfield_size:
            return _Field(byte_off, validate=validate)
        return _Field(byte_off, byte_sz, mt.id, validate)
    if kind == CoreKind.FIELD_BYTE_SIZE:
        return _Field(byte_sz, validate=validate)
    if kind == CoreKind.FIELD_SIGNED:
        signed = (isinstance(mt, Enum) and mt.signed) or (isinstance(mt, Int) and mt.signed)
        return _Field(int(signed))
    if kind == CoreKind.FIELD_LSHIFT_U64:
        return _Field(64 - (bit_off + bit_sz - byte_off * 8), validate=validate)
    if kind == CoreKind.FIELD_RSHIFT_U64:
        return _Field(64 - bit_sz)
    raise CoreError(f"unknown field relocation kind {kind}")


def _bitfield_load(mt: object, bit_off: int, bit_sz: int) -> tuple[int, int]:
    """(size, offset) of the smallest aligned load that covers a bitfield."""
    byte_sz = getattr(mt, "size", 0)
    if byte_sz <= 0:
        raise CoreError("bitfield of a type without a size")
    byte_off = bit_off // 8 // byte_sz * byte_sz
    while bit_off + bit_sz - byte_off * 8 > byte_sz * 8:
        if byte_sz >= 8:
            raise CoreError("bitfield cannot be read with one 64-bit load")
        byte_sz *= 2
        byte_off = bit_off // 8 // byte_sz * byte_sz
    return byte_sz, byte_off


def _type_value(kind: int, spec: Spec | None) -> int:
    if spec is None:
        return 0  # type relocations say 0 when the type is missing
    if kind == CoreKind.TYPE_ID_TARGET:
        return spec.root_type_id
    if kind in (CoreKind.TYPE_EXISTS, CoreKind.TYPE_MATCHES):
        return 1
    if kind == CoreKind.TYPE_SIZE:
        return size_of(spec.btf, spec.root_type_id)
    raise CoreError(f"unsupported type relocation kind {kind_name(kind)}")


def _enum_value(kind: int, spec: Spec | None) -> int:
    if kind == CoreKind.ENUMVAL_EXISTS:
        return 1 if spec else 0
    if spec is None:
        raise _Poison("the enumerator does not exist in the target")
    acc = spec.accessors[0]
    t = spec.btf.types[acc.type_id]
    if not isinstance(t, Enum) or not 0 <= acc.idx < len(t.values):
        raise CoreError(f"accessor [{acc.type_id}] #{acc.idx} is not an enumerator")
    v = t.values[acc.idx].value
    if t.kind == KIND_ENUM:  # a 32-bit enumerator widens as a signed int
        v &= 0xFFFFFFFF
        v -= (v >> 31) << 32
    return v & 0xFFFFFFFFFFFFFFFF


def calc(local: Spec, target: Spec | None) -> Resolution:
    """Old and new value of a relocation for one target spec (None: no match)."""
    kind = local.kind
    res = Resolution(target=target)
    try:
        if kind in FIELD_KINDS:
            _calc_field(res, kind, local, target)
        elif kind in TYPE_KINDS:
            res.orig_val = _type_value(kind, local)
            res.new_val = _type_value(kind, target)
            # A type id may change when objects are linked: never checked.
            res.validate = kind != CoreKind.TYPE_ID_TARGET
        elif kind in ENUMVAL_KINDS:
            res.orig_val = _enum_value(kind, local)
            res.new_val = _enum_value(kind, target)
        else:
            raise CoreError(f"unknown CO-RE relocation kind {kind}")
    except _Poison as p:
        res.poison, res.why = True, str(p)
    return res


def _calc_field(res: Resolution, kind: int, local: Spec, target: Spec | None) -> None:
    orig = _field_value(kind, local)
    res.orig_val, res.orig_sz, res.orig_type_id, res.validate = (
        orig.val,
        orig.size,
        orig.type_id,
        orig.validate,
    )
    new = _field_value(kind, target)
    res.new_val, res.new_sz, res.new_type_id = new.val, new.size, new.type_id
    if res.orig_sz == res.new_sz or target is None:
        return
    # A load may shrink or grow only where zero extension keeps the value:
    # pointers (32-bit kernels) and unsigned integers.
    ot = local.btf.types[res.orig_type_id]
    nt = target.btf.types[res.new_type_id]
    if isinstance(ot, Ptr) and isinstance(nt, Ptr):
        return
    if isinstance(ot, Int) and isinstance(nt, Int) and ot.encoding != 1 and nt.encoding != 1:
        return
    res.fail_memsz_adjust = True


def resolve(local: Spec, cands: list[Candidate]) -> tuple[Resolution, list[Candidate]]:
    """Resolve against the candidates; returns the result and the candidates that matched.

    The caller keeps the matched list for the next relocation on the same
    local type (libbpf prunes its candidate cache the same way); an empty
    match leaves the list as it was.
    """
    if local.kind == CoreKind.TYPE_ID_LOCAL:
        return Resolution(local.root_type_id, local.root_type_id, validate=False), cands
    best: Resolution | None = None
    kept: list[Candidate] = []
    for cand in cands:
        tspec = match_spec(local, cand.btf, cand.type_id)
        if tspec is None:
            continue
        res = calc(local, tspec)
        res.target_btf = cand.btf_name
        if best is None:
            best = res
        else:
            _check_agree(best, res)
        kept.append(cand)
    if best is None:
        best = calc(local, None)
        if best.poison:
            best.why = _why_missing(local, cands)
        return best, cands
    return best, kept


def _check_agree(first: Resolution, other: Resolution) -> None:
    assert first.target is not None and other.target is not None
    a, b = first.target, other.target
    if a.bit_offset != b.bit_offset:
        raise CoreError(
            f"ambiguous: candidates [{a.root_type_id}] and [{b.root_type_id}] put the field "
            f"at different bit offsets ({a.bit_offset} != {b.bit_offset})"
        )
    if first.poison != other.poison or first.new_val != other.new_val:
        raise CoreError(
            f"ambiguous: candidates [{a.root_type_id}] and [{b.root_type_id}] give different "
            f"results ({first.new_val} != {other.new_val})"
        )


def _why_missing(local: Spec, cands: list[Candidate]) -> str:
    t = local.btf.types[local.root_type_id]
    if not cands:
        return f"no type named {t.name!r} (or a flavour of it) in the target"
    what = "enumerator" if local.kind in ENUMVAL_KINDS else "field"
    ids = ", ".join(f"{c.btf_name}[{c.type_id}]" for c in cands[:4])
    return f"{what} {local.describe()} is in none of the candidates ({ids})"
