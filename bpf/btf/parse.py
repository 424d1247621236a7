"""Raw BTF blob -> header fields, string section and typed BtfType objects.

Every corrupt input raises BtfError saying what is wrong and where (byte
offset or type id). Speed matters: vmlinux holds over 100,000 types, and a
broker parses it on start.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable
from typing import NamedTuple, NoReturn, TypeAlias

from gfxbpf.bpf.btf.kinds import (
    BTF_HEADER_LEN,
    BTF_MAGIC,
    BTF_VERSION,
    KIND_ARRAY,
    KIND_DATASEC,
    KIND_DECL_TAG,
    KIND_ENUM,
    KIND_ENUM64,
    KIND_FLOAT,
    KIND_FUNC,
    KIND_FUNC_PROTO,
    KIND_FWD,
    KIND_INT,
    KIND_NAMES,
    KIND_STRUCT,
    KIND_UNION,
    KIND_VAR,
    KIND_VOID,
    REF_CLASSES,
    REF_KINDS,
    Array,
    BtfError,
    BtfType,
    Datasec,
    DeclTag,
    Enum,
    EnumValue,
    Float,
    Func,
    FuncProto,
    Fwd,
    Int,
    Member,
    Param,
    Struct,
    Union,
    Var,
    VarSecinfo,
    Void,
    refs,
)
from gfxbpf.bpf.btf.table import string_at, string_table
from gfxbpf.bpf.gcpause import gc_paused

HEADER = struct.Struct("<HBBIIIII")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_III = struct.Struct("<III")

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
    KIND_ARRAY: 12,
    KIND_FWD: 0,
    KIND_FUNC: 0,
    KIND_VAR: 4,
    KIND_FLOAT: 0,
    KIND_DECL_TAG: 4,
} | dict.fromkeys(REF_KINDS, 0)

# A raw blob as read, or mapped read-only (vmlinux: core/target.py).
BtfBytes: TypeAlias = bytes | mmap.mmap


class ParsedBlob(NamedTuple):  # not a dataclass: see bpf/maps.py's Page
    types: list[BtfType]
    strings: bytes
    version: int
    flags: int
    names: dict[int, str]  # string offset -> string, for every string in the section
    sections: tuple[int, int, int, int]  # type start, type length, string start, string length


def parse_blob(data: bytes) -> ParsedBlob:
    version, flags, t_start, type_len, s_start, str_len = _parse_header(data)
    strings = data[s_start : s_start + str_len]
    if strings and strings[-1] != 0:
        raise BtfError(f"BTF string section at byte offset {s_start} does not end with NUL")
    names = string_table(strings)
    # Hundreds of thousands of small acyclic objects: the cyclic GC would
    # rescan them over and over for nothing (about a third of the time).
    with gc_paused():
        types = _TypeParser(data, strings, names).parse(t_start, type_len)
    return ParsedBlob(types, strings, version, flags, names, (t_start, type_len, s_start, str_len))


def parse_split_blob(data: bytes, base: ParsedBlob) -> ParsedBlob:
    """A split BTF blob (a module's, on top of vmlinux) as one table with its base.

    Type ids and string offsets of split BTF continue after the base's, so
    the result holds the base's types and strings followed by the split's:
    every id and name offset in it is the one the kernel uses.
    """
    version, flags, t_start, type_len, s_start, str_len = _parse_header(data)
    strings = base.strings + data[s_start : s_start + str_len]
    if str_len and strings[-1] != 0:
        raise BtfError(f"BTF string section at byte offset {s_start} does not end with NUL")
    shift = len(base.strings)
    names = dict(base.names)
    names.update((off + shift, s) for off, s in string_table(strings[shift:]).items())
    with gc_paused():
        types = _TypeParser(data, strings, names).parse(t_start, type_len, base.types)
    return ParsedBlob(types, strings, version, flags, names, (t_start, type_len, s_start, str_len))


def _parse_header(data: BtfBytes) -> tuple[int, int, int, int, int, int]:
    """(version, flags, type start, type length, string start, string length), all checked."""
    n = len(data)
    if n < BTF_HEADER_LEN:
        raise BtfError(f"BTF blob is {n} bytes, shorter than the {BTF_HEADER_LEN}-byte header")
    magic, version, flags, hdr_len, type_off, type_len, str_off, str_len = HEADER.unpack_from(
        data, 0
    )
    if magic != BTF_MAGIC:
        if magic == 0x9FEB:
            raise BtfError("BTF blob is big-endian (magic 0x9feb); only little-endian is supported")
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
    return version, flags, t_start, type_len, s_start, str_len


# One kind's parser: (tid, kind, name, name_off, kind_flag, vlen, size_or_type,
# tail position, tail length) -> the type. Plain arguments, not a header
# object: this runs once per type of vmlinux.
_KindParser = Callable[[int, int, str, int, bool, int, int, int, int], BtfType]


class _TypeParser:
    """Parses the type section; `maxref` is the largest type id referred to so far."""

    def __init__(
        self,
        data: BtfBytes,
        strings: bytes,
        names: dict[int, str],
        name_of: Callable[[int], str] | None = None,
    ) -> None:
        self.data = data
        self.mv = memoryview(data)
        self.strings = strings
        self.names = names
        self.maxref = 0
        sget = names.get

        # A closure, not a method: it runs for every member name of vmlinux.
        def name(off: int) -> str:
            nm = sget(off)
            return nm if nm is not None else string_at(strings, names, off)

        self.name = name_of if name_of is not None else name
        self.parsers: dict[int, _KindParser] = {
            KIND_INT: self._int,
            KIND_ARRAY: self._array,
            KIND_STRUCT: self._composite,
            KIND_UNION: self._composite,
            KIND_ENUM: self._enum,
            KIND_ENUM64: self._enum64,
            KIND_FWD: self._fwd,
            KIND_FUNC: self._func,
            KIND_FUNC_PROTO: self._func_proto,
            KIND_VAR: self._var,
            KIND_DATASEC: self._datasec,
            KIND_FLOAT: self._float,
            KIND_DECL_TAG: self._decl_tag,
        }
        for kind in REF_KINDS:
            self.parsers[kind] = self._ref

    def parse(self, start: int, length: int, base: list[BtfType] | None = None) -> list[BtfType]:
        """The types; with `base` (split BTF), ids continue after the base's."""
        data = self.data
        end = start + length
        types: list[BtfType] = list(base) if base else [Void(0, KIND_VOID, "", 0, False)]
        append = types.append
        hdr = _III.unpack_from
        sget = self.names.get
        parsers = self.parsers
        list_rec = _LIST_REC.get
        fixed_tail = _FIXED_TAIL.get
        pos = start
        tid = len(types) - 1
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
            here = pos
            pos += 12
            try:
                nm = sget(name_off)
                if nm is None:
                    nm = string_at(self.strings, self.names, name_off)
            except BtfError as e:
                raise BtfError(f"BTF type id {tid} at byte offset {here}: {e}") from None
            rec = list_rec(kind)
            need = rec * vlen if rec is not None else fixed_tail(kind, -1)
            if need < 0 or (vlen and rec is None and kind != KIND_FUNC):
                _bad_tail(tid, kind, vlen, here)
            if pos + need > end:
                raise BtfError(
                    f"BTF type id {tid} ({KIND_NAMES[kind]}, vlen {vlen}) at byte offset {here}: "
                    f"needs {need} bytes after its header, only {end - pos} left in the types"
                )
            try:
                append(
                    parsers[kind](tid, kind, nm, name_off, bool(info >> 31), vlen, st, pos, need)
                )
            except BtfError as e:
                raise BtfError(
                    f"BTF type id {tid} ({KIND_NAMES[kind]}) at byte offset {here}: {e}"
                ) from None
            pos += need
        if self.maxref >= len(types):
            _report_bad_ref(types)
        return types

    def decode_one(self, tid: int, pos: int) -> BtfType:
        """The type whose record starts at byte `pos` (a lazy table's index found it)."""
        name_off, info, st = _III.unpack_from(self.data, pos)
        kind = (info >> 24) & 0x1F
        vlen = info & 0xFFFF
        rec = _LIST_REC.get(kind)
        need = rec * vlen if rec is not None else _FIXED_TAIL.get(kind, 0)
        try:
            nm = self.name(name_off)
            parser = self.parsers.get(kind)
            if parser is None:
                raise BtfError(f"unknown kind {kind}")
            return parser(tid, kind, nm, name_off, bool(info >> 31), vlen, st, pos + 12, need)
        except BtfError as e:
            raise BtfError(f"BTF type id {tid} at byte offset {pos}: {e}") from None

    # One method per kind family, each a _KindParser.

    def _func(
        self, tid: int, kind: int, nm: str, noff: int, kf: bool, vlen: int, st: int, p: int, n: int
    ) -> BtfType:
        if st > self.maxref:
            self.maxref = st
        return Func(tid, kind, nm, noff, kf, st, vlen)

    def _func_proto(
        self, tid: int, kind: int, nm: str, noff: int, kf: bool, vlen: int, st: int, p: int, n: int
    ) -> BtfType:
        name = self.name
        params = []
        mx = st
        for p_off, p_type in struct.iter_unpack("<II", self.mv[p : p + n]):
            if p_type > mx:
                mx = p_type
            params.append(Param(name(p_off), p_off, p_type))
        if mx > self.maxref:
            self.maxref = mx
        return FuncProto(tid, kind, nm, noff, kf, st, params)

    def _ref(
        self, tid: int, kind: int, nm: str, noff: int, kf: bool, vlen: int, st: int, p: int, n: int
    ) -> BtfType:
        if st > self.maxref:
            self.maxref = st
        return REF_CLASSES[kind](tid, kind, nm, noff, kf, st)

    def _composite(
        self, tid: int, kind: int, nm: str, noff: int, kf: bool, vlen: int, st: int, p: int, n: int
    ) -> BtfType:
        name = self.name
        members = []
        mx = 0
        for m_off, m_type, m_bits in struct.iter_unpack("<III", self.mv[p : p + n]):
            if m_type > mx:
                mx = m_type
            if kf:
                members.append(Member(name(m_off), m_off, m_type, m_bits & 0xFFFFFF, m_bits >> 24))
            else:
                members.append(Member(name(m_off), m_off, m_type, m_bits, 0))
        if mx > self.maxref:
            self.maxref = mx
        cls = Struct if kind == KIND_STRUCT else Union
        return cls(tid, kind, nm, noff, kf, st, members)

    def _array(
        self, tid: int, kind: int, nm: str, noff: int, kf: bool, vlen: int, st: int, p: int, n: int
    ) -> BtfType:
        a_type, a_index, a_n = _III.unpack_from(self.data, p)
        if st:
            raise BtfError(f"ARRAY size_or_type must be 0, got {st}")
        if max(a_type, a_index) > self.maxref:
            self.maxref = max(a_type, a_index)
        return Array(tid, kind, nm, noff, kf, a_type, a_index, a_n)

    def _int(
        self, tid: int, kind: int, nm: str, noff: int, kf: bool, vlen: int, st: int, p: int, n: int
    ) -> BtfType:
        (w,) = _U32.unpack_from(self.data, p)
        bits = w & 0xFFFF
        if bits > 128:
            raise BtfError(f"INT has {bits} bits (at most 128)")
        return Int(tid, kind, nm, noff, kf, st, w >> 24, (w >> 16) & 0xFF, bits)

    def _enum(
        self, tid: int, kind: int, nm: str, noff: int, kf: bool, vlen: int, st: int, p: int, n: int
    ) -> BtfType:
        name = self.name
        fmt = "<Ii" if kf else "<II"
        vals = [
            EnumValue(name(off), off, v) for off, v in struct.iter_unpack(fmt, self.mv[p : p + n])
        ]
        return Enum(tid, kind, nm, noff, kf, st, vals)

    def _enum64(
        self, tid: int, kind: int, nm: str, noff: int, kf: bool, vlen: int, st: int, p: int, n: int
    ) -> BtfType:
        name = self.name
        vals = []
        for e_off, lo, hi in struct.iter_unpack("<III", self.mv[p : p + n]):
            v = (hi << 32) | lo
            if kf and v >= 1 << 63:
                v -= 1 << 64
            vals.append(EnumValue(name(e_off), e_off, v))
        return Enum(tid, kind, nm, noff, kf, st, vals)

    def _var(
        self, tid: int, kind: int, nm: str, noff: int, kf: bool, vlen: int, st: int, p: int, n: int
    ) -> BtfType:
        (linkage,) = _U32.unpack_from(self.data, p)
        if st > self.maxref:
            self.maxref = st
        return Var(tid, kind, nm, noff, kf, st, linkage)

    def _datasec(
        self, tid: int, kind: int, nm: str, noff: int, kf: bool, vlen: int, st: int, p: int, n: int
    ) -> BtfType:
        infos = []
        mx = 0
        for v_type, v_off, v_size in struct.iter_unpack("<III", self.mv[p : p + n]):
            if v_type > mx:
                mx = v_type
            infos.append(VarSecinfo(v_type, v_off, v_size))
        if mx > self.maxref:
            self.maxref = mx
        return Datasec(tid, kind, nm, noff, kf, st, infos)

    def _fwd(
        self, tid: int, kind: int, nm: str, noff: int, kf: bool, vlen: int, st: int, p: int, n: int
    ) -> BtfType:
        if st:
            raise BtfError(f"FWD size_or_type must be 0, got {st}")
        return Fwd(tid, kind, nm, noff, kf)

    def _float(
        self, tid: int, kind: int, nm: str, noff: int, kf: bool, vlen: int, st: int, p: int, n: int
    ) -> BtfType:
        return Float(tid, kind, nm, noff, kf, st)

    def _decl_tag(
        self, tid: int, kind: int, nm: str, noff: int, kf: bool, vlen: int, st: int, p: int, n: int
    ) -> BtfType:
        (comp,) = _I32.unpack_from(self.data, p)
        if st > self.maxref:
            self.maxref = st
        return DeclTag(tid, kind, nm, noff, kf, st, comp)


def _bad_tail(tid: int, kind: int, vlen: int, here: int) -> NoReturn:
    if kind not in _FIXED_TAIL:  # nor in _LIST_REC: the caller checked
        raise BtfError(f"BTF type id {tid} at byte offset {here}: unknown kind {kind}")
    raise BtfError(
        f"BTF type id {tid} ({KIND_NAMES[kind]}) at byte offset {here}: vlen must be 0, got {vlen}"
    )


def _report_bad_ref(types: list[BtfType]) -> None:
    n = len(types)
    for t in types:
        for ref in refs(t):
            if ref >= n:
                raise BtfError(
                    f"BTF type id {t.id} ({t.kind_name} '{t.name}') refers to type id {ref}, "
                    f"past the last type id {n - 1}"
                )
