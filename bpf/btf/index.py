"""A target BTF held as its raw bytes, indexed, and decoded one type at a time.

vmlinux BTF holds ~127,000 types; as Python objects they cost the broker
~87 MiB and a second to build, for the few dozen types a CO-RE relocation,
an attach target or a ksym ever touches. A LazyTable keeps the blob as read
(bytes, or vmlinux's read-only mapping) and two arrays per type id, its
record's offset and its name's string offset (4 bytes each, built by one
walk on creation), and decodes a type when it is asked for, keeping the
last few hundred decoded (the hot ones, task_struct and its members, are
touched by every relocation). A name is found by searching the bytes: the
string section for the name's offsets, then the name-offset array for those
values; no name -> ids dict, but the last lookups are kept. Module BTF is
split BTF on top of vmlinux: ids below its start id and string offsets
below the base's string length belong to the base table.

Read-only: what the loader rewrites before BPF_BTF_LOAD is the object's own
BTF (facade.py), never the kernel's.
"""

from __future__ import annotations

import array
import bisect
from collections import OrderedDict
from collections.abc import Callable, Iterator

from gfxbpf.bpf.btf.kinds import (
    KIND_ARRAY,
    KIND_DATASEC,
    KIND_DECL_TAG,
    KIND_ENUM,
    KIND_ENUM64,
    KIND_FUNC_PROTO,
    KIND_INT,
    KIND_NAMES,
    KIND_STRUCT,
    KIND_UNION,
    KIND_VAR,
    BtfError,
    BtfType,
    Void,
)
from gfxbpf.bpf.btf.parse import BtfBytes, _parse_header, _TypeParser
from gfxbpf.bpf.btf.table import TypeTable

# Decoded types kept per table; a relocation touches tens, an object hundreds.
DECODED_CACHE = 512
_SIZES_CACHE = 4096
# Occurrences of a name inside longer strings searched for directly (each a
# scan of the name offsets); past this many, the sorted offsets filter them.
_DIRECT_INSIDE = 16
# Names looked up kept per table (their ids): a load asks for task_struct and
# mm_struct more than once, and so does the next load.
_NAMED_CACHE = 1024


_UNKNOWN = 1 << 40  # a record "length" that ends the walk past the section


def _record_words() -> tuple[list[int], list[int]]:
    """Words of a record by the top byte of its info word (kind and kind_flag):
    fixed words (header and fixed tail), and words per vlen element."""
    tail = {KIND_INT: 1, KIND_ARRAY: 3, KIND_VAR: 1, KIND_DECL_TAG: 1}
    per = {KIND_STRUCT: 3, KIND_UNION: 3, KIND_ENUM: 2, KIND_FUNC_PROTO: 2}
    per |= {KIND_DATASEC: 3, KIND_ENUM64: 3}
    fixed = [3 + tail.get(b & 0x1F, 0) if b & 0x1F in KIND_NAMES else _UNKNOWN for b in range(256)]
    fixed[0] = fixed[0x80] = _UNKNOWN  # VOID is never written
    return fixed, [per.get(b & 0x1F, 0) for b in range(256)]


_FIXED, _PER = _record_words()


class _Steps(dict[int, int]):
    """Words from a record's start to the next one's, by its info word: a
    dict lookup per record instead of the arithmetic (vmlinux has ~127,000
    records but a few hundred distinct info words)."""

    def __missing__(self, info: int) -> int:
        b = info >> 24
        self[info] = step = _FIXED[b] + _PER[b] * (info & 0xFFFF)
        return step


def walk_offsets(data: BtfBytes, t_start: int, t_len: int) -> tuple[array.array[int], bytes]:
    """The offset (in 4-byte words within the type section) of every record, in
    id order, and their name offsets as bytes (4 each, to search at C speed):
    the one pass over all types, kept tight (no object per type)."""
    if t_start % 4 or t_len % 4:
        raise BtfError(f"BTF type section at byte {t_start} ({t_len} bytes) is not 4-byte aligned")
    w = memoryview(data)[t_start : t_start + t_len].cast("I")
    offs: array.array[int] = array.array("I")
    names: array.array[int] = array.array("I")
    app, napp = offs.append, names.append
    steps = _Steps()
    n = len(w) - 2
    pos = 0
    while pos < n:
        app(pos)
        napp(w[pos])
        pos += steps[w[pos + 1]]
    if pos != len(w):
        _bad_walk(w, offs, pos, t_start)
    return offs, names.tobytes()


def _bad_walk(w: memoryview, offs: array.array[int], pos: int, t_start: int) -> None:
    if pos < len(w):  # stopped short of a whole header
        where = f"BTF type id {len(offs) + 1} at byte offset {t_start + pos * 4}"
        raise BtfError(f"{where}: truncated header ({(len(w) - pos) * 4} bytes left, need 12)")
    last = offs[-1]
    where = f"BTF type id {len(offs)} at byte offset {t_start + last * 4}"
    kind = (w[last + 1] >> 24) & 0x1F
    if _FIXED[kind] >= _UNKNOWN:
        raise BtfError(f"{where}: unknown kind {kind}")
    raise BtfError(f"{where}: its members run past the end of the type section")


class LazyTypes:
    """types[i] of a LazyTable: decoded on access, the last DECODED_CACHE kept."""

    def __init__(self, table: LazyTable) -> None:
        self._t = table
        self._cache: OrderedDict[int, BtfType] = OrderedDict()

    def __len__(self) -> int:
        return self._t.count

    def __getitem__(self, tid: int) -> BtfType:
        t = self._cache.get(tid)
        if t is not None:
            self._cache.move_to_end(tid)
            return t
        t = self._t.decode(tid)
        self._cache[tid] = t
        if len(self._cache) > DECODED_CACHE:
            self._cache.popitem(last=False)
        return t

    def __iter__(self) -> Iterator[BtfType]:
        """Every type, decoded one by one and not kept (tests, tools)."""
        for tid in range(len(self)):
            yield self._t.decode(tid)


class LazyTable(TypeTable):
    """A read-only TypeTable over a raw BTF blob (split on `base` when given)."""

    def __init__(self, data: BtfBytes, base: LazyTable | None = None) -> None:
        _v, _f, t_start, t_len, s_start, s_len = _parse_header(data)
        if s_len and data[s_start + s_len - 1] != 0:
            raise BtfError(f"BTF string section at byte offset {s_start} does not end with NUL")
        self.data = data
        self.base = base
        self._t = (t_start, t_start + t_len)
        self._s = (s_start, s_start + s_len)
        self.start_id: int = base.count if base is not None else 1
        self.str_shift: int = base.str_end if base is not None else 0
        self.str_end: int = self.str_shift + s_len
        self.offsets, self._names_raw = walk_offsets(data, t_start, t_len)
        self._sorted_names: array.array[int] | None = None
        self._named: dict[tuple[str, Callable[[str], str] | None], list[int]] = {}
        self.count: int = self.start_id + len(self.offsets)
        self._parser = _TypeParser(data, b"", {}, self.string_at)
        self.types = LazyTypes(self)  # type: ignore[assignment]
        self._by_name = None
        self._sizes: dict[int, int] = {}
        self._str_cache: dict[int, str] = {}

    @property
    def strings(self) -> bytes:
        """The string section, the base's first (a copy: for tools and tests)."""
        own = self.data[self._s[0] : self._s[1]]
        return self.base.strings + own if self.base is not None else own

    @strings.setter
    def strings(self, value: bytes) -> None:
        raise BtfError("a kernel BTF table is read-only")

    def __repr__(self) -> str:
        return f"<LazyTable ids {self.start_id}..{self.count - 1}, {len(self.data)} bytes>"

    # ------------------------------------------------------------- decoding

    def decode(self, tid: int) -> BtfType:
        if tid < self.start_id:
            if self.base is not None:
                return self.base.types[tid]
            if tid == 0:
                return Void(0, 0, "", 0, False)
        if not 0 <= tid < self.count:
            raise BtfError(f"BTF type id {tid} out of range (last id is {self.count - 1})")
        return self._parser.decode_one(tid, self._t[0] + 4 * self.offsets[tid - self.start_id])

    def type_by_id(self, type_id: int) -> BtfType:
        return self.types[type_id]

    def kind_of(self, tid: int) -> int:
        """The kind of type `tid`, read from its header without decoding it."""
        if tid < self.start_id:
            return self.base.kind_of(tid) if self.base is not None else 0
        pos = self._t[0] + 4 * self.offsets[tid - self.start_id] + 4
        return (int.from_bytes(self.data[pos : pos + 4], "little") >> 24) & 0x1F

    def size_of(self, type_id: int) -> int:
        if len(self._sizes) > _SIZES_CACHE:
            self._sizes.clear()
        return super().size_of(type_id)

    # -------------------------------------------------------------- strings

    def string_at(self, off: int) -> str:
        if off < self.str_shift and self.base is not None:
            return self.base.string_at(off)
        start, end = self._s
        at = start + off - self.str_shift
        if not start <= at < end:
            if off == 0:
                return ""
            raise BtfError(f"string offset {off} is past the end of the BTF string section")
        stop = self.data.find(b"\0", at, end)
        return self.data[at:stop].decode("utf-8", "replace")

    def add_string(self, s: str) -> int:
        raise BtfError("a kernel BTF table is read-only")

    def _name_offsets(self, name: str, essential: Callable[[str], str] | None) -> list[int]:
        """String offsets (in this table's numbering) whose string is `name`, or,
        given `essential` (CO-RE's name without its ___flavour), whose essential
        name is `name`."""
        raw = name.encode()
        data = self.data
        start, end = self._s
        out = []
        # With `essential`, a flavour (name___x) counts too: one scan for the bare
        # name (each scan of vmlinux's 2.3 MB of strings is ~1 ms), then a look
        # at what follows it.
        pat = raw if essential else raw + b"\0"
        at = data.find(pat, start, end)
        while at >= 0:
            off = at - start + self.str_shift
            if essential is None or essential(self.string_at(off)) == name:
                out.append(off)
            at = data.find(pat, at + 1, end)
        if self.base is not None:
            out += self.base._name_offsets(name, essential)
        return out

    # --------------------------------------------------------------- lookups

    def ids_named(self, name: str, essential: Callable[[str], str] | None = None) -> list[int]:
        """This table's own type ids (not its base's) named `name`, in id order;
        with `essential`, those whose essential name is `name`."""
        if not name:
            return []
        key = (name, essential)
        ids = self._named.get(key)
        if ids is None:
            ids = self._lookup(name, essential)
            if len(self._named) >= _NAMED_CACHE:
                self._named.clear()
            self._named[key] = ids
        return list(ids)

    def _lookup(self, name: str, essential: Callable[[str], str] | None) -> list[int]:
        raw = self._names_raw
        ids = []
        noffs = self._name_offsets(name, essential)
        inside = [o for o in noffs if not self._starts_string(o)]
        if len(inside) > _DIRECT_INSIDE:  # "int" in "unsigned int"...: filter them first
            noffs = [o for o in noffs if o not in inside or self._may_name(o)]
        for noff in noffs:
            pat = noff.to_bytes(4, "little")
            at = raw.find(pat)
            while at >= 0:
                if not at % 4:  # a whole entry, not the end of one and the start of the next
                    ids.append(self.start_id + at // 4)
                at = raw.find(pat, at + 1)
        return sorted(set(ids))

    def _starts_string(self, noff: int) -> bool:
        if noff < self.str_shift and self.base is not None:
            return self.base._starts_string(noff)
        at = noff - self.str_shift + self._s[0]
        return at == self._s[0] or self.data[at - 1] == 0

    def _may_name(self, noff: int) -> bool:
        """Whether some record's name starts at string offset `noff`, by the sorted
        name offsets (built on the first question: ~10-40 ms for vmlinux, so only
        asked when a name occurs inside many longer strings)."""
        if self._sorted_names is None:
            words = memoryview(self._names_raw).cast("I")
            self._sorted_names = array.array("I", sorted(set(words)))
        i = bisect.bisect_left(self._sorted_names, noff)
        return i < len(self._sorted_names) and self._sorted_names[i] == noff

    def find_all(self, name: str, kind: int | None = None) -> list[int]:
        """Type ids named `name` (of `kind`), the base's first, then this table's."""
        ids = self.base.find_all(name, kind) if self.base is not None else []
        own = self.ids_named(name)
        return ids + [i for i in own if kind is None or self.kind_of(i) == kind]

    def find(self, name: str, kind: int | None = None) -> int | None:
        ids = self.find_all(name, kind)
        return ids[0] if ids else None
