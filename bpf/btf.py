"""BTF: parse, query, encode, fix up and decode values; BTF-defined maps.

Pure Python, no syscalls. Btf.parse() reads a raw BTF blob (an object's
`.BTF` section or /sys/kernel/btf/vmlinux), Btf.to_bytes() writes it back
(byte for byte when nothing changed), fixup_datasecs() finishes what clang
leaves undone before BPF_BTF_LOAD, decode() turns raw map/event bytes into
Python values, parse_btf_maps() reads the `.maps` definitions. `.BTF.ext`
lives in btf_ext.py and is re-exported here.

Every corrupt input raises BtfError (a ValueError) saying what is wrong and
where (byte offset or type id); nothing else escapes, and nothing recurses
without bound.
"""

from __future__ import annotations

import gc
import itertools
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from gfxbpf.bpf.errors import InputError

__all__ = [
    "BtfError",
    "Btf",
    "BtfType",
    "Void",
    "Int",
    "Ref",
    "Array",
    "Composite",
    "Member",
    "Enum",
    "EnumValue",
    "Fwd",
    "Func",
    "FuncProto",
    "Param",
    "Var",
    "Datasec",
    "VarSecinfo",
    "Float",
    "DeclTag",
    "BtfMapDef",
    "parse_btf_maps",
    "BtfExt",
    "FuncInfo",
    "LineInfo",
    "CoreRelo",
    "pack_func_info",
    "pack_line_info",
    "pack_ext_records",
]

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

# Kinds that resolve() skips.
_MODIFIERS = frozenset({KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT, KIND_TYPE_TAG})
_SIZED = frozenset(
    {KIND_INT, KIND_STRUCT, KIND_UNION, KIND_ENUM, KIND_ENUM64, KIND_DATASEC, KIND_FLOAT}
)
_CHAR_NAMES = frozenset({"char", "signed char", "unsigned char"})
# Nesting limit for recursive walks (arrays of arrays, structs in structs):
# legitimate types nest far less; corrupt ones must not blow the stack.
_MAX_DEPTH = 64
_PTR_SIZE = 8  # BPF is a 64-bit target

_HDR = struct.Struct("<HBBIIIII")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_III = struct.Struct("<III")
_II = struct.Struct("<II")
_IIi = struct.Struct("<IIi")


class BtfError(ValueError, InputError):
    """A BTF blob, .BTF.ext blob or BTF map definition is corrupt or unsupported."""


# --------------------------------------------------------------------------- types


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


# --------------------------------------------------------------------------- Btf


class Btf:
    """A parsed BTF blob. `types[i]` is type id i; `types[0]` is void."""

    def __init__(
        self,
        types: list[BtfType],
        strings: bytes,
        *,
        version: int = BTF_VERSION,
        flags: int = 0,
    ) -> None:
        self.types = types
        self.strings = strings
        self.version = version
        self.flags = flags
        # Original blob and where its sections were, so to_bytes() can keep
        # an unusual header or layout when the section lengths did not change.
        self._orig: bytes | None = None
        self._orig_sections: tuple[int, int, int, int] = (0, 0, 0, 0)
        self._by_name: dict[str, list[int]] | None = None
        self._sizes: dict[int, int] = {}
        self._decoders: dict[int, tuple[int, Callable[[Any, int], Any]]] = {}
        self._str_cache: dict[int, str] = {}

    # ------------------------------------------------------------------ parse

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview) -> Btf:
        data = bytes(data)
        n = len(data)
        if n < BTF_HEADER_LEN:
            raise BtfError(f"BTF blob is {n} bytes, shorter than the {BTF_HEADER_LEN}-byte header")
        magic, version, flags, hdr_len, type_off, type_len, str_off, str_len = _HDR.unpack_from(
            data, 0
        )
        if magic != BTF_MAGIC:
            if magic == 0x9FEB:
                raise BtfError(
                    "BTF blob is big-endian (magic 0x9feb); only little-endian is supported"
                )
            raise BtfError(f"bad BTF magic 0x{magic:04x} at byte offset 0 (expected 0xeb9f)")
        if version != BTF_VERSION:
            raise BtfError(f"unsupported BTF version {version} at byte offset 2 (expected 1)")
        if hdr_len < BTF_HEADER_LEN or hdr_len > n:
            raise BtfError(
                f"BTF hdr_len {hdr_len} at byte offset 4 is invalid (blob is {n} bytes, "
                f"header needs at least {BTF_HEADER_LEN})"
            )
        t_start = hdr_len + type_off
        s_start = hdr_len + str_off
        if t_start + type_len > n:
            raise BtfError(
                f"BTF type section (bytes {t_start}..{t_start + type_len}) runs past the end "
                f"of the {n}-byte blob"
            )
        if s_start + str_len > n:
            raise BtfError(
                f"BTF string section (bytes {s_start}..{s_start + str_len}) runs past the end "
                f"of the {n}-byte blob"
            )
        if t_start < s_start + str_len and s_start < t_start + type_len:
            raise BtfError("BTF type and string sections overlap")
        strings = data[s_start : s_start + str_len]
        if strings and strings[-1] != 0:
            raise BtfError(f"BTF string section at byte offset {s_start} does not end with NUL")
        btf = cls([], strings, version=version, flags=flags)
        # Hundreds of thousands of small acyclic objects: the cyclic GC would
        # rescan them over and over for nothing (about a third of the time).
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            btf.types = btf._parse_types(data, t_start, type_len)
        finally:
            if gc_was_on:
                gc.enable()
        btf._orig = data
        btf._orig_sections = (t_start, type_len, s_start, str_len)
        return btf

    def _parse_types(self, data: bytes, start: int, length: int) -> list[BtfType]:
        mv = memoryview(data)
        end = start + length
        types: list[BtfType] = [Void(0, KIND_VOID, "", 0, False)]
        append = types.append
        self._fill_string_table()
        sget = self._str_cache.get
        slow_name = self._name_at

        def name(off: int) -> str:
            nm = sget(off)
            return nm if nm is not None else slow_name(off)

        hdr = _III.unpack_from
        u32 = _U32.unpack_from
        i32 = _I32.unpack_from
        iter_unpack = struct.iter_unpack
        maxref = 0  # largest referenced type id, checked once at the end
        pos = start
        tid = 0
        while pos < end:
            tid += 1
            if end - pos < 12:
                raise BtfError(
                    f"BTF type id {tid} at byte offset {pos}: truncated header "
                    f"({end - pos} bytes left in the type section, need 12)"
                )
            name_off, info, st = hdr(data, pos)
            kind = (info >> 24) & 0x7F
            vlen = info & 0xFFFFFF
            kflag = bool(info >> 31)
            here = pos
            pos += 12
            try:
                nm = sget(name_off)
                if nm is None:
                    nm = slow_name(name_off)
            except BtfError as e:
                raise BtfError(f"BTF type id {tid} at byte offset {here}: {e}") from None
            if kind in _LIST_REC:
                need = _LIST_REC[kind] * vlen
            else:
                need = _FIXED_TAIL.get(kind, -1)
                if need < 0:
                    raise BtfError(f"BTF type id {tid} at byte offset {here}: unknown kind {kind}")
                if vlen and kind != KIND_FUNC:
                    raise BtfError(
                        f"BTF type id {tid} ({KIND_NAMES[kind]}) at byte offset {here}: "
                        f"vlen must be 0, got {vlen}"
                    )
            if pos + need > end:
                raise BtfError(
                    f"BTF type id {tid} ({KIND_NAMES[kind]}, vlen {vlen}) at byte offset {here}: "
                    f"needs {need} bytes after its header, only {end - pos} left in the types"
                )
            try:
                if kind == KIND_FUNC:
                    if st > maxref:
                        maxref = st
                    append(Func(tid, kind, nm, name_off, kflag, st, vlen))
                elif kind == KIND_FUNC_PROTO:
                    params = []
                    for p_off, p_type in iter_unpack("<II", mv[pos : pos + need]):
                        if p_type > maxref:
                            maxref = p_type
                        params.append(Param(name(p_off), p_off, p_type))
                    if st > maxref:
                        maxref = st
                    append(FuncProto(tid, kind, nm, name_off, kflag, st, params))
                elif kind in _REF_KINDS:
                    if st > maxref:
                        maxref = st
                    append(Ref(tid, kind, nm, name_off, kflag, st))
                elif kind == KIND_STRUCT or kind == KIND_UNION:
                    members = []
                    for m_off, m_type, m_bits in iter_unpack("<III", mv[pos : pos + need]):
                        if m_type > maxref:
                            maxref = m_type
                        if kflag:
                            members.append(
                                Member(name(m_off), m_off, m_type, m_bits & 0xFFFFFF, m_bits >> 24)
                            )
                        else:
                            members.append(Member(name(m_off), m_off, m_type, m_bits, 0))
                    append(Composite(tid, kind, nm, name_off, kflag, st, members))
                elif kind == KIND_ARRAY:
                    a_type, a_index, a_n = hdr(data, pos)
                    if st:
                        raise BtfError(f"ARRAY size_or_type must be 0, got {st}")
                    maxref = max(maxref, a_type, a_index)
                    append(Array(tid, kind, nm, name_off, kflag, a_type, a_index, a_n))
                elif kind == KIND_INT:
                    (w,) = u32(data, pos)
                    bits = w & 0xFFFF
                    if bits > 128:
                        raise BtfError(f"INT has {bits} bits (at most 128)")
                    append(Int(tid, kind, nm, name_off, kflag, st, w >> 24, (w >> 16) & 0xFF, bits))
                elif kind == KIND_ENUM:
                    vals = []
                    fmt = "<Ii" if kflag else "<II"
                    for e_off, e_val in iter_unpack(fmt, mv[pos : pos + need]):
                        vals.append(EnumValue(name(e_off), e_off, e_val))
                    append(Enum(tid, kind, nm, name_off, kflag, st, vals))
                elif kind == KIND_ENUM64:
                    vals = []
                    for e_off, lo, hi in iter_unpack("<III", mv[pos : pos + need]):
                        v = (hi << 32) | lo
                        if kflag and v >= 1 << 63:
                            v -= 1 << 64
                        vals.append(EnumValue(name(e_off), e_off, v))
                    append(Enum(tid, kind, nm, name_off, kflag, st, vals))
                elif kind == KIND_VAR:
                    (linkage,) = u32(data, pos)
                    if st > maxref:
                        maxref = st
                    append(Var(tid, kind, nm, name_off, kflag, st, linkage))
                elif kind == KIND_DATASEC:
                    infos = []
                    for v_type, v_off, v_size in iter_unpack("<III", mv[pos : pos + need]):
                        if v_type > maxref:
                            maxref = v_type
                        infos.append(VarSecinfo(v_type, v_off, v_size))
                    append(Datasec(tid, kind, nm, name_off, kflag, st, infos))
                elif kind == KIND_FWD:
                    if st:
                        raise BtfError(f"FWD size_or_type must be 0, got {st}")
                    append(Fwd(tid, kind, nm, name_off, kflag))
                elif kind == KIND_FLOAT:
                    append(Float(tid, kind, nm, name_off, kflag, st))
                else:  # KIND_DECL_TAG
                    (comp,) = i32(data, pos)
                    if st > maxref:
                        maxref = st
                    append(DeclTag(tid, kind, nm, name_off, kflag, st, comp))
            except BtfError as e:
                raise BtfError(
                    f"BTF type id {tid} ({KIND_NAMES[kind]}) at byte offset {here}: {e}"
                ) from None
            pos += need
        if maxref >= len(types):
            self._report_bad_ref(types)
        return types

    def _report_bad_ref(self, types: list[BtfType]) -> None:
        n = len(types)
        for t in types:
            for ref in _refs(t):
                if ref >= n:
                    raise BtfError(
                        f"BTF type id {t.id} ({t.kind_name} '{t.name}') refers to type id {ref}, "
                        f"past the last type id {n - 1}"
                    )

    def _fill_string_table(self) -> None:
        """Decode every NUL-separated string once: far cheaper than one lookup per name."""
        parts = self.strings.split(b"\0")[:-1]  # the piece after the final NUL is not a string
        offsets = itertools.accumulate((len(p) + 1 for p in parts), initial=0)
        self._str_cache = dict(
            zip(offsets, (p.decode("utf-8", "replace") for p in parts), strict=False)
        )

    def _name_at(self, off: int) -> str:
        s = self._str_cache.get(off)
        if s is not None:
            return s
        strs = self.strings
        if off >= len(strs):
            if off == 0:
                return ""
            raise BtfError(
                f"string offset {off} is past the end of the {len(strs)}-byte string section"
            )
        end = strs.find(b"\0", off)
        if end < 0:
            raise BtfError(f"string at offset {off} has no NUL terminator")
        s = strs[off:end].decode("utf-8", "replace")
        self._str_cache[off] = s
        return s

    def string_at(self, off: int) -> str:
        """The NUL-terminated string at `off` in the string section."""
        return self._name_at(off)

    def add_string(self, s: str) -> int:
        """Append `s` to the string section (or find it) and return its offset."""
        raw = s.encode() + b"\0"
        if not self.strings:
            self.strings = b"\0"
        idx = self.strings.find(raw)  # any offset will do, even inside a longer string
        if idx >= 0:
            return idx
        off = len(self.strings)
        self.strings += raw
        return off

    # ---------------------------------------------------------------- encode

    def _encode_types(self) -> bytes:
        parts: list[bytes] = []
        add = parts.append
        pack3 = _III.pack
        pack2 = _II.pack
        for t in self.types[1:]:
            k = t.kind
            kf = 0x80000000 if t.kind_flag else 0
            if k == KIND_FUNC:
                add(pack3(t.name_off, kf | k << 24 | t.linkage, t.type))
            elif k == KIND_FUNC_PROTO:
                add(pack3(t.name_off, kf | k << 24 | len(t.params), t.type))
                for p in t.params:
                    add(pack2(p.name_off, p.type))
            elif k in _REF_KINDS:
                add(pack3(t.name_off, kf | k << 24, t.type))
            elif k == KIND_STRUCT or k == KIND_UNION:
                add(pack3(t.name_off, kf | k << 24 | len(t.members), t.size))
                if kf:
                    for m in t.members:
                        add(pack3(m.name_off, m.type, m.bitfield_size << 24 | m.bit_offset))
                else:
                    for m in t.members:
                        add(pack3(m.name_off, m.type, m.bit_offset))
            elif k == KIND_ARRAY:
                add(pack3(t.name_off, kf | k << 24, 0))
                add(pack3(t.type, t.index_type, t.nelems))
            elif k == KIND_INT:
                add(pack3(t.name_off, kf | k << 24, t.size))
                add(_U32.pack(t.encoding << 24 | t.bit_offset << 16 | t.bits))
            elif k == KIND_ENUM:
                add(pack3(t.name_off, kf | k << 24 | len(t.values), t.size))
                for v in t.values:
                    add(pack2(v.name_off, v.value & 0xFFFFFFFF))
            elif k == KIND_ENUM64:
                add(pack3(t.name_off, kf | k << 24 | len(t.values), t.size))
                for v in t.values:
                    u = v.value & 0xFFFFFFFFFFFFFFFF
                    add(pack3(v.name_off, u & 0xFFFFFFFF, u >> 32))
            elif k == KIND_VAR:
                add(pack3(t.name_off, kf | k << 24, t.type))
                add(_U32.pack(t.linkage))
            elif k == KIND_DATASEC:
                add(pack3(t.name_off, kf | k << 24 | len(t.secinfos), t.size))
                for s in t.secinfos:
                    add(pack3(s.type, s.offset, s.size))
            elif k == KIND_FWD:
                add(pack3(t.name_off, kf | k << 24, 0))
            elif k == KIND_FLOAT:
                add(pack3(t.name_off, kf | k << 24, t.size))
            elif k == KIND_DECL_TAG:
                add(pack3(t.name_off, kf | k << 24, t.type))
                add(_I32.pack(t.component_idx))
            else:
                raise BtfError(f"cannot encode type id {t.id}: unknown kind {k}")
        return b"".join(parts)

    def to_bytes(self) -> bytes:
        """Encode as a BTF blob.

        When the type and string sections keep their lengths (fixups never
        change them), the original header and layout are kept, so an
        unmodified Btf gives back its input byte for byte. Otherwise the
        result has a plain 24-byte header, types first, then strings.
        """
        try:
            types = self._encode_types()
        except (struct.error, AttributeError, TypeError) as e:
            raise BtfError(f"cannot encode BTF: a type has an invalid field ({e})") from None
        strs = self.strings
        t_start, t_len, s_start, s_len = self._orig_sections
        if self._orig is not None and len(types) == t_len and len(strs) == s_len:
            out = bytearray(self._orig)
            out[2] = self.version
            out[3] = self.flags
            out[t_start : t_start + t_len] = types
            out[s_start : s_start + s_len] = strs
            return bytes(out)
        hdr = _HDR.pack(
            BTF_MAGIC,
            self.version,
            self.flags,
            BTF_HEADER_LEN,
            0,
            len(types),
            len(types),
            len(strs),
        )
        return hdr + types + strs

    # ----------------------------------------------------------------- queries

    def __len__(self) -> int:
        return len(self.types)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Btf):
            return NotImplemented
        return (
            self.version == other.version
            and self.flags == other.flags
            and self.strings == other.strings
            and self.types == other.types
        )

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"<Btf {len(self.types) - 1} types, {len(self.strings)} bytes of strings>"

    def type_by_id(self, type_id: int) -> BtfType:
        if not 0 <= type_id < len(self.types):
            raise BtfError(f"BTF type id {type_id} out of range (last id is {len(self.types) - 1})")
        return self.types[type_id]

    def name_of(self, type_id: int) -> str:
        return self.type_by_id(type_id).name

    def _index(self) -> dict[str, list[int]]:
        if self._by_name is None:
            idx: dict[str, list[int]] = {}
            for t in self.types:
                if t.name:
                    idx.setdefault(t.name, []).append(t.id)
            self._by_name = idx
        return self._by_name

    def find(self, name: str, kind: int | None = None) -> int | None:
        """The first type id named `name` (of `kind` if given), or None."""
        for tid in self._index().get(name, ()):
            if kind is None or self.types[tid].kind == kind:
                return tid
        return None

    def find_all(self, name: str, kind: int | None = None) -> list[int]:
        return [
            tid
            for tid in self._index().get(name, ())
            if kind is None or self.types[tid].kind == kind
        ]

    def resolve(self, type_id: int) -> int:
        """Skip typedef/volatile/const/restrict/type_tag; BtfError on a cycle."""
        types = self.types
        n = len(types)
        t = self.type_by_id(type_id)
        steps = 0
        while t.kind in _MODIFIERS:
            steps += 1
            if steps > n:
                raise BtfError(f"BTF type id {type_id}: reference cycle through typedefs/modifiers")
            nxt = t.type  # type: ignore[attr-defined]
            if nxt >= n:
                raise BtfError(f"BTF type id {t.id} refers to type id {nxt}, past the last type")
            t = types[nxt]
        return t.id

    def resolve_type(self, type_id: int) -> BtfType:
        return self.types[self.resolve(type_id)]

    def size_of(self, type_id: int) -> int:
        """Size in bytes; BtfError for sizeless kinds (void, FUNC, FWD...) or cycles."""
        size = self._sizes.get(type_id)
        if size is None:
            size = self._size(type_id, 0)
            self._sizes[type_id] = size
        return size

    def _size(self, type_id: int, depth: int) -> int:
        if depth > _MAX_DEPTH:
            raise BtfError(f"BTF type id {type_id}: arrays nested too deep (reference cycle?)")
        t = self.type_by_id(self.resolve(type_id))
        k = t.kind
        if k in _SIZED:
            return t.size  # type: ignore[attr-defined]
        if k == KIND_PTR:
            return _PTR_SIZE
        if k == KIND_ARRAY:
            n = t.nelems  # type: ignore[attr-defined]
            return n * self._size(t.type, depth + 1) if n else 0  # type: ignore[attr-defined]
        if k == KIND_VAR:
            return self._size(t.type, depth + 1)  # type: ignore[attr-defined]
        raise BtfError(f"BTF type id {t.id} ({t.kind_name} '{t.name}') has no size")

    def type_str(self, type_id: int) -> str:
        """A C-like name for display: "struct event", "__u64", "char[16]", "int (*)[2]"."""
        return self._type_str(type_id, "", 0)

    def _type_str(self, type_id: int, inner: str, depth: int) -> str:
        if depth > _MAX_DEPTH:
            raise BtfError(f"BTF type id {type_id}: type nests too deep (reference cycle?)")
        t = self.type_by_id(type_id)
        k = t.kind
        if k == KIND_PTR:
            target = self.type_by_id(t.type)  # type: ignore[attr-defined]
            ptr = "*" + inner
            if target.kind in (KIND_ARRAY, KIND_FUNC_PROTO):
                ptr = f"({ptr})"
            return self._type_str(target.id, ptr, depth + 1)
        if k == KIND_ARRAY:
            return self._type_str(t.type, f"{inner}[{t.nelems}]", depth + 1)  # type: ignore[attr-defined]
        if k == KIND_FUNC_PROTO:
            params = []
            for p in t.params:  # type: ignore[attr-defined]
                params.append("..." if p.type == 0 else self._type_str(p.type, p.name, depth + 1))
            return self._type_str(t.type, f"{inner}({', '.join(params) or 'void'})", depth + 1)  # type: ignore[attr-defined]
        if k == KIND_FUNC:
            return self._type_str(t.type, t.name + inner, depth + 1)  # type: ignore[attr-defined]
        if k in (KIND_CONST, KIND_VOLATILE, KIND_RESTRICT):
            word = {KIND_CONST: "const", KIND_VOLATILE: "volatile", KIND_RESTRICT: "restrict"}[k]
            if self.type_by_id(t.type).kind == KIND_PTR:  # type: ignore[attr-defined]
                # `char *const p`: the qualifier binds to the pointer
                return self._type_str(t.type, f"{word} {inner}".rstrip(), depth + 1)  # type: ignore[attr-defined]
            base = self._type_str(t.type, "", depth + 1)  # type: ignore[attr-defined]
            return _join(f"{word} {base}", inner)
        if k == KIND_VAR:
            return self._type_str(t.type, t.name + inner, depth + 1)  # type: ignore[attr-defined]
        if k == KIND_TYPE_TAG:
            return self._type_str(t.type, inner, depth + 1)  # type: ignore[attr-defined]
        if k in (KIND_STRUCT, KIND_UNION, KIND_ENUM, KIND_ENUM64, KIND_FWD):
            word = {KIND_STRUCT: "struct", KIND_UNION: "union", KIND_ENUM64: "enum"}.get(k, "enum")
            if k == KIND_FWD:
                word = "union" if t.kind_flag else "struct"
            return _join(f"{word} {t.name or '(anon)'}", inner)
        if k == KIND_DATASEC:
            return _join(f"datasec {t.name}", inner)
        if k == KIND_DECL_TAG:
            return _join(f"decl_tag {t.name}", inner)
        if k == KIND_VOID:
            return _join("void", inner)
        return _join(t.name or "(anon)", inner)  # INT, FLOAT, TYPEDEF

    # ----------------------------------------------------------------- fixups

    def datasecs(self) -> list[Datasec]:
        """Every DATASEC, so a caller can see which ones fixup_datasecs() left alone."""
        return [t for t in self.types if isinstance(t, Datasec)]

    def fixup_datasecs(self, section_sizes: dict[str, int], symbol_offsets: dict[str, int]) -> None:
        """Finish the DATASECs clang leaves with size 0 and VAR offsets 0.

        For each DATASEC named in `section_sizes` whose size is still 0: set
        its size, and each global VAR's offset from `symbol_offsets` (its ELF
        symbol's st_value). Static VARs already carry their offsets, extern
        VARs have none. Then sort the secinfos by offset, as the kernel
        wants. DATASECs absent from `section_sizes` stay untouched (see
        datasecs()); .kconfig/.ksyms only get sorted.
        """
        self._forget()
        for t in self.types:
            if not isinstance(t, Datasec):
                continue
            if t.name in (".kconfig", ".ksyms"):
                t.secinfos.sort(key=_secinfo_offset)
                continue
            if t.name not in section_sizes:
                continue
            if t.size == 0:
                size = section_sizes[t.name]
                if size <= 0:
                    raise BtfError(f"DATASEC '{t.name}' (type id {t.id}): section size is {size}")
                t.size = size
                for si in t.secinfos:
                    var = self.type_by_id(si.type)
                    if not isinstance(var, Var):
                        raise BtfError(
                            f"DATASEC '{t.name}' (type id {t.id}) holds type id {si.type} "
                            f"({var.kind_name}), expected a VAR"
                        )
                    if var.linkage in (LINKAGE_STATIC, LINKAGE_EXTERN):
                        continue
                    if var.name not in symbol_offsets:
                        raise BtfError(
                            f"DATASEC '{t.name}': no ELF symbol for VAR '{var.name}' "
                            f"(type id {var.id}); the object's symbol table is incomplete"
                        )
                    si.offset = symbol_offsets[var.name]
            t.secinfos.sort(key=_secinfo_offset)

    def set_func_linkage(self, name: str, linkage: int) -> None:
        """Set the linkage of every FUNC named `name` (e.g. make a hidden subprogram static)."""
        funcs = [t for t in self.types if isinstance(t, Func) and t.name == name]
        if not funcs:
            raise BtfError(f"no BTF FUNC named '{name}'")
        for f in funcs:
            f.linkage = linkage
        self._forget()

    def _forget(self) -> None:
        """Drop cached sizes and decoders after a change to the types."""
        self._sizes.clear()
        self._decoders.clear()

    # ----------------------------------------------------------------- decode

    def decode(self, type_id: int, data: bytes | bytearray | memoryview) -> Any:
        """Decode `data` (at least size_of(type_id) bytes) as a Python value."""
        try:
            entry = self._decoders.get(type_id)
            if entry is None:
                entry = self._compile(type_id, ())
            size, fn = entry
            if len(data) < size:
                raise BtfError(
                    f"cannot decode {self.type_str(type_id)} (type id {type_id}): "
                    f"need {size} bytes, got {len(data)}"
                )
            return fn(data, 0)
        except (struct.error, OverflowError) as e:  # corrupt sizes the checks missed
            raise BtfError(f"cannot decode type id {type_id}: {e}") from None

    def decoder(self, type_id: int) -> Callable[[bytes], Any]:
        """A function bytes -> value for `type_id`, compiled once."""
        try:
            size, fn = self._decoders.get(type_id) or self._compile(type_id, ())
        except (struct.error, OverflowError) as e:
            raise BtfError(f"cannot decode type id {type_id}: {e}") from None
        desc = f"type id {type_id}"

        def decode(data: bytes) -> Any:
            if len(data) < size:
                raise BtfError(f"cannot decode {desc}: need {size} bytes, got {len(data)}")
            try:
                return fn(data, 0)
            except struct.error as e:
                raise BtfError(f"cannot decode {desc}: {e}") from None

        return decode

    def _compile(
        self, type_id: int, stack: tuple[int, ...]
    ) -> tuple[int, Callable[[Any, int], Any]]:
        entry = self._decoders.get(type_id)
        if entry is not None:
            return entry
        if type_id in stack or len(stack) > _MAX_DEPTH:
            raise BtfError(f"BTF type id {type_id} contains itself (reference cycle)")
        stack = stack + (type_id,)
        tid = self.resolve(type_id)
        t = self.types[tid]
        k = t.kind
        if tid != type_id:
            entry = self._compile(tid, stack)
        elif k in _NO_VALUE:
            raise BtfError(
                f"cannot decode {self.type_str(type_id)} (type id {type_id}, {t.kind_name}): "
                "it has no value"
            )
        elif k == KIND_VAR:
            entry = self._compile(t.type, stack)  # type: ignore[attr-defined]
        else:
            size = self.size_of(tid) if k != KIND_DATASEC else t.size  # type: ignore[attr-defined]
            sc = self._scalar(tid)
            if sc is not None:
                entry = (size, _scalar_fn(*sc))
            elif k == KIND_INT:
                entry = (size, _odd_int_fn(t))  # type: ignore[arg-type]
            elif k == KIND_ENUM or k == KIND_ENUM64:
                entry = (size, _odd_enum_fn(t))  # type: ignore[arg-type]
            elif k == KIND_FLOAT:
                entry = (size, _raw_fn(size))
            elif k == KIND_ARRAY:
                entry = (size, self._array_fn(t, stack))  # type: ignore[arg-type]
            elif k == KIND_STRUCT or k == KIND_UNION:
                entry = (size, self._composite_fn(t, stack))  # type: ignore[arg-type]
            elif k == KIND_DATASEC:
                entry = (size, self._datasec_fn(t, stack))  # type: ignore[arg-type]
            else:
                raise BtfError(
                    f"cannot decode {self.type_str(type_id)} (type id {type_id}, {t.kind_name})"
                )
        self._decoders[type_id] = entry
        return entry

    def _scalar(self, type_id: int) -> tuple[str, Callable[[Any], Any] | None] | None:
        """(struct format code, post-processing or None) when one code reads this type."""
        t = self.types[self.resolve(type_id)]
        k = t.kind
        if k == KIND_INT:
            if t.bit_offset or t.bits != t.size * 8 or t.size not in _INT_CODES:  # type: ignore[attr-defined]
                return None
            if t.encoding & INT_BOOL:  # type: ignore[attr-defined]
                return _INT_CODES[t.size][0], bool  # type: ignore[attr-defined]
            return _INT_CODES[t.size][t.encoding & INT_SIGNED], None  # type: ignore[attr-defined]
        if k == KIND_PTR:
            return "Q", None
        if k == KIND_ENUM or k == KIND_ENUM64:
            if t.size not in _INT_CODES:  # type: ignore[attr-defined]
                return None
            names = {}
            for v in reversed(t.values):  # type: ignore[attr-defined]
                names[v.value] = v.name  # first enumerator wins on duplicates
            return _INT_CODES[t.size][1 if t.kind_flag else 0], _enum_post(names)  # type: ignore[attr-defined]
        if k == KIND_FLOAT:
            code = {2: "e", 4: "f", 8: "d"}.get(t.size)  # type: ignore[attr-defined]
            return (code, None) if code else None
        if k == KIND_ARRAY and self._is_char(t.type):  # type: ignore[attr-defined]
            return f"{t.nelems}s", _cstr  # type: ignore[attr-defined]
        return None

    def _is_char(self, type_id: int) -> bool:
        t = self.types[self.resolve(type_id)]
        return (
            t.kind == KIND_INT
            and t.size == 1  # type: ignore[attr-defined]
            and (t.name in _CHAR_NAMES or bool(t.encoding & INT_CHAR))  # type: ignore[attr-defined]
        )

    def _array_fn(self, t: Array, stack: tuple[int, ...]) -> Callable[[Any, int], Any]:
        n = t.nelems
        if n == 0:
            return lambda buf, off: []
        sc = self._scalar(t.type)
        if sc is not None and "s" not in sc[0]:
            code, post = sc
            s = struct.Struct(f"<{n}{code}")
            unpack = s.unpack_from
            if post is None:
                return lambda buf, off: list(unpack(buf, off))
            return lambda buf, off: [post(v) for v in unpack(buf, off)]
        esize, efn = self._compile(t.type, stack)
        if esize == 0:
            return lambda buf, off: []  # elements without bytes carry no values
        rng = range(0, n * esize, esize)
        return lambda buf, off: [efn(buf, off + o) for o in rng]

    def _member_plan(self, m: Member, kflag: bool) -> tuple[int, int, int] | None:
        """(bit offset, bit count, resolved type id) when `m` is a bitfield, else None."""
        rid = self.resolve(m.type)
        rt = self.types[rid]
        if kflag and m.bitfield_size:
            return m.bit_offset, m.bitfield_size, rid
        if rt.kind == KIND_INT and (rt.bit_offset or rt.bits != rt.size * 8):  # type: ignore[attr-defined]
            return m.bit_offset + rt.bit_offset, rt.bits, rid  # type: ignore[attr-defined]
        if m.bit_offset % 8:
            if rt.kind in (KIND_INT, KIND_ENUM, KIND_ENUM64):
                return m.bit_offset, self.size_of(rid) * 8, rid
            raise BtfError(
                f"member '{m.name}' (type id {m.type}) starts at bit {m.bit_offset}, "
                "not on a byte boundary"
            )
        return None

    def _composite_fn(self, t: Composite, stack: tuple[int, ...]) -> Callable[[Any, int], Any]:
        is_struct = t.kind == KIND_STRUCT
        fmt = ["<"]
        pos = 0
        nscalar = 0
        # Entries in member order: (kind, name, a, b)
        #   "s": scalar from the combined Struct: a = index, b = post or None
        #   "d": sub-decoder: a = byte offset, b = fn;  "m": same, merged (anonymous)
        #   "b": bitfield: a = (bit offset, bits, signed), b = post or None
        plan: list[tuple[str, str, Any, Any]] = []
        for m in t.members:
            if not m.name and self.types[self.resolve(m.type)].kind not in (
                KIND_STRUCT,
                KIND_UNION,
            ):
                continue  # unnamed padding bitfield
            bf = self._member_plan(m, t.kind_flag)
            if bf is not None:
                bo, nbits, rid = bf
                rt = self.types[rid]
                post = None
                signed = False
                if rt.kind == KIND_INT:
                    signed = rt.signed  # type: ignore[attr-defined]
                    if rt.encoding & INT_BOOL:  # type: ignore[attr-defined]
                        post = bool
                elif rt.kind in (KIND_ENUM, KIND_ENUM64):
                    signed = rt.kind_flag
                    post = self._scalar(rid)[1] if self._scalar(rid) else None  # type: ignore[index]
                if nbits == 0 or nbits > 128 or (bo + nbits + 7) >> 3 > t.size:
                    raise BtfError(
                        f"{self.type_str(t.id)} (type id {t.id}): bitfield '{m.name}' "
                        f"({nbits} bits at bit {bo}) does not fit in {t.size} bytes"
                    )
                plan.append(("b", m.name, (bo, nbits, signed), post))
                continue
            boff = m.bit_offset // 8
            if boff + self.size_of(m.type) > t.size:
                raise BtfError(
                    f"{self.type_str(t.id)} (type id {t.id}): member '{m.name}' at byte {boff} "
                    f"runs past the end ({t.size} bytes)"
                )
            sc = self._scalar(m.type) if is_struct and m.name else None
            if sc is not None and boff >= pos:
                code, post = sc
                if boff > pos:
                    fmt.append(f"{boff - pos}x")
                fmt.append(code)
                pos = boff + self.size_of(m.type)
                plan.append(("s", m.name, nscalar, post))
                nscalar += 1
                continue
            _, fn = self._compile(m.type, stack)
            plan.append(("d" if m.name else "m", m.name, boff, fn))
        unpack = struct.Struct("".join(fmt)).unpack_from
        if nscalar and all(p[0] == "s" and p[3] is None for p in plan):
            names = tuple(p[1] for p in plan)
            return lambda buf, off: dict(zip(names, unpack(buf, off), strict=True))
        steps = tuple(plan)

        def decode(buf: Any, off: int) -> dict[str, Any]:
            vals = unpack(buf, off) if nscalar else ()
            out: dict[str, Any] = {}
            for kind, name, a, b in steps:
                if kind == "s":
                    v = vals[a]
                    out[name] = v if b is None else b(v)
                elif kind == "d":
                    out[name] = b(buf, off + a)
                elif kind == "m":
                    out.update(b(buf, off + a))
                else:
                    bo, nbits, signed = a
                    start = off + (bo >> 3)
                    shift = bo & 7
                    raw = int.from_bytes(buf[start : start + ((shift + nbits + 7) >> 3)], "little")
                    v = (raw >> shift) & ((1 << nbits) - 1)
                    if signed and v >> (nbits - 1):
                        v -= 1 << nbits
                    out[name] = v if b is None else b(v)
            return out

        return decode

    def _datasec_fn(self, t: Datasec, stack: tuple[int, ...]) -> Callable[[Any, int], Any]:
        parts = []
        for si in t.secinfos:
            var = self.type_by_id(si.type)
            if not isinstance(var, Var):
                continue  # .ksyms FUNCs have no bytes
            if si.offset + si.size > t.size:
                raise BtfError(
                    f"DATASEC '{t.name}': VAR '{var.name}' at offset {si.offset} size {si.size} "
                    f"is past the section's {t.size} bytes (run fixup_datasecs first?)"
                )
            _, fn = self._compile(var.type, stack)
            parts.append((var.name, si.offset, fn))
        return lambda buf, off: {name: fn(buf, off + o) for name, o, fn in parts}


# ------------------------------------------------------------------ helpers

# Bytes of trailing data per kind: per-element for list kinds, fixed otherwise.
_LIST_REC = {
    KIND_STRUCT: 12,
    KIND_UNION: 12,
    KIND_ENUM: 8,
    KIND_FUNC_PROTO: 8,
    KIND_DATASEC: 12,
    KIND_ENUM64: 12,
}
_FIXED_TAIL = {
    KIND_INT: 4,
    KIND_PTR: 0,
    KIND_ARRAY: 12,
    KIND_FWD: 0,
    KIND_TYPEDEF: 0,
    KIND_VOLATILE: 0,
    KIND_CONST: 0,
    KIND_RESTRICT: 0,
    KIND_FUNC: 0,
    KIND_VAR: 4,
    KIND_FLOAT: 0,
    KIND_DECL_TAG: 4,
    KIND_TYPE_TAG: 0,
}
_REF_KINDS = frozenset(
    {KIND_PTR, KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT, KIND_TYPE_TAG}
)
# Kinds with no bytes of their own to decode.
_NO_VALUE = frozenset({KIND_VOID, KIND_FWD, KIND_FUNC, KIND_FUNC_PROTO, KIND_DECL_TAG})
# size -> (unsigned code, signed code)
_INT_CODES = {1: ("B", "b"), 2: ("H", "h"), 4: ("I", "i"), 8: ("Q", "q")}


def _refs(t: BtfType) -> Iterator[int]:
    if isinstance(t, (Ref, Func, Var, DeclTag)):
        yield t.type
    elif isinstance(t, Array):
        yield t.type
        yield t.index_type
    elif isinstance(t, FuncProto):
        yield t.type
        for p in t.params:
            yield p.type
    elif isinstance(t, Composite):
        for m in t.members:
            yield m.type
    elif isinstance(t, Datasec):
        for s in t.secinfos:
            yield s.type


def _join(base: str, inner: str) -> str:
    if not inner:
        return base
    if inner[0] == "[":
        return base + inner
    return f"{base} {inner}"


def _secinfo_offset(si: VarSecinfo) -> int:
    return si.offset


def _cstr(raw: bytes) -> str:
    end = raw.find(b"\0")
    if end >= 0:
        raw = raw[:end]
    return raw.decode("utf-8", "replace")


def _enum_post(names: dict[int, str]) -> Callable[[int], Any]:
    get = names.get
    return lambda v: get(v, v)


def _scalar_fn(code: str, post: Callable[[Any], Any] | None) -> Callable[[Any, int], Any]:
    unpack = struct.Struct("<" + code).unpack_from
    if post is None:
        return lambda buf, off: unpack(buf, off)[0]
    return lambda buf, off: post(unpack(buf, off)[0])


def _odd_int_fn(t: Int) -> Callable[[Any, int], Any]:
    """INTs struct cannot read in one go: 16-byte, odd sizes, partial bits."""
    size, shift, bits, signed = t.size, t.bit_offset, t.bits, t.signed
    mask = (1 << bits) - 1 if bits else 0
    is_bool = bool(t.encoding & INT_BOOL)

    def decode(buf: Any, off: int) -> Any:
        v = (int.from_bytes(buf[off : off + size], "little") >> shift) & mask
        if signed and bits and v >> (bits - 1):
            v -= 1 << bits
        return bool(v) if is_bool else v

    return decode


def _odd_enum_fn(t: Enum) -> Callable[[Any, int], Any]:
    size, signed = t.size, t.signed
    names = {v.value: v.name for v in reversed(t.values)}

    def decode(buf: Any, off: int) -> Any:
        v = int.from_bytes(buf[off : off + size], "little", signed=signed)
        return names.get(v, v)

    return decode


def _raw_fn(size: int) -> Callable[[Any, int], Any]:
    return lambda buf, off: bytes(buf[off : off + size])


# ------------------------------------------------------------------ BTF maps

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


def parse_btf_maps(btf: Btf) -> list[BtfMapDef]:
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


def _parse_map(btf: Btf, var: Var, offset: int) -> BtfMapDef:
    name = var.name
    if not name:
        raise BtfError(f"VAR type id {var.id} in '.maps' has no name")
    defn = btf.resolve_type(var.type)
    if not isinstance(defn, Composite) or defn.kind != KIND_STRUCT:
        raise BtfError(
            f"map '{name}': definition is {btf.type_str(var.type)} ({defn.kind_name}), "
            "expected a struct"
        )
    md = BtfMapDef(name=name, map_type=0, offset=offset, var_type_id=var.id)
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
            ptr = btf.resolve_type(m.type)
            if ptr.kind != KIND_PTR:
                raise BtfError(
                    f"map '{name}': member '{mname}' is {btf.type_str(m.type)}, expected a "
                    f"pointer (__type({mname}, T))"
                )
            target = ptr.type  # type: ignore[attr-defined]
            try:
                size = btf.size_of(target)
            except BtfError as e:
                raise BtfError(f"map '{name}': cannot size member '{mname}': {e}") from None
            _set_size(md, name, mname, size)
            setattr(md, f"{mname}_type_id", target)
        elif mname == "values":
            raise BtfError(
                f"map '{name}': member 'values' (map-in-map or prog-array) is not supported"
            )
        else:
            raise BtfError(f"map '{name}': unknown member '{mname or '(anon)'}'")
    if not have_type:
        raise BtfError(f"map '{name}': no 'type' member (__uint(type, ...))")
    return md


def _set_size(md: BtfMapDef, map_name: str, what: str, size: int) -> None:
    cur = getattr(md, f"{what}_size")
    if cur and cur != size:
        raise BtfError(f"map '{map_name}': conflicting {what} size {cur} != {size}")
    setattr(md, f"{what}_size", size)


def _map_int(btf: Btf, map_name: str, m: Member) -> int:
    """`int (*name)[N]` -> N, skipping modifiers and typedefs."""
    ptr = btf.resolve_type(m.type)
    if ptr.kind == KIND_PTR:
        arr = btf.resolve_type(ptr.type)  # type: ignore[attr-defined]
        if isinstance(arr, Array):
            return arr.nelems
    raise BtfError(
        f"map '{map_name}': member '{m.name}' is {btf.type_str(m.type)}, expected "
        f"int (*{m.name})[N] (__uint({m.name}, N))"
    )


def _map_long(btf: Btf, map_name: str, m: Member) -> int:
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


# Imported last: btf_ext needs BtfError and Btf from this module.
from gfxbpf.bpf.btf_ext import (  # noqa: E402
    BtfExt,
    CoreRelo,
    FuncInfo,
    LineInfo,
    pack_ext_records,
    pack_func_info,
    pack_line_info,
)
