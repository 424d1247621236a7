"""Compiled unwind tables on disk: ~/.cache/gfxbpf/unwind (or
$XDG_CACHE_HOME/gfxbpf/unwind), one flat little-endian file per table,
named by fileid.cache_key (build-id and file identity):
a header, the segments, the row arrays, the rules, the FDE ranges and the
source's name. Loading is a few array.frombytes calls (libLLVM's 6 MB table
loads in milliseconds); the folder is pruned to CACHE_LIMIT, least recently
used first, like the symbol cache (both are diskcache.py).
"""

from __future__ import annotations

import struct
import sys
from array import array

from gfxbpf.client.profiles import diskcache
from gfxbpf.client.profiles.diskcache import CACHE_LIMIT
from gfxbpf.client.profiles.unwind.compiled import FileTable, Rule

__all__ = ["CACHE_LIMIT", "decode", "default_cache_dir", "encode", "load", "store"]

# 2: signal frames; 3: realigned frames (older tables hold them as unsupported)
_MAGIC = b"GFXUNW3\n"
# magic, segments, rows, rules, FDEs, source length, row-address and index type codes
_HEADER = struct.Struct("<8sIIIIIcc2x")
_SWAP = sys.byteorder != "little"


def default_cache_dir() -> str:
    return diskcache.default_dir("unwind")


def encode(t: FileTable) -> bytes:
    wide, idx = t.starts.typecode, t.index.typecode
    src = t.source.encode("utf-8", "replace")
    head = _HEADER.pack(_MAGIC, len(t.segments), len(t.starts), len(t.rules),
                        len(t.func_starts), len(src), wide.encode(), idx.encode())  # fmt: skip
    parts = [
        array("Q", (v for seg in t.segments for v in seg)),
        t.starts,
        t.index,
        array("q", (v for r in t.rules for v in r)),
        t.func_starts,
        t.func_ends,
    ]
    if _SWAP:
        parts = [array(p.typecode, p) for p in parts]
        for p in parts:
            p.byteswap()
    return b"".join([head, *(p.tobytes() for p in parts), src])


def decode(data: bytes) -> FileTable | None:
    """The table, or None if data is not a whole table of this format."""
    if len(data) < _HEADER.size:
        return None
    magic, nseg, nrows, nrules, nfdes, nsrc, wide, idx = _HEADER.unpack_from(data)
    if magic != _MAGIC or wide not in (b"I", b"Q") or idx not in (b"H", b"I"):
        return None
    pos = _HEADER.size
    out = []
    w, i = wide.decode(), idx.decode()
    layout = (("Q", 3 * nseg), (w, nrows), (i, nrows), ("q", 5 * nrules), (w, nfdes), (w, nfdes))
    for code, count in layout:
        a = array(code)
        end = pos + a.itemsize * count
        if end > len(data):
            return None
        a.frombytes(data[pos:end])
        if _SWAP:
            a.byteswap()
        out.append(a)
        pos = end
    segs, starts, index, flat, fstarts, fends = out
    if pos + nsrc != len(data) or (nrows and max(index) >= nrules) or nrules < 1:
        return None
    return FileTable(
        segments=tuple((segs[i], segs[i + 1], segs[i + 2]) for i in range(0, len(segs), 3)),
        starts=starts,
        index=index,
        rules=[Rule(*flat[i : i + 5]) for i in range(0, len(flat), 5)],
        func_starts=fstarts,
        func_ends=fends,
        source=data[pos:].decode("utf-8", "replace"),
    )


def load(cache_dir: str, key: str) -> FileTable | None:
    """The table stored under key (diskcache.load: only the caller's own)."""
    data = diskcache.load(cache_dir, key)
    return decode(data) if data is not None else None


def store(cache_dir: str, key: str, table: FileTable, limit: int = CACHE_LIMIT) -> None:
    """Keep table under key (diskcache.store: atomic, never raises)."""
    diskcache.store(cache_dir, key, encode(table), limit)
