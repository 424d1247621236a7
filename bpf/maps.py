"""Map: typed access to one kernel map through its fd.

Read methods use only BPF_MAP_LOOKUP_ELEM, GET_NEXT_KEY, LOOKUP_BATCH and
OBJ_GET_INFO_BY_FD, the commands a process without capabilities may run on
an fd it was handed (docs/BPF-ABI.md, "What an unprivileged fd holder may do").
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.consts import PERCPU_MAP_TYPES, MapType

if TYPE_CHECKING:
    from gfxbpf.bpf.btf.facade import Btf

# Upper bound for one batch's key+value buffers.
BATCH_BYTES = 4 << 20
# Errnos meaning "this map type has no batch lookup": fall back to elem ops.
_NO_BATCH = frozenset({errno.EINVAL, errno.EOPNOTSUPP, bpfsys.ENOTSUPP})

# read_page cursors: a batch token, or the last key of a GET_NEXT_KEY walk.
_BATCH, _KEYS = b"B", b"K"

Value = bytes | list[bytes]  # list (one per possible CPU) for per-CPU maps
KeyLike = bytes | bytearray | memoryview | int


class CursorError(ValueError):
    """A read_page cursor that this map did not hand out."""


# NamedTuples, not dataclasses: importing dataclasses (and inspect with it)
# costs every gfxclient command ~5 ms before any work (issue 37).
class Page(NamedTuple):
    """One read_page: the pairs, and the cursor of the next page (b"": no more)."""

    items: list[tuple[bytes, Value]]
    cursor: bytes


class RawPage(NamedTuple):
    """One page as the kernel hands it over: n keys back to back, n values back
    to back (per-CPU maps: ncpus slots of `stride` bytes per value), and the
    cursor of the next page. Decoders walk these buffers in one pass instead of
    slicing a bytes object per entry."""

    keys: bytes
    values: bytes
    n: int
    cursor: bytes


def _round8(n: int) -> int:
    return (n + 7) & ~7


class Map:
    """One map. Keys and values are bytes (ints are packed little-endian).

    Per-CPU maps return a list of values, one per possible CPU.
    """

    def __init__(
        self,
        fd: int,
        *,
        name: str,
        map_type: int,
        key_size: int,
        value_size: int,
        max_entries: int,
        flags: int = 0,
        btf: Btf | None = None,
        key_type_id: int = 0,
        value_type_id: int = 0,
    ) -> None:
        self._fd = fd
        self.name = name
        self.map_type = map_type
        self.key_size = key_size
        self.value_size = value_size
        self.max_entries = max_entries
        self.flags = flags
        self.btf = btf
        self.key_type_id = key_type_id
        self.value_type_id = value_type_id
        self.percpu = map_type in PERCPU_MAP_TYPES
        self.ncpus = bpfsys.possible_cpus() if self.percpu else 1
        # Bytes of one element's value as the syscall transfers it.
        self.stride = _round8(value_size) if self.percpu else value_size
        self.buf_size = self.stride * self.ncpus

    @classmethod
    def from_fd(
        cls, fd: int, btf: Btf | None = None, key_type_id: int = 0, value_type_id: int = 0
    ) -> Map:
        """Describe an existing map fd (works without capabilities)."""
        info = bpfsys.map_info(fd)
        if btf is not None:
            key_type_id = key_type_id or info.btf_key_type_id
            value_type_id = value_type_id or info.btf_value_type_id
        return cls(
            fd,
            name=info.name,
            map_type=info.type,
            key_size=info.key_size,
            value_size=info.value_size,
            max_entries=info.max_entries,
            flags=info.map_flags,
            btf=btf,
            key_type_id=key_type_id,
            value_type_id=value_type_id,
        )

    # --- fd lifetime ---

    def fileno(self) -> int:
        if self._fd < 0:
            raise ValueError(f"map {self.name!r} is closed")
        return self._fd

    @property
    def fd(self) -> int:
        return self.fileno()

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __enter__(self) -> Map:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = _type_name(self.map_type)
        return (
            f"<Map {self.name!r} {kind} fd={self._fd} key={self.key_size} "
            f"value={self.value_size} max_entries={self.max_entries}>"
        )

    # --- packing ---

    def _key(self, key: KeyLike) -> bytes:
        if isinstance(key, int):
            try:
                return key.to_bytes(self.key_size, "little", signed=key < 0)
            except OverflowError:
                raise ValueError(f"key {key} does not fit in {self.key_size} bytes") from None
        key = bytes(key)
        if len(key) != self.key_size:
            raise ValueError(
                f"map {self.name!r}: key is {len(key)} bytes, the map's key_size is {self.key_size}"
            )
        return key

    def _one_value(self, value: bytes | bytearray | memoryview | int) -> bytes:
        if isinstance(value, int):
            try:
                return value.to_bytes(self.value_size, "little", signed=value < 0)
            except OverflowError:
                raise ValueError(f"value {value} does not fit in {self.value_size} bytes") from None
        value = bytes(value)
        if len(value) != self.value_size:
            raise ValueError(
                f"map {self.name!r}: value is {len(value)} bytes, "
                f"the map's value_size is {self.value_size}"
            )
        return value

    def _value(self, value: Any) -> bytes:
        """The syscall buffer for value.

        Per-CPU maps take a sequence with one value per possible CPU, or one
        value that is written to every CPU's slot.
        """
        if not self.percpu:
            return self._one_value(value)
        if isinstance(value, (bytes, bytearray, memoryview, int)):
            values: Sequence[Any] = [value] * self.ncpus
        else:
            values = list(value)
            if len(values) != self.ncpus:
                raise ValueError(
                    f"per-CPU map {self.name!r} needs {self.ncpus} values "
                    f"(one per possible CPU), got {len(values)}"
                )
        return b"".join(self._one_value(v).ljust(self.stride, b"\0") for v in values)

    def _split(self, buf: bytes) -> Value:
        if not self.percpu:
            return buf
        s, vs = self.stride, self.value_size
        return [buf[i : i + vs] for i in range(0, s * self.ncpus, s)]

    # --- element operations ---

    def lookup(self, key: KeyLike) -> Value | None:
        raw = bpfsys.map_lookup_elem(self.fileno(), self._key(key), self.buf_size)
        return None if raw is None else self._split(raw)

    def lookup_many(self, keys: Iterable[KeyLike]) -> list[tuple[bytes, Value]]:
        """(key, value) of each key present; for maps without batch ops (a stack table)."""
        if self.percpu:
            found = ((self._key(k), self.lookup(k)) for k in keys)
            return [(k, v) for k, v in found if v is not None]
        raw = (self._key(k) for k in keys)
        return list(bpfsys.map_lookup_elems(self.fileno(), raw, self.key_size, self.buf_size))

    def __getitem__(self, key: KeyLike) -> Value:
        value = self.lookup(key)
        if value is None:
            raise KeyError(key)
        return value

    def update(self, key: KeyLike, value: Any, flags: int = bpfsys.BPF_ANY) -> None:
        bpfsys.map_update_elem(self.fileno(), self._key(key), self._value(value), flags)

    def __setitem__(self, key: KeyLike, value: Any) -> None:
        self.update(key, value)

    def delete(self, key: KeyLike) -> bool:
        """Delete key; False if it was absent."""
        return bpfsys.map_delete_elem(self.fileno(), self._key(key))

    def keys(self) -> Iterator[bytes]:
        """Every key, by GET_NEXT_KEY.

        If the current key is deleted meanwhile, the kernel restarts from the
        first key; keys already yielded are skipped, and the walk is bounded,
        so a map that changes underneath ends instead of looping.
        """
        fd = self.fileno()
        seen: set[bytes] = set()
        key: bytes | None = None
        for _ in range(2 * (self.max_entries + 1)):
            key = bpfsys.map_get_next_key(fd, key, self.key_size)
            if key is None or len(seen) >= self.max_entries:
                return
            if key not in seen:
                seen.add(key)
                yield key

    def __iter__(self) -> Iterator[bytes]:
        return self.keys()

    def items(self) -> Iterator[tuple[bytes, Value]]:
        """(key, value) pairs by GET_NEXT_KEY + LOOKUP (keys deleted meanwhile skipped)."""
        for key in self.keys():
            value = self.lookup(key)
            if value is not None:
                yield key, value

    def batch_items(self) -> list[tuple[bytes, Value]]:
        """Every (key, value), by BPF_MAP_LOOKUP_BATCH in chunks (raw_pages).

        Map types without batch lookup are walked by GET_NEXT_KEY instead.
        """
        out: list[tuple[bytes, Value]] = []
        for page in self.raw_pages():
            out.extend(self.page_items(page))
        return out

    def read_page(self, max_entries: int, cursor: bytes = b"") -> Page:
        """Up to max_entries (key, value) pairs, from where cursor left off.

        cursor is b"" for the first page, then the previous Page.cursor, passed
        unchanged (it is opaque); Page.cursor is b"" once the map is read. A
        batch may hold more than max_entries when one hash bucket does. Raises
        CursorError for a cursor this map did not hand out, BpfError otherwise.
        """
        raw = self.read_raw_page(max_entries, cursor)
        return Page(self.page_items(raw), raw.cursor)

    def read_raw_page(self, max_entries: int, cursor: bytes = b"") -> RawPage:
        """read_page's entries as the two buffers the kernel filled (RawPage)."""
        mode, token = self._parse_cursor(cursor)
        if mode == _BATCH:
            page = self._batch_page(max(1, max_entries), token)
            if page is not None:
                return page
            token = None  # no batch lookup for this map type: walk the keys
        return self._key_page(max(1, max_entries), token)

    def raw_pages(self) -> list[RawPage]:
        """The whole map as RawPages (batch_items' reads, undivided)."""
        count = max(1, min(self.max_entries, BATCH_BYTES // max(1, self.key_size + self.buf_size)))
        pages: list[RawPage] = []
        cursor = b""
        seen = 0
        # Each page holds >= 1 element or ends; the bound stops a map that
        # keeps growing under us (LRU churn) from making this unbounded.
        for _ in range(self.max_entries + 2):
            page = self.read_raw_page(count, cursor)
            pages.append(page)
            seen += page.n
            cursor = page.cursor
            if not cursor or seen >= self.max_entries:
                break
        return pages

    def _parse_cursor(self, cursor: bytes) -> tuple[bytes, bytes | None]:
        if not cursor:
            return _BATCH, None
        mode, rest = cursor[:1], bytes(cursor[1:])
        size = max(self.key_size, 8) if mode == _BATCH else self.key_size
        if mode not in (_BATCH, _KEYS) or len(rest) != size:
            raise CursorError(f"map {self.name!r}: not a cursor of this map")
        return mode, rest

    def _batch_page(self, count: int, token: bytes | None) -> RawPage | None:
        """One LOOKUP_BATCH page; None when the map type has no batch lookup."""
        fd = self.fileno()
        while True:
            try:
                keys, values, n, nxt = bpfsys.map_lookup_batch(
                    fd, self.key_size, self.buf_size, count, token
                )
            except bpfsys.BpfError as e:
                if e.errno == errno.ENOSPC and count < self.max_entries:
                    count = min(self.max_entries, count * 2)  # a bucket was bigger than count
                    continue
                if e.errno in _NO_BATCH and token is None:
                    return None
                raise
            return RawPage(keys, values, n, b"" if nxt is None else _BATCH + nxt)

    def _key_page(self, count: int, key: bytes | None) -> RawPage:
        """One page by GET_NEXT_KEY + LOOKUP (keys deleted meanwhile skipped)."""
        fd = self.fileno()
        keys: list[bytes] = []
        values: list[bytes] = []
        while len(keys) < count:
            key = bpfsys.map_get_next_key(fd, key, self.key_size)
            if key is None:
                break
            raw = bpfsys.map_lookup_elem(fd, key, self.buf_size)
            if raw is not None:
                keys.append(key)
                values.append(raw)
        more = key is not None and len(keys) >= count
        cursor = _KEYS + key if more and key is not None else b""
        return RawPage(b"".join(keys), b"".join(values), len(keys), cursor)

    def page_items(self, page: RawPage) -> list[tuple[bytes, Value]]:
        """A RawPage cut into (key, value) pairs of bytes (per-CPU: lists)."""
        ks, vs, n = self.key_size, self.buf_size, page.n
        keys, values = page.keys, page.values
        key_list = [keys[i : i + ks] for i in range(0, n * ks, ks)]
        if self.percpu:
            split = self._split
            value_list: list[Value] = [split(values[i : i + vs]) for i in range(0, n * vs, vs)]
        else:
            value_list = [values[i : i + vs] for i in range(0, n * vs, vs)]
        return list(zip(key_list, value_list, strict=True))

    # --- decoding ---

    def decode_key(self, data: bytes) -> Any:
        if self.btf is not None and self.key_type_id:
            return self.btf.decode(self.key_type_id, data)
        return data

    def decode_value(self, data: Value) -> Any:
        if self.btf is None or not self.value_type_id:
            return data
        if isinstance(data, list):
            return [self.btf.decode(self.value_type_id, v) for v in data]
        return self.btf.decode(self.value_type_id, data)

    def read(self) -> list[tuple[Any, Any]]:
        """Every (key, value), decoded with BTF when the map has types (else bytes).

        Per-CPU values decode to a list with one value per possible CPU.
        """
        items = self.batch_items()
        kdec = self._decoder(self.key_type_id)
        vdec = self._decoder(self.value_type_id)
        if vdec is not None and self.percpu:
            one = vdec
            vdec = lambda vs: [one(v) for v in vs]  # noqa: E731
        if kdec is None and vdec is None:
            return list(items)
        kdec = kdec or _same
        vdec = vdec or _same
        return [(kdec(k), vdec(v)) for k, v in items]

    def _decoder(self, type_id: int) -> Callable[[bytes], Any] | None:
        """btf's compiled decoder for type_id (compiled once per read)."""
        if self.btf is None or not type_id:
            return None
        compiled = getattr(self.btf, "decoder", None)
        if compiled is not None:
            return compiled(type_id)
        btf = self.btf
        return lambda data: btf.decode(type_id, data)

    def sum_values(self, key: KeyLike, signed: bool = False) -> int | None:
        """A per-CPU integer counter summed over CPUs (None if key is absent)."""
        value = self.lookup(key)
        if value is None:
            return None
        return sum_percpu(value if isinstance(value, list) else [value], signed=signed)


def sum_percpu(values: Sequence[bytes], signed: bool = False) -> int:
    """Sum one little-endian integer per CPU."""
    return sum(int.from_bytes(v, "little", signed=signed) for v in values)


def sum_percpu_u64s(values: Sequence[bytes]) -> list[int]:
    """Sum each u64 lane across CPUs (a struct of u64 counters per CPU)."""
    if not values:
        return []
    lanes = len(values[0]) // 8
    totals = [0] * lanes
    for v in values:
        if len(v) // 8 != lanes:
            raise ValueError("per-CPU values differ in size")
        for i in range(lanes):
            totals[i] += int.from_bytes(v[8 * i : 8 * i + 8], "little")
    return totals


def _same(x: Any) -> Any:
    return x


def _type_name(map_type: int) -> str:
    try:
        return MapType(map_type).name.lower()
    except ValueError:
        return f"type{map_type}"
