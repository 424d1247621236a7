"""TypeTable: BTF types and strings, and the lookups on them (by id, by name, resolve, sizes).

The read-only half of Btf, which decoding and `.maps` parsing need; Btf
(facade.py) adds parsing, encoding, fixups and decoding on top.
"""

from __future__ import annotations

import itertools

from gfxbpf.bpf.btf.kinds import (
    MAX_DEPTH,
    PTR_SIZE,
    Array,
    BtfError,
    BtfType,
    Composite,
    Const,
    Datasec,
    DeclTag,
    Enum,
    Float,
    Func,
    FuncProto,
    Fwd,
    Int,
    Ptr,
    Ref,
    Restrict,
    Struct,
    TypeTag,
    Union,
    Var,
    Void,
    Volatile,
)


def string_table(strings: bytes) -> dict[int, str]:
    """Offset -> string for every NUL-separated string: far cheaper than one lookup per name."""
    parts = strings.split(b"\0")[:-1]  # the piece after the final NUL is not a string
    offsets = itertools.accumulate((len(p) + 1 for p in parts), initial=0)
    return dict(zip(offsets, (p.decode("utf-8", "replace") for p in parts), strict=False))


def string_at(strings: bytes, cache: dict[int, str], off: int) -> str:
    """The string at `off`, also one starting inside another (added to `cache`)."""
    s = cache.get(off)
    if s is not None:
        return s
    if off >= len(strings):
        if off == 0:
            return ""
        raise BtfError(
            f"string offset {off} is past the end of the {len(strings)}-byte string section"
        )
    end = strings.find(b"\0", off)
    if end < 0:
        raise BtfError(f"string at offset {off} has no NUL terminator")
    s = strings[off:end].decode("utf-8", "replace")
    cache[off] = s
    return s


class TypeTable:
    """BTF types (`types[i]` is type id i; `types[0]` is void) and their string section."""

    def __init__(self, types: list[BtfType], strings: bytes) -> None:
        self.types = types
        self.strings = strings
        self._by_name: dict[str, list[int]] | None = None
        self._sizes: dict[int, int] = {}
        self._str_cache: dict[int, str] = {}

    # ---------------------------------------------------------------- strings

    def string_at(self, off: int) -> str:
        """The NUL-terminated string at `off` in the string section."""
        return string_at(self.strings, self._str_cache, off)

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

    # ------------------------------------------------------------------ lookups

    def __len__(self) -> int:
        return len(self.types)

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
        while isinstance(t, Ref) and not isinstance(t, Ptr):  # typedefs and qualifiers
            steps += 1
            if steps > n:
                raise BtfError(f"BTF type id {type_id}: reference cycle through typedefs/modifiers")
            nxt = t.type
            if nxt >= n:
                raise BtfError(f"BTF type id {t.id} refers to type id {nxt}, past the last type")
            t = types[nxt]
        return t.id

    def resolve_type(self, type_id: int) -> BtfType:
        return self.types[self.resolve(type_id)]

    # -------------------------------------------------------------------- sizes

    def size_of(self, type_id: int) -> int:
        """Size in bytes; BtfError for sizeless kinds (void, FUNC, FWD...) or cycles."""
        size = self._sizes.get(type_id)
        if size is None:
            size = self._size(type_id, 0)
            self._sizes[type_id] = size
        return size

    def _size(self, type_id: int, depth: int) -> int:
        if depth > MAX_DEPTH:
            raise BtfError(f"BTF type id {type_id}: arrays nested too deep (reference cycle?)")
        t = self.type_by_id(self.resolve(type_id))
        match t:
            case Int() | Composite() | Enum() | Datasec() | Float():
                return t.size
            case Ptr():
                return PTR_SIZE
            case Array():
                n = t.nelems
                return n * self._size(t.type, depth + 1) if n else 0
            case Var():
                return self._size(t.type, depth + 1)
        raise BtfError(f"BTF type id {t.id} ({t.kind_name} '{t.name}') has no size")

    # ------------------------------------------------------------------ display

    def type_str(self, type_id: int) -> str:
        """A C-like name for display: "struct event", "__u64", "char[16]", "int (*)[2]"."""
        return self._type_str(type_id, "", 0)

    def _type_str(self, type_id: int, inner: str, depth: int) -> str:
        if depth > MAX_DEPTH:
            raise BtfError(f"BTF type id {type_id}: type nests too deep (reference cycle?)")
        t = self.type_by_id(type_id)
        deeper = depth + 1
        match t:
            case Ptr():
                target = self.type_by_id(t.type)
                ptr = "*" + inner
                if isinstance(target, Array | FuncProto):
                    ptr = f"({ptr})"
                return self._type_str(target.id, ptr, deeper)
            case Const() | Volatile() | Restrict():
                return self._qualified_str(t, inner, deeper)
            case TypeTag():
                return self._type_str(t.type, inner, deeper)
            case Array():
                return self._type_str(t.type, f"{inner}[{t.nelems}]", deeper)
            case FuncProto():
                params = [
                    "..." if p.type == 0 else self._type_str(p.type, p.name, deeper)
                    for p in t.params
                ]
                return self._type_str(t.type, f"{inner}({', '.join(params) or 'void'})", deeper)
            case Func() | Var():
                return self._type_str(t.type, t.name + inner, deeper)
        return _join(_tag_str(t), inner)

    def _qualified_str(self, t: Const | Volatile | Restrict, inner: str, depth: int) -> str:
        word = _QUALIFIERS[type(t)]
        if isinstance(self.type_by_id(t.type), Ptr):
            # `char *const p`: the qualifier binds to the pointer
            return self._type_str(t.type, f"{word} {inner}".rstrip(), depth)
        base = self._type_str(t.type, "", depth)
        return _join(f"{word} {base}", inner)


def _tag_str(t: BtfType) -> str:
    """The name of a type that names no other: "struct x", "datasec .data", "int"."""
    match t:
        case Struct():
            return f"struct {t.name or '(anon)'}"
        case Union():
            return f"union {t.name or '(anon)'}"
        case Enum():
            return f"enum {t.name or '(anon)'}"
        case Fwd():
            return f"{'union' if t.kind_flag else 'struct'} {t.name or '(anon)'}"
        case Datasec():
            return f"datasec {t.name}"
        case DeclTag():
            return f"decl_tag {t.name}"
        case Void():
            return "void"
    return t.name or "(anon)"  # INT, FLOAT, TYPEDEF


_QUALIFIERS: dict[type[Ref], str] = {Const: "const", Volatile: "volatile", Restrict: "restrict"}


def _join(base: str, inner: str) -> str:
    if not inner:
        return base
    if inner[0] == "[":
        return base + inner
    return f"{base} {inner}"
