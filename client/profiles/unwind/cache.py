"""Compiled unwind tables on disk: ~/.cache/gfxbpf/unwind (or
$XDG_CACHE_HOME/gfxbpf/unwind), one flat little-endian file per table,
named by fileid.cache_key (build-id and file identity):
a header, the segments, the row arrays, the rules, the FDE ranges and the
source's name. Loading is a few array.frombytes calls (libLLVM's 6 MB table
loads in milliseconds); the folder is pruned to CACHE_LIMIT, least recently
used first, like the symbol cache.
"""

from __future__ import annotations

import os
import stat
import struct
import sys
import tempfile
from array import array

from gfxbpf.client.profiles.symtab import prune
from gfxbpf.client.profiles.unwind.table import FileTable, Rule

__all__ = ["CACHE_LIMIT", "decode", "default_cache_dir", "encode", "load", "store"]

_MAGIC = b"GFXUNW2\n"  # 2: signal frames (tables of 1 hold them as unsupported)
# magic, segments, rows, rules, FDEs, source length, row-address and index type codes
_HEADER = struct.Struct("<8sIIIIIcc2x")
CACHE_LIMIT = 1 << 30
_SWAP = sys.byteorder != "little"


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gfxbpf", "unwind")


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


def _private_dir(cache_dir: str) -> bool:
    """The folder is the caller's and nobody else may write in it: a table
    planted by another user would steer the unwinder."""
    try:
        st = os.stat(cache_dir)
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def load(cache_dir: str, key: str) -> FileTable | None:
    if not _private_dir(cache_dir):
        return None
    path = os.path.join(cache_dir, key)
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_uid != os.getuid():
                return None
            table = decode(f.read())
        if table is not None:
            os.utime(path)  # recently used: pruned last
        return table
    except OSError:
        return None


def store(cache_dir: str, key: str, table: FileTable, limit: int = CACHE_LIMIT) -> None:
    """Write atomically (rename), so concurrent profiles never read half a
    file. A cache that cannot be written only costs a parse next time."""
    try:
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        if not _private_dir(cache_dir):
            return
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(encode(table))
            os.replace(tmp, os.path.join(cache_dir, key))
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return
    prune(cache_dir, limit)
