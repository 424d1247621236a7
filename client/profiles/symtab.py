"""Address -> function tables, parsed once per file and kept on disk.

A table is keyed by the mapped file's build-id and its identity (fileid.py:
device, inode, size, mtime, ctime; a build-id alone is a claim any file can
make), so a 96 MB library is parsed by the first profile that meets it and
only loaded by the next ones. Only files of the caller or root are cached. The cache file is a
flat binary: a header, the PT_LOAD segments, the sorted start addresses and
sizes as 64-bit arrays, then the names, one per line.
"""

from __future__ import annotations

import bisect
import os
import struct
import tempfile
from array import array
from dataclasses import dataclass

__all__ = ["CACHE_LIMIT", "SymbolTable", "default_cache_dir", "load", "prune", "store"]

_MAGIC = b"GFXSYM1\n"
_HEADER = struct.Struct("<8sII")  # magic, number of segments, number of symbols
_NESTED = 8  # how many symbols back lookup() looks for one that covers an address
# The cache keeps the most recently used tables up to this size (libLLVM's is 3 MB).
CACHE_LIMIT = 1 << 30


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gfxbpf", "symbols")


@dataclass
class SymbolTable:
    segments: tuple[tuple[int, int, int], ...]  # (p_offset, p_vaddr, p_filesz)
    starts: array  # "Q", sorted
    sizes: array  # "Q"
    names: list[str]

    @classmethod
    def build(
        cls, segments: tuple[tuple[int, int, int], ...], funcs: list[tuple[int, int, str]]
    ) -> SymbolTable:
        funcs = sorted(funcs)
        return cls(
            segments=segments,
            starts=array("Q", (f[0] for f in funcs)),
            sizes=array("Q", (f[1] for f in funcs)),
            # A name holds no newline in any real table; the cache format needs that.
            names=[f[2].replace("\n", " ") for f in funcs],
        )

    def vaddr(self, file_offset: int) -> int | None:
        """The ELF virtual address that file_offset is loaded at."""
        for off, vaddr, filesz in self.segments:
            if off <= file_offset < off + filesz:
                return file_offset - off + vaddr
        return None

    def lookup(self, vaddr: int) -> str | None:
        """The function holding vaddr. A symbol of size 0 (hand-written assembly
        often has one) reaches up to the next symbol."""
        i = bisect.bisect_right(self.starts, vaddr) - 1
        if i < 0:
            return None
        if self.sizes[i] == 0:
            return self.names[i]
        # The nearest start may be a small symbol nested in (or ending before)
        # a larger function that still covers vaddr: look a few back.
        for j in range(i, max(i - _NESTED, -1), -1):
            if vaddr < self.starts[j] + self.sizes[j]:
                return self.names[j]
        return None

    def encode(self) -> bytes:
        head = _HEADER.pack(_MAGIC, len(self.segments), len(self.names))
        segs = array("Q", (v for seg in self.segments for v in seg))
        return b"".join(
            (
                head,
                segs.tobytes(),
                self.starts.tobytes(),
                self.sizes.tobytes(),
                "\n".join(self.names).encode("utf-8", "surrogateescape"),
            )
        )

    @classmethod
    def decode(cls, data: bytes) -> SymbolTable | None:
        if len(data) < _HEADER.size:
            return None
        magic, nseg, nsym = _HEADER.unpack_from(data)
        if magic != _MAGIC:
            return None
        pos = _HEADER.size
        arrays = []
        for count in (3 * nseg, nsym, nsym):
            if len(data) < pos + 8 * count:
                return None  # cut short
            a = array("Q")
            a.frombytes(data[pos : pos + 8 * count])
            arrays.append(a)
            pos += 8 * count
        if struct.pack("=I", 1) != struct.pack("<I", 1):
            for a in arrays:  # the file is little-endian
                a.byteswap()
        names = data[pos:].decode("utf-8", "surrogateescape").split("\n") if nsym else []
        if len(names) != nsym:
            return None
        segs = arrays[0]
        return cls(
            segments=tuple((segs[i], segs[i + 1], segs[i + 2]) for i in range(0, len(segs), 3)),
            starts=arrays[1],
            sizes=arrays[2],
            names=names,
        )


def load(cache_dir: str, key: str) -> SymbolTable | None:
    path = os.path.join(cache_dir, key)
    try:
        with open(path, "rb") as f:
            table = SymbolTable.decode(f.read())
        if table is not None:
            os.utime(path)  # recently used: pruned last
        return table
    except OSError:
        return None


def prune(cache_dir: str, limit: int = CACHE_LIMIT) -> None:
    """Remove the least recently used tables until the folder holds at most limit bytes."""
    try:
        entries = []
        with os.scandir(cache_dir) as it:
            for e in it:
                if e.is_file(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    entries.append((st.st_mtime_ns, st.st_size, e.path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= limit:
                break
            os.unlink(path)
            total -= size
    except OSError:
        pass


def store(cache_dir: str, key: str, table: SymbolTable) -> None:
    """Write atomically (rename), so concurrent profiles never read half a file.
    A cache that cannot be written only costs a re-parse next time."""
    try:
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(table.encode())
            os.replace(tmp, os.path.join(cache_dir, key))
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return
    prune(cache_dir)
