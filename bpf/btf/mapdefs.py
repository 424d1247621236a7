"""The `.maps` section: libbpf's BTF-defined map definitions, read from DATASEC `.maps`.

Each map is a VAR of an anonymous struct whose members encode the settings:
`__uint(type, N)` is `int (*type)[N]`, `__type(key, T)` is `T *key`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gfxbpf.bpf.btf.kinds import (
    KIND_DATASEC,
    Array,
    BtfError,
    Datasec,
    Enum,
    FuncProto,
    Member,
    Ptr,
    Struct,
    Var,
)
from gfxbpf.bpf.btf.table import TypeTable

_MAP_INT_FIELDS = (
    "type",
    "max_entries",
    "map_flags",
    "numa_node",
    "pinning",
    "key_size",
    "value_size",
)


@dataclass
class BtfMapDef:
    """One map from the `.maps` DATASEC (libbpf's BTF-defined map convention)."""

    name: str
    map_type: int
    key_size: int = 0
    value_size: int = 0
    max_entries: int = 0
    map_flags: int = 0
    key_type_id: int = 0
    value_type_id: int = 0
    pinning: int = 0
    numa_node: int = 0
    map_extra: int = 0
    offset: int = 0
    var_type_id: int = 0
    # `__array(values, ...)`: "maps" (map-in-map, with the inner map's definition)
    # or "progs" (program array); values_offset is the member's byte offset.
    values_kind: str = ""
    values_offset: int = 0
    inner: BtfMapDef | None = None


def parse_btf_maps(btf: TypeTable) -> list[BtfMapDef]:
    """Map definitions from DATASEC `.maps`, in secinfo order ([] without one)."""
    sec_id = btf.find(".maps", KIND_DATASEC)
    if sec_id is None:
        return []
    sec = btf.types[sec_id]
    assert isinstance(sec, Datasec)
    maps = []
    seen: set[str] = set()
    for si in sec.secinfos:
        var = btf.type_by_id(si.type)
        if not isinstance(var, Var):
            raise BtfError(
                f"DATASEC '.maps' holds type id {si.type} ({var.kind_name}), expected a VAR"
            )
        if var.name in seen:
            raise BtfError(f"map '{var.name}' is defined twice in '.maps'")
        seen.add(var.name)
        maps.append(_parse_map(btf, var, si.offset))
    return maps


def _parse_map(btf: TypeTable, var: Var, offset: int) -> BtfMapDef:
    name = var.name
    if not name:
        raise BtfError(f"VAR type id {var.id} in '.maps' has no name")
    defn = btf.resolve_type(var.type)
    if not isinstance(defn, Struct):
        raise BtfError(
            f"map '{name}': definition is {btf.type_str(var.type)} ({defn.kind_name}), "
            "expected a struct"
        )
    md = _parse_def(btf, name, defn)
    md.offset, md.var_type_id = offset, var.id
    return md


def _parse_def(btf: TypeTable, name: str, defn: Struct, inner: bool = False) -> BtfMapDef:
    """The members of one map definition struct (an outer map's or an inner one's)."""
    md = BtfMapDef(name=name, map_type=0)
    have_type = False
    for m in defn.members:
        mname = m.name
        if mname in _MAP_INT_FIELDS:
            val = _map_int(btf, name, m)
            if mname == "type":
                md.map_type = val
                have_type = True
            elif mname == "key_size":
                _set_size(md, name, "key", val)
            elif mname == "value_size":
                _set_size(md, name, "value", val)
            else:
                setattr(md, mname, val)
        elif mname == "map_extra":
            md.map_extra = _map_long(btf, name, m)
        elif mname in ("key", "value"):
            _set_type(btf, md, m)
        elif mname == "values" and not inner:
            _set_values(btf, md, m)
        else:
            raise BtfError(f"map '{name}': unknown member '{mname or '(anon)'}'")
    if not have_type:
        raise BtfError(f"map '{name}': no 'type' member (__uint(type, ...))")
    return md


def _set_values(btf: TypeTable, md: BtfMapDef, m: Member) -> None:
    """`__array(values, struct inner_def)` (map-in-map) or `__array(values, int (void *))`
    (program array): an array of pointers, initialised through `.rel.maps`."""
    arr = btf.resolve_type(m.type)
    ptr = btf.resolve_type(arr.type) if isinstance(arr, Array) else None
    target = btf.resolve_type(ptr.type) if isinstance(ptr, Ptr) else None
    md.values_offset = m.bit_offset // 8
    if isinstance(target, Struct):
        md.values_kind = "maps"
        md.inner = _parse_def(btf, f"{md.name}.inner", target, inner=True)
    elif isinstance(target, FuncProto):
        md.values_kind = "progs"
    else:
        raise BtfError(
            f"map '{md.name}': member 'values' is {btf.type_str(m.type)}, expected an array "
            "of pointers to a map definition or a function (__array(values, ...))"
        )


def _set_size(md: BtfMapDef, map_name: str, what: str, size: int) -> None:
    cur = getattr(md, f"{what}_size")
    if cur and cur != size:
        raise BtfError(f"map '{map_name}': conflicting {what} size {cur} != {size}")
    setattr(md, f"{what}_size", size)


def _set_type(btf: TypeTable, md: BtfMapDef, m: Member) -> None:
    """`__type(key, T)`, a `T *key` member: key_type_id and key_size (or value_...)."""
    what = m.name
    target = _pointee(btf, m)
    if target is None:
        raise BtfError(
            f"map '{md.name}': member '{what}' is {btf.type_str(m.type)}, expected a "
            f"pointer (__type({what}, T))"
        )
    try:
        size = btf.size_of(target)
    except BtfError as e:
        raise BtfError(f"map '{md.name}': cannot size member '{what}': {e}") from None
    _set_size(md, md.name, what, size)
    setattr(md, f"{what}_type_id", target)


def _pointee(btf: TypeTable, m: Member) -> int | None:
    """The type id member `m` points to, or None when it is no pointer."""
    ptr = btf.resolve_type(m.type)
    return ptr.type if isinstance(ptr, Ptr) else None


def _map_int(btf: TypeTable, map_name: str, m: Member) -> int:
    """`int (*name)[N]` -> N, skipping modifiers and typedefs."""
    target = _pointee(btf, m)
    if target is not None:
        arr = btf.resolve_type(target)
        if isinstance(arr, Array):
            return arr.nelems
    raise BtfError(
        f"map '{map_name}': member '{m.name}' is {btf.type_str(m.type)}, expected "
        f"int (*{m.name})[N] (__uint({m.name}, N))"
    )


def _map_long(btf: TypeTable, map_name: str, m: Member) -> int:
    """map_extra: `int (*)[N]` or libbpf's __ulong (an enum with one value)."""
    t = btf.resolve_type(m.type)
    if isinstance(t, Enum):
        if len(t.values) != 1:
            raise BtfError(
                f"map '{map_name}': member '{m.name}' is an enum with {len(t.values)} values, "
                "expected exactly one (__ulong)"
            )
        return t.values[0].value & 0xFFFFFFFFFFFFFFFF
    return _map_int(btf, map_name, m)
