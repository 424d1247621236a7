"""Address -> function tables, parsed once per file and kept on disk.

A table is keyed by the mapped file's build-id and its identity (fileid.py:
device, inode, size, mtime, ctime; a build-id alone is a claim any file can
make), so a 96 MB library is parsed by the first profile that meets it and
only loaded by the next ones. Only files of the caller or root are cached
(diskcache.py: the one disk cache, used only where it is the caller's). The cache file is a
flat binary: a header, the PT_LOAD segments, the sorted start addresses,
sizes and name ends as 64-bit arrays, then the names back to back. The names
stay in those bytes and are decoded as looked up: libtorch_cpu.so has 380,000
C++ symbols (62 MB of names), and a list of them took 214 MB to load.
"""

from __future__ import annotations

import bisect
import itertools
import struct
from array import array
from dataclasses import dataclass

from gfxbpf.client.profiles import diskcache

__all__ = ["SymbolTable", "default_cache_dir", "load", "store"]

# 2: names without their symbol versions (elfsyms._unversioned): tables cached
# before hold "clock_gettime@GLIBC_2.2.5" and are parsed again. 3: the names'
# ends, so a load splits nothing.
_MAGIC = b"GFXSYM3\n"
_HEADER = struct.Struct("<8sII")  # magic, number of segments, number of symbols
_NESTED = 8  # how many symbols back lookup() looks for one that covers an address


def default_cache_dir() -> str:
    return diskcache.default_dir("symbols")


@dataclass(eq=False)
class SymbolTable:
    segments: tuple[tuple[int, int, int], ...]  # (p_offset, p_vaddr, p_filesz)
    starts: array[int]  # "Q", sorted
    sizes: array[int]  # "Q"
    ends: array[int]  # "Q": where each name ends in blob, counted from base
    blob: bytes  # the names, UTF-8 back to back, from base on
    base: int = 0

    @classmethod
    def build(
        cls, segments: tuple[tuple[int, int, int], ...], funcs: list[tuple[int, int, str]]
    ) -> SymbolTable:
        funcs = sorted(funcs)
        # A name holds no newline in any real table; a frame name must not either.
        names = [f[2].replace("\n", " ").encode("utf-8", "surrogateescape") for f in funcs]
        return cls(
            segments=segments,
            starts=array("Q", (f[0] for f in funcs)),
            sizes=array("Q", (f[1] for f in funcs)),
            ends=array("Q", itertools.accumulate(len(n) for n in names)),
            blob=b"".join(names),
        )

    def __eq__(self, other: object) -> bool:
        """The same symbols (wherever the names' bytes are kept)."""
        if not isinstance(other, SymbolTable):
            return NotImplemented
        mine = (self.segments, self.starts, self.sizes, self.ends, self._names_bytes())
        return mine == (other.segments, other.starts, other.sizes, other.ends, other._names_bytes())

    def _names_bytes(self) -> bytes:
        return self.blob[self.base : self.base + (self.ends[-1] if self.ends else 0)]

    def name(self, i: int) -> str:
        """The i-th name (by start address)."""
        start = self.base + (self.ends[i - 1] if i else 0)
        return str(self.blob[start : self.base + self.ends[i]], "utf-8", "surrogateescape")

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
            return self.name(i)
        # The nearest start may be a small symbol nested in (or ending before)
        # a larger function that still covers vaddr: look a few back.
        for j in range(i, max(i - _NESTED, -1), -1):
            if vaddr < self.starts[j] + self.sizes[j]:
                return self.name(j)
        return None

    def encode(self) -> bytes:
        head = _HEADER.pack(_MAGIC, len(self.segments), len(self.ends))
        segs = array("Q", (v for seg in self.segments for v in seg))
        arrays = (segs, self.starts, self.sizes, self.ends)
        return b"".join((head, *(a.tobytes() for a in arrays), self._names_bytes()))

    @classmethod
    def decode(cls, data: bytes) -> SymbolTable | None:
        if len(data) < _HEADER.size:
            return None
        magic, nseg, nsym = _HEADER.unpack_from(data)
        if magic != _MAGIC:
            return None
        pos = _HEADER.size
        arrays = []
        for count in (3 * nseg, nsym, nsym, nsym):
            if len(data) < pos + 8 * count:
                return None  # cut short
            a = array("Q")
            a.frombytes(data[pos : pos + 8 * count])
            arrays.append(a)
            pos += 8 * count
        if struct.pack("=I", 1) != struct.pack("<I", 1):
            for a in arrays:  # the file is little-endian
                a.byteswap()
        segs, starts, sizes, ends = arrays
        if len(data) - pos != (ends[-1] if nsym else 0):
            return None  # the names are not as long as their ends say
        return cls(
            segments=tuple((segs[i], segs[i + 1], segs[i + 2]) for i in range(0, len(segs), 3)),
            starts=starts,
            sizes=sizes,
            ends=ends,
            blob=data,  # kept whole: slicing the names out would copy them
            base=pos,
        )


def load(cache_dir: str, key: str) -> SymbolTable | None:
    """The table stored under key (diskcache.load: only the caller's own)."""
    data = diskcache.load(cache_dir, key)
    return SymbolTable.decode(data) if data is not None else None


def store(cache_dir: str, key: str, table: SymbolTable) -> None:
    """Keep table under key (diskcache.store: atomic, never raises)."""
    diskcache.store(cache_dir, key, table.encode())
