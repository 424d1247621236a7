"""Address -> function tables, parsed once per file and kept on disk.

A table is keyed by the mapped file's build-id and its identity (fileid.py:
device, inode, size, mtime, ctime; a build-id alone is a claim any file can
make), so a 96 MB library is parsed by the first profile that meets it and
only loaded by the next ones. Only files of the caller or root are cached
(diskcache.py: the one disk cache, used only where it is the caller's). The cache file is a
flat binary: a header, the PT_LOAD segments, the sorted start addresses and
sizes as 64-bit arrays, then the names, one per line.
"""

from __future__ import annotations

import bisect
import struct
from array import array
from dataclasses import dataclass

from gfxbpf.client.profiles import diskcache

__all__ = ["SymbolTable", "default_cache_dir", "load", "store"]

# 2: names without their symbol versions (elfsyms._unversioned): tables cached
# before hold "clock_gettime@GLIBC_2.2.5" and are parsed again.
_MAGIC = b"GFXSYM2\n"
_HEADER = struct.Struct("<8sII")  # magic, number of segments, number of symbols
_NESTED = 8  # how many symbols back lookup() looks for one that covers an address


def default_cache_dir() -> str:
    return diskcache.default_dir("symbols")


@dataclass
class SymbolTable:
    segments: tuple[tuple[int, int, int], ...]  # (p_offset, p_vaddr, p_filesz)
    starts: array[int]  # "Q", sorted
    sizes: array[int]  # "Q"
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
    """The table stored under key (diskcache.load: only the caller's own)."""
    data = diskcache.load(cache_dir, key)
    return SymbolTable.decode(data) if data is not None else None


def store(cache_dir: str, key: str, table: SymbolTable) -> None:
    """Keep table under key (diskcache.store: atomic, never raises)."""
    diskcache.store(cache_dir, key, table.encode())
