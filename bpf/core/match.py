"""CO-RE matching: which target types are candidates, and whether a spec fits one.

The rules are libbpf's (1.1), restated:
- candidates of a local type are the target types of a compatible kind (the
  same kind, or ENUM with ENUM64) whose essential name (without
  `___flavour`) equals the local type's essential name, in type id order;
- a field spec matches a candidate when every named member along the chain
  exists by name (anonymous structs and unions are searched through), every
  array index is within bounds (a flexible array at the end of a struct has
  none), and each matched member's type is field-compatible;
- type-based relocations use `types_are_compat`, TYPE_MATCHES the stricter
  `types_match`;
- an enumerator matches by essential name.
"""

from __future__ import annotations

from gfxbpf.bpf.btf.kinds import (
    KIND_ENUM,
    KIND_ENUM64,
    KIND_STRUCT,
    KIND_UNION,
    Array,
    BtfType,
    Composite,
    Enum,
    Float,
    FuncProto,
    Fwd,
    Int,
    Ptr,
    Void,
)
from gfxbpf.bpf.btf.table import TypeTable
from gfxbpf.bpf.core.relo import (
    ENUMVAL_KINDS,
    SPEC_MAX_LEN,
    TYPE_KINDS,
    Accessor,
    CoreError,
    CoreKind,
    Spec,
    essential_name,
    is_flex_array,
    size_of,
)

MAX_LEVEL = 32  # recursion budget of the type comparisons, as in libbpf


def _is_enum(t: BtfType) -> bool:
    return t.kind in (KIND_ENUM, KIND_ENUM64)


def kinds_compat(a: BtfType, b: BtfType) -> bool:
    """Same BTF kind, or both some enum."""
    return a.kind == b.kind or (_is_enum(a) and _is_enum(b))


def _skip(btf: TypeTable, tid: int) -> BtfType:
    try:
        return btf.resolve_type(tid)
    except Exception as e:
        raise CoreError(f"type [{tid}]: {e}") from None


def _essential_eq(a: str, b: str) -> bool:
    return essential_name(a) == essential_name(b)


# ------------------------------------------------------- field compatibility


def fields_compat(lbtf: TypeTable, lid: int, tbtf: TypeTable, tid: int) -> bool:
    """Whether a local member type can be relocated onto a target member type."""
    for _ in range(MAX_LEVEL * 4):  # arrays of arrays; real types nest far less
        lt, tt = _skip(lbtf, lid), _skip(tbtf, tid)
        if isinstance(lt, Composite) and isinstance(tt, Composite):
            return True
        if not kinds_compat(lt, tt):
            return False
        if isinstance(lt, (Ptr, Float)):
            return True
        if isinstance(lt, (Fwd, Enum)):
            ln, tn = essential_name(lt.name), essential_name(tt.name)
            return not ln or not tn or ln == tn
        if isinstance(lt, Int) and isinstance(tt, Int):
            return lt.bit_offset == 0 and tt.bit_offset == 0
        if isinstance(lt, Array) and isinstance(tt, Array):
            lid, tid = lt.type, tt.type
            continue
        return False
    raise CoreError(f"types [{lid}] and [{tid}] nest too deep to compare")


def _member_in(
    lbtf: TypeTable, local: Accessor, tbtf: TypeTable, tid: int, spec: Spec
) -> tuple[int, int | None]:
    """Find the local accessor's member by name in target composite tid.

    Anonymous members are searched depth first. Returns (1, next type id) on a
    compatible match, (0, None) when absent or incompatible; `spec` grows by
    the raw steps and bit offset of the way there.
    """
    tt = _skip(tbtf, tid)
    if not isinstance(tt, Composite):
        return 0, None
    lt = lbtf.types[local.type_id]
    if not isinstance(lt, Composite) or not 0 <= local.idx < len(lt.members):
        raise CoreError(f"local accessor [{local.type_id}] #{local.idx} is not a member")
    lmember = lt.members[local.idx]
    for i, m in enumerate(tt.members):
        if len(spec.raw) >= SPEC_MAX_LEN:
            raise CoreError("target type nests structs, unions and arrays too deep")
        spec.bit_offset += m.bit_offset
        spec.raw.append(i)
        if not m.name:
            found, nxt = _member_in(lbtf, local, tbtf, m.type, spec)
            if found:
                return found, nxt
        elif m.name == lmember.name:
            if fields_compat(lbtf, lmember.type, tbtf, m.type):
                spec.accessors.append(Accessor(tt.id, i, m.name))
                return 1, m.type
            return 0, m.type
        spec.bit_offset -= m.bit_offset
        spec.raw.pop()
    return 0, None


def match_field_spec(local: Spec, tbtf: TypeTable, root: int) -> Spec | None:
    """The target spec of a field relocation on candidate root, or None if it does not fit."""
    spec = Spec(tbtf, root, local.kind)
    tid = root
    for i, acc in enumerate(local.accessors):
        tid = _skip(tbtf, tid).id
        if acc.name is not None:
            found, nxt = _member_in(local.btf, acc, tbtf, tid, spec)
            if not found or nxt is None:
                return None
            tid = nxt
            continue
        if i > 0:
            arr = tbtf.types[tid]
            if not isinstance(arr, Array):
                return None
            parent = spec.accessors[-1] if spec.accessors else None
            if not is_flex_array(tbtf, parent, arr) and acc.idx >= arr.nelems:
                return None
            tid = _skip(tbtf, arr.type).id
        if len(spec.raw) >= SPEC_MAX_LEN:
            raise CoreError("target type nests structs, unions and arrays too deep")
        spec.accessors.append(Accessor(tid, acc.idx, None))
        spec.raw.append(acc.idx)
        spec.bit_offset += acc.idx * size_of(tbtf, tid) * 8
    return spec


def match_enumval_spec(local: Spec, tbtf: TypeTable, root: int) -> Spec | None:
    """The target enumerator with the local one's essential name, if any."""
    t = _skip(tbtf, root)
    if not isinstance(t, Enum):
        return None
    want = essential_name(local.accessors[0].name or "")
    for i, v in enumerate(t.values):
        if essential_name(v.name) == want:
            return Spec(tbtf, root, local.kind, [Accessor(t.id, i, v.name)], [i])
    return None


def match_spec(local: Spec, tbtf: TypeTable, root: int) -> Spec | None:
    """Match a local spec against candidate `root` of target BTF: its spec, or None."""
    if local.kind == CoreKind.TYPE_MATCHES:
        ok = types_match(local.btf, local.root_type_id, tbtf, root)
        return Spec(tbtf, root, local.kind) if ok else None
    if local.kind in ENUMVAL_KINDS:
        return match_enumval_spec(local, tbtf, root)
    if local.kind not in TYPE_KINDS:
        return match_field_spec(local, tbtf, root)
    ok = types_are_compat(local.btf, local.root_type_id, tbtf, root)
    return Spec(tbtf, root, local.kind) if ok else None


# ------------------------------------------------------ type compatibility


def types_are_compat(
    lbtf: TypeTable, lid: int, tbtf: TypeTable, tid: int, level: int = MAX_LEVEL
) -> bool:
    """The loose rule of type-based relocations (names past the root are ignored)."""
    if not kinds_compat(lbtf.types[lid], tbtf.types[tid]):
        return False
    for _ in range(MAX_LEVEL):
        lt, tt = _skip(lbtf, lid), _skip(tbtf, tid)
        if not kinds_compat(lt, tt):
            return False
        if isinstance(lt, (Void, Composite, Enum, Fwd)):
            return True
        if isinstance(lt, Int) and isinstance(tt, Int):
            return lt.bit_offset == 0 and tt.bit_offset == 0
        if isinstance(lt, Ptr) and isinstance(tt, Ptr):
            lid, tid = lt.type, tt.type
        elif isinstance(lt, Array) and isinstance(tt, Array):
            lid, tid = lt.type, tt.type
        elif isinstance(lt, FuncProto) and isinstance(tt, FuncProto):
            if len(lt.params) != len(tt.params):
                return False
            for lp, tp in zip(lt.params, tt.params, strict=True):
                if level <= 0:
                    raise CoreError("function prototypes nest too deep to compare")
                lpid, tpid = _skip(lbtf, lp.type).id, _skip(tbtf, tp.type).id
                if not types_are_compat(lbtf, lpid, tbtf, tpid, level - 1):
                    return False
            lid, tid = _skip(lbtf, lt.type).id, _skip(tbtf, tt.type).id
        else:
            return False
    raise CoreError(f"types [{lid}] and [{tid}] nest too deep to compare")


def _names_match(local: str, target: str) -> bool:
    if not target:
        return not local
    return _essential_eq(local, target)


def _enums_match(lt: Enum, tt: Enum) -> bool:
    if lt.size != tt.size or len(lt.values) > len(tt.values):
        return False
    return all(any(_names_match(lv.name, tv.name) for tv in tt.values) for lv in lt.values)


def _composites_match(
    lbtf: TypeTable, lt: Composite, tbtf: TypeTable, tt: Composite, behind_ptr: bool, level: int
) -> bool:
    if len(lt.members) > len(tt.members):
        return False
    for lm in lt.members:
        if not any(
            _names_match(lm.name, tm.name)
            and types_match(lbtf, lm.type, tbtf, tm.type, behind_ptr, level - 1)
            for tm in tt.members
        ):
            return False
    return True


def _fwd_match(lt: Fwd, tt: BtfType, behind_ptr: bool) -> bool:
    # A FWD's kind_flag says union (set) or struct (clear).
    if tt.kind == lt.kind:
        return lt.kind_flag == tt.kind_flag
    if not behind_ptr:
        return False
    return (tt.kind == KIND_STRUCT and not lt.kind_flag) or (tt.kind == KIND_UNION and lt.kind_flag)


def _composite_vs(
    lbtf: TypeTable, lt: Composite, tbtf: TypeTable, tt: BtfType, behind_ptr: bool, level: int
) -> bool:
    if behind_ptr:
        if lt.kind == tt.kind:
            return True
        return isinstance(tt, Fwd) and (lt.kind == KIND_UNION) == tt.kind_flag
    if lt.kind != tt.kind or not isinstance(tt, Composite):
        return False
    return _composites_match(lbtf, lt, tbtf, tt, behind_ptr, level)


def types_match(
    lbtf: TypeTable,
    lid: int,
    tbtf: TypeTable,
    tid: int,
    behind_ptr: bool = False,
    level: int = MAX_LEVEL,
) -> bool:
    """The strict rule of TYPE_MATCHES: same shape, members by name, same int sign and size."""
    if level <= 0:
        raise CoreError("types nest too deep to match")
    for _ in range(MAX_LEVEL):
        lt, tt = _skip(lbtf, lid), _skip(tbtf, tid)
        if not _names_match(lt.name, tt.name):
            return False
        if isinstance(lt, Ptr) or isinstance(lt, Array):
            step = _step_ptr_array(lt, tt)
            if step is None:
                return False
            behind_ptr = behind_ptr or isinstance(lt, Ptr)
            lid, tid = step
            continue
        if isinstance(lt, FuncProto):
            step = _step_proto(lbtf, lt, tbtf, tt, behind_ptr, level)
            if step is None:
                return False
            lid, tid = step
            continue
        return _leaf_match(lbtf, lt, tbtf, tt, behind_ptr, level)
    raise CoreError(f"types [{lid}] and [{tid}] nest too deep to match")


def _step_ptr_array(lt: BtfType, tt: BtfType) -> tuple[int, int] | None:
    if isinstance(lt, Ptr) and isinstance(tt, Ptr):
        return lt.type, tt.type
    if isinstance(lt, Array) and isinstance(tt, Array) and lt.nelems == tt.nelems:
        return lt.type, tt.type
    return None


def _step_proto(
    lbtf: TypeTable, lt: FuncProto, tbtf: TypeTable, tt: BtfType, behind_ptr: bool, level: int
) -> tuple[int, int] | None:
    if not isinstance(tt, FuncProto) or len(lt.params) != len(tt.params):
        return None
    for lp, tp in zip(lt.params, tt.params, strict=True):
        if not types_match(lbtf, lp.type, tbtf, tp.type, behind_ptr, level - 1):
            return None
    return lt.type, tt.type


def _leaf_match(
    lbtf: TypeTable, lt: BtfType, tbtf: TypeTable, tt: BtfType, behind_ptr: bool, level: int
) -> bool:
    if isinstance(lt, Void):
        return isinstance(tt, Void)
    if isinstance(lt, Fwd):
        return _fwd_match(lt, tt, behind_ptr)
    if isinstance(lt, Enum):
        return isinstance(tt, Enum) and _enums_match(lt, tt)
    if isinstance(lt, Composite):
        return _composite_vs(lbtf, lt, tbtf, tt, behind_ptr, level)
    if isinstance(lt, Int):
        return isinstance(tt, Int) and lt.size == tt.size and lt.signed == tt.signed
    return False
