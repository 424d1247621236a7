"""Raw map/event bytes -> Python values, by BTF type: compiled once per type id, then cached.

A decoder is (size, fn) where fn(buf, off) reads one value at byte `off`:
an int, bool, float-as-bytes, str for char arrays, enum name (or the int
when no enumerator has the value), list for arrays, dict for structs,
unions and DATASECs. Plain structs of scalars compile to one struct.Struct.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from itertools import repeat
from operator import itemgetter
from typing import Any

from gfxbpf.bpf.btf.kinds import (
    INT_BOOL,
    INT_CHAR,
    INT_SIGNED,
    MAX_DEPTH,
    Array,
    BtfError,
    Composite,
    Datasec,
    DeclTag,
    Enum,
    Float,
    Func,
    FuncProto,
    Fwd,
    Int,
    Member,
    Ptr,
    Struct,
    Var,
    Void,
)
from gfxbpf.bpf.btf.table import TypeTable

DecodeFn = Callable[[Any, int], Any]
Decoder = tuple[int, DecodeFn]  # (size in bytes, fn(buf, offset) -> value)
# fn(buf, n) -> [value] * n: n values laid `stride` bytes apart from buf[0]
BatchFn = Callable[[Any, int], list[Any]]
_Scalar = tuple[str, Callable[[Any], Any] | None]  # (struct code, post-processing or None)

_CHAR_NAMES = frozenset({"char", "signed char", "unsigned char"})
# size -> (unsigned code, signed code)
_INT_CODES = {1: ("B", "b"), 2: ("H", "h"), 4: ("I", "i"), 8: ("Q", "q")}
_FLOAT_CODES = {2: "e", 4: "f", 8: "d"}
# Codes memoryview.cast reads as one C array (native = little-endian here).
_CAST_CODES = frozenset("BHIQbhiqfd")

# One member of a struct/union decoder, in member order: (how, name, a, b)
#   "s": scalar from the combined Struct: a = index, b = post or None
#   "d": sub-decoder: a = byte offset, b = fn;  "m": same, merged (anonymous)
#   "b": bitfield: a = (bit offset, bits, signed), b = post or None
_Step = tuple[str, str, Any, Any]


class Decoders:
    """Compiles and caches decoders for the types of one TypeTable."""

    def __init__(self, table: TypeTable) -> None:
        self.table = table
        self._cache: dict[int, Decoder] = {}

    def clear(self) -> None:
        """Forget every decoder (the types changed)."""
        self._cache.clear()

    def get(self, type_id: int) -> Decoder:
        return self._cache.get(type_id) or self._compile(type_id, ())

    def batch(self, type_id: int, stride: int = 0) -> BatchFn:
        """A decoder of many values at once: fn(buf, n) -> n values, `stride`
        bytes apart (default: the type's size), as a batch lookup returns them.

        Scalars and structs of scalars go through one struct.Struct over the
        whole buffer (iter_unpack; a memoryview cast for plain numbers) instead
        of a call per value; other types fall back to the one-value decoder.
        """
        size, fn = self.get(type_id)
        stride = stride or size
        if stride < size:
            raise BtfError(f"stride {stride} is shorter than type id {type_id} ({size} bytes)")
        fast = self._batch_scalar(type_id, size, stride) or self._batch_struct(type_id, stride)
        if fast is not None:
            return fast
        return lambda buf, n: [fn(buf, off) for off in range(0, n * stride, stride)]

    def _batch_scalar(self, type_id: int, size: int, stride: int) -> BatchFn | None:
        sc = self._scalar(type_id)
        if sc is None:
            return None
        code, post = sc
        if post is None and stride == size and code in _CAST_CODES:
            cast: Any = code  # one of _CAST_CODES
            return lambda buf, n: memoryview(buf)[: n * stride].cast(cast).tolist()
        it = struct.Struct(f"<{code}{stride - size}x").iter_unpack
        if post is None:
            return lambda buf, n: [v for (v,) in it(memoryview(buf)[: n * stride])]
        if post is _cstr:
            return lambda buf, n: list(_cstrs(map(_first, it(memoryview(buf)[: n * stride]))))
        return lambda buf, n: [post(v) for (v,) in it(memoryview(buf)[: n * stride])]

    def _batch_struct(self, type_id: int, stride: int) -> BatchFn | None:
        """Structs whose members are all scalars: one Struct, one dict per value."""
        t = self.table.resolve_type(type_id)
        if not isinstance(t, Struct):
            return None
        fmt, nscalar, plan = self._composite_plan(t, (type_id,))
        if not nscalar or any(p[0] != "s" for p in plan):
            return None
        it = struct.Struct(f"{fmt}{stride - struct.calcsize(fmt)}x").iter_unpack
        names = tuple(p[1] for p in plan)
        posts = tuple(p[3] for p in plan)
        if len(names) == 1:
            name, post = names[0], posts[0]
            if post is None:
                return lambda buf, n: [{name: v} for (v,) in it(memoryview(buf)[: n * stride])]
            if post is _cstr:  # a struct of one string (a comm): the common key
                return lambda buf, n: [
                    {name: v} for v in _cstrs(map(_first, it(memoryview(buf)[: n * stride])))
                ]
            return lambda buf, n: [{name: post(v)} for (v,) in it(memoryview(buf)[: n * stride])]
        if all(p is None for p in posts):
            return lambda buf, n: [
                dict(zip(names, vals, strict=True)) for vals in it(memoryview(buf)[: n * stride])
            ]
        steps = tuple(zip(names, posts, strict=True))

        def decode(buf: Any, n: int) -> list[Any]:
            return [
                {
                    name: v if post is None else post(v)
                    for (name, post), v in zip(steps, vals, strict=True)
                }
                for vals in it(memoryview(buf)[: n * stride])
            ]

        return decode

    def _compile(self, type_id: int, stack: tuple[int, ...]) -> Decoder:
        entry = self._cache.get(type_id)
        if entry is not None:
            return entry
        if type_id in stack or len(stack) > MAX_DEPTH:
            raise BtfError(f"BTF type id {type_id} contains itself (reference cycle)")
        stack = stack + (type_id,)
        tid = self.table.resolve(type_id)
        t = self.table.types[tid]
        if tid != type_id:
            entry = self._compile(tid, stack)
        else:
            match t:
                case Void() | Fwd() | Func() | FuncProto() | DeclTag():
                    raise BtfError(
                        f"cannot decode {self.table.type_str(type_id)} (type id {type_id}, "
                        f"{t.kind_name}): it has no value"
                    )
                case Var():
                    entry = self._compile(t.type, stack)
                case _:
                    entry = self._compile_sized(type_id, stack)
        self._cache[type_id] = entry
        return entry

    def _compile_sized(self, tid: int, stack: tuple[int, ...]) -> Decoder:
        """A decoder for `tid`, a resolved type with bytes of its own."""
        t = self.table.types[tid]
        size = t.size if isinstance(t, Datasec) else self.table.size_of(tid)
        sc = self._scalar(tid)
        if sc is not None:
            return size, _scalar_fn(*sc)
        match t:
            case Int():
                return size, _odd_int_fn(t)
            case Enum():
                return size, _odd_enum_fn(t)
            case Float():
                return size, _raw_fn(size)
            case Array():
                return size, self._array_fn(t, stack)
            case Composite():
                return size, self._composite_fn(t, stack)
            case Datasec():
                return size, self._datasec_fn(t, stack)
        raise BtfError(f"cannot decode {self.table.type_str(tid)} (type id {tid}, {t.kind_name})")

    def _scalar(self, type_id: int) -> _Scalar | None:
        """(struct format code, post-processing or None) when one code reads this type."""
        t = self.table.resolve_type(type_id)
        match t:
            case Int():
                if t.bit_offset or t.bits != t.size * 8 or t.size not in _INT_CODES:
                    return None
                if t.encoding & INT_BOOL:
                    return _INT_CODES[t.size][0], bool
                return _INT_CODES[t.size][t.encoding & INT_SIGNED], None
            case Ptr():
                return "Q", None
            case Enum():
                if t.size not in _INT_CODES:
                    return None
                names = {}
                for v in reversed(t.values):
                    names[v.value] = v.name  # first enumerator wins on duplicates
                return _INT_CODES[t.size][1 if t.kind_flag else 0], _enum_post(names)
            case Float():
                code = _FLOAT_CODES.get(t.size)
                return (code, None) if code else None
            case Array() if self._is_char(t.type):
                return f"{t.nelems}s", _cstr
        return None

    def _is_char(self, type_id: int) -> bool:
        t = self.table.resolve_type(type_id)
        return (
            isinstance(t, Int)
            and t.size == 1
            and (t.name in _CHAR_NAMES or bool(t.encoding & INT_CHAR))
        )

    def _array_fn(self, t: Array, stack: tuple[int, ...]) -> DecodeFn:
        n = t.nelems
        if n == 0:
            return lambda buf, off: []
        sc = self._scalar(t.type)
        if sc is not None and "s" not in sc[0]:
            code, post = sc
            unpack = struct.Struct(f"<{n}{code}").unpack_from
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
        rid = self.table.resolve(m.type)
        rt = self.table.types[rid]
        if kflag and m.bitfield_size:
            return m.bit_offset, m.bitfield_size, rid
        if isinstance(rt, Int) and (rt.bit_offset or rt.bits != rt.size * 8):
            return m.bit_offset + rt.bit_offset, rt.bits, rid
        if m.bit_offset % 8:
            if isinstance(rt, Int | Enum):
                return m.bit_offset, self.table.size_of(rid) * 8, rid
            raise BtfError(
                f"member '{m.name}' (type id {m.type}) starts at bit {m.bit_offset}, "
                "not on a byte boundary"
            )
        return None

    def _bitfield_step(self, t: Composite, m: Member, bf: tuple[int, int, int]) -> _Step:
        bo, nbits, rid = bf
        rt = self.table.types[rid]
        post: Callable[[Any], Any] | None = None
        signed = False
        if isinstance(rt, Int):
            signed = rt.signed
            if rt.encoding & INT_BOOL:
                post = bool
        elif isinstance(rt, Enum):
            signed = rt.kind_flag
            sc = self._scalar(rid)
            post = sc[1] if sc else None
        if nbits == 0 or nbits > 128 or (bo + nbits + 7) >> 3 > t.size:
            raise BtfError(
                f"{self.table.type_str(t.id)} (type id {t.id}): bitfield '{m.name}' "
                f"({nbits} bits at bit {bo}) does not fit in {t.size} bytes"
            )
        return "b", m.name, (bo, nbits, signed), post

    def _composite_plan(self, t: Composite, stack: tuple[int, ...]) -> tuple[str, int, list[_Step]]:
        """(struct format of the scalar members, how many, a step per member)."""
        is_struct = isinstance(t, Struct)
        fmt = ["<"]
        pos = 0
        nscalar = 0
        plan: list[_Step] = []
        for m in t.members:
            if not m.name and not isinstance(self.table.resolve_type(m.type), Composite):
                continue  # unnamed padding bitfield
            bf = self._member_plan(m, t.kind_flag)
            if bf is not None:
                plan.append(self._bitfield_step(t, m, bf))
                continue
            boff = m.bit_offset // 8
            if boff + self.table.size_of(m.type) > t.size:
                raise BtfError(
                    f"{self.table.type_str(t.id)} (type id {t.id}): member '{m.name}' at byte "
                    f"{boff} runs past the end ({t.size} bytes)"
                )
            sc = self._scalar(m.type) if is_struct and m.name else None
            if sc is not None and boff >= pos:
                code, post = sc
                if boff > pos:
                    fmt.append(f"{boff - pos}x")
                fmt.append(code)
                pos = boff + self.table.size_of(m.type)
                plan.append(("s", m.name, nscalar, post))
                nscalar += 1
                continue
            _, fn = self._compile(m.type, stack)
            plan.append(("d" if m.name else "m", m.name, boff, fn))
        return "".join(fmt), nscalar, plan

    def _composite_fn(self, t: Composite, stack: tuple[int, ...]) -> DecodeFn:
        fmt, nscalar, plan = self._composite_plan(t, stack)
        unpack = struct.Struct(fmt).unpack_from
        if nscalar and all(p[0] == "s" and p[3] is None for p in plan):
            names = tuple(p[1] for p in plan)
            return lambda buf, off: dict(zip(names, unpack(buf, off), strict=True))
        steps = tuple(plan)

        def decode(buf: Any, off: int) -> dict[str, Any]:
            vals = unpack(buf, off) if nscalar else ()
            out: dict[str, Any] = {}
            for how, name, a, b in steps:
                if how == "s":
                    v = vals[a]
                    out[name] = v if b is None else b(v)
                elif how == "d":
                    out[name] = b(buf, off + a)
                elif how == "m":
                    out.update(b(buf, off + a))
                else:
                    v = _bitfield(buf, off, *a)
                    out[name] = v if b is None else b(v)
            return out

        return decode

    def _datasec_fn(self, t: Datasec, stack: tuple[int, ...]) -> DecodeFn:
        parts = []
        for si in t.secinfos:
            var = self.table.type_by_id(si.type)
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


def _bitfield(buf: Any, off: int, bo: int, nbits: int, signed: bool) -> int:
    start = off + (bo >> 3)
    shift = bo & 7
    raw = int.from_bytes(buf[start : start + ((shift + nbits + 7) >> 3)], "little")
    v = (raw >> shift) & ((1 << nbits) - 1)
    if signed and v >> (nbits - 1):
        v -= 1 << nbits
    return v


def _cstr(raw: bytes) -> str:
    end = raw.find(b"\0")
    if end >= 0:
        raw = raw[:end]
    return raw.decode("utf-8", "replace")


_first = itemgetter(0)


def _cstrs(raws: Iterable[bytes]) -> Iterable[str]:
    """_cstr of each, in C loops (map over bytes methods): a batch of comms
    spends no Python frame per value."""
    heads = map(_first, map(bytes.partition, raws, repeat(b"\0")))
    return map(bytes.decode, heads, repeat("utf-8"), repeat("replace"))


def _enum_post(names: dict[int, str]) -> Callable[[int], Any]:
    get = names.get
    return lambda v: get(v, v)


def _scalar_fn(code: str, post: Callable[[Any], Any] | None) -> DecodeFn:
    unpack = struct.Struct("<" + code).unpack_from
    if post is None:
        return lambda buf, off: unpack(buf, off)[0]
    return lambda buf, off: post(unpack(buf, off)[0])


def _odd_int_fn(t: Int) -> DecodeFn:
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


def _odd_enum_fn(t: Enum) -> DecodeFn:
    size, signed = t.size, t.signed
    names = {v.value: v.name for v in reversed(t.values)}

    def decode(buf: Any, off: int) -> Any:
        v = int.from_bytes(buf[off : off + size], "little", signed=signed)
        return names.get(v, v)

    return decode


def _raw_fn(size: int) -> DecodeFn:
    return lambda buf, off: bytes(buf[off : off + size])
