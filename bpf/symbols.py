"""ELF function symbol -> file offset, for uprobes; an index per file, cached.

A uprobe is placed at a file offset, not a virtual address: offset =
st_value - sh_addr + sh_offset of the section holding the symbol (or of the
PT_LOAD segment holding it when the section index is unusable).

A library such as libcuda is ~100 MB with thousands of exported symbols, and
one attach resolves dozens of them twice (entry and return probes). So a
file is parsed once into a SymbolIndex: only the ELF header, the section and
program headers and the symbol/string/version tables are read (gfxbpf.elf,
pread), and the symbol tables are unpacked with one precompiled struct each;
.symtab only when a name is not in .dynsym. Indexes are
kept in a small LRU keyed by the file's identity from fstat (device, inode,
size, mtime and ctime: a file rewritten in place changes ctime, which no
user can set), so the next attach to the same file costs a dict lookup.
"""

from __future__ import annotations

import copy
import difflib
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from gfxbpf.bpf.errors import InputError
from gfxbpf.elf.reader import (
    SHN_UNDEF,
    SHT_NOBITS,
    STT_FUNC,
    STT_GNU_IFUNC,
    ElfError,
    ElfFile,
    SymbolTable,
)

__all__ = [
    "FunctionSymbol",
    "SymbolError",
    "SymbolIndex",
    "cache_clear",
    "cache_info",
    "cached_index",
    "index_for",
    "list_functions",
    "resolve_symbol",
    "resolve_symbols",
]

_STT_OBJECT, _STT_TLS = 1, 6
_KIND_NAMES = {_STT_OBJECT: "data object", _STT_TLS: "thread-local variable"}
_BIND_NAMES = {0: "STB_LOCAL", 1: "STB_GLOBAL", 2: "STB_WEAK", 10: "STB_GNU_UNIQUE"}
_TABLES = (".dynsym", ".symtab")
_SHN_LORESERVE = 0xFF00
_EM_ARM = 40
_VERSYM_HIDDEN = 0x8000
CACHE_SIZE = 16  # distinct library files whose index stays in memory


class SymbolError(ValueError, InputError):
    """The file, or the symbol in it, cannot be used for a uprobe."""


@dataclass(frozen=True)
class FunctionSymbol:
    name: str
    offset: int  # file offset, what a uprobe takes
    address: int  # st_value
    size: int
    binding: str  # STB_GLOBAL / STB_WEAK / STB_LOCAL
    table: str  # ".dynsym" or ".symtab"


# name -> (rank, value, shndx, size, bind, table): the symbol a name resolves to
_Entry = tuple[tuple[int, bool], int, int, int, int, str]


class SymbolIndex:
    """Every symbol name of one ELF file, parsed once; offsets computed on lookup."""

    def __init__(self, fd: int, path: str):
        self.path = path
        try:
            elf = ElfFile(fd, path)
        except ElfError as e:
            raise SymbolError(str(e)) from None
        self._file_size = elf.size
        self.machine = elf.machine
        self._sections = elf.sections
        self._loads = [(p.vaddr, p.filesz, p.offset) for p in elf.loads()]
        self._functions: dict[str, _Entry] = {}
        self._others: dict[str, int] = {}  # defined non-function symbol -> type
        self._undefined: set[str] = set()
        self.tables: list[str] = []
        self._pending: list[tuple[int, SymbolTable]] = []  # (rank, table) read, not parsed
        self._lock = threading.Lock()
        for rank, name in enumerate(_TABLES):
            try:
                table = elf.symbol_table(name)
            except ElfError as e:
                raise SymbolError(str(e)) from None
            if table is not None:
                self.tables.append(name)
                self._pending.append((rank, table))
        if self._pending and self._pending[0][1].name == ".dynsym":
            self._parse(*self._pending.pop(0))

    def _parse(self, rank: int, t: SymbolTable) -> None:
        # The hot loop of a first attach: locals only, one precompiled struct.
        _, i_info, i_shndx, i_value, i_size = t.fields
        funcs, others, undefined = self._functions, self._others, self._undefined
        versions, nver = t.versions, len(t.versions)
        for i, name, s in t.named():
            shndx, kind = s[i_shndx], s[i_info] & 0xF
            if shndx == SHN_UNDEF:
                undefined.add(name)
            elif kind != STT_FUNC and kind != STT_GNU_IFUNC:
                others.setdefault(name, kind)
            else:
                key = (rank, i < nver and bool(versions[i] & _VERSYM_HIDDEN))
                have = funcs.get(name)
                if have is None or key < have[0]:
                    funcs[name] = (key, s[i_value], shndx, s[i_size], s[i_info] >> 4, t.name)

    def _complete(self) -> None:
        """Parse the tables put off so far (.symtab: static functions, rarely wanted).
        Cached indexes are shared by the broker's threads: one parses, others wait."""
        with self._lock:
            while self._pending:
                self._parse(*self._pending[0])
                self._pending.pop(0)

    # -------------------------------------------------------------- lookups

    def named(self, path: str) -> SymbolIndex:
        """This index with messages naming path (the same file, opened another way)."""
        if path == self.path:
            return self
        other = copy.copy(self)  # shares the tables (and the lock that guards them)
        other.path = path
        return other

    def names(self) -> list[str]:
        self._complete()
        return sorted(self._functions)

    def has(self, name: str) -> bool:
        return self._lookup(name) is not None

    def _lookup(self, name: str) -> _Entry | None:
        found = self._functions.get(name)
        if found is None and self._pending:
            self._complete()
            found = self._functions.get(name)
        return found

    def _file_offset(self, name: str, value: int, shndx: int) -> int:
        if self.machine == _EM_ARM:
            value &= ~1  # Thumb bit
        if shndx < _SHN_LORESERVE and shndx < len(self._sections):
            sec = self._sections[shndx]
            if sec.type != SHT_NOBITS and sec.addr <= value <= sec.addr + sec.size:
                off = value - sec.addr + sec.offset
                if 0 <= off < self._file_size:
                    return off
        for vaddr, filesz, offset in self._loads:  # the loadable segment mapping it
            if vaddr <= value < vaddr + filesz:
                off = value - vaddr + offset
                if 0 <= off < self._file_size:
                    return off
        raise SymbolError(
            f"{self.path}: symbol {name} at {value:#x} lies in no section or "
            "loadable segment of the file"
        )

    def offset(self, symbol: str) -> int:
        """File offset of function symbol; SymbolError saying why not."""
        if not symbol or "\0" in symbol:
            raise SymbolError(f"invalid symbol name {symbol!r}")
        found = self._lookup(symbol)
        if found is not None:
            return self._file_offset(symbol, found[1], found[2])
        raise self._missing(symbol)

    def _missing(self, symbol: str) -> SymbolError:
        kind = self._others.get(symbol)
        if kind is not None:
            what = _KIND_NAMES.get(kind, f"symbol of type {kind}")
            return SymbolError(f"symbol {symbol} in {self.path} is a {what}, not a function")
        if symbol in self._undefined:
            return SymbolError(
                f"symbol {symbol} is not defined in {self.path}: it is imported from "
                "another library; probe the library that defines it"
            )
        if not self.tables:
            return SymbolError(
                f"{self.path} has no symbol table (.dynsym or .symtab): "
                "give a file offset instead of a symbol"
            )
        names = self.names()
        close = difflib.get_close_matches(symbol, names, n=5, cutoff=0.6)
        if not close:
            close = [n for n in names if symbol.lower() in n.lower()][:5]
        hint = f"; close names: {', '.join(close)}" if close else ""
        return SymbolError(
            f"function {symbol} not found in {self.path} ({' or '.join(self.tables)}){hint}"
        )

    def functions(self) -> list[FunctionSymbol]:
        self._complete()
        out = []
        for name in self.names():
            _, value, shndx, size, bind, table = self._functions[name]
            out.append(
                FunctionSymbol(
                    name=name,
                    offset=self._file_offset(name, value, shndx),
                    address=value,
                    size=size,
                    binding=_BIND_NAMES.get(bind, str(bind)),
                    table=table,
                )
            )
        return out


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _Cache:
    """A bounded LRU of SymbolIndex by file identity; thread-safe (the broker
    serves sessions on several threads)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[int, ...], SymbolIndex] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, fd: int, path: str) -> tuple[SymbolIndex, bool]:
        """(index, whether it came from the cache)."""
        key = _identity(os.fstat(fd))
        with self._lock:
            idx = self._items.get(key)
            if idx is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return idx.named(path), True
        idx = _parse(fd, path)  # outside the lock: a slow parse blocks no other file
        with self._lock:
            self.misses += 1
            self._items[key] = idx
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return idx, False

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.hits = self.misses = 0


def _parse(fd: int, path: str) -> SymbolIndex:
    try:
        return SymbolIndex(fd, path)
    except (struct.error, IndexError, OverflowError, MemoryError) as e:
        raise SymbolError(f"{path} is not a valid ELF file: {e}") from None


_CACHE = _Cache(CACHE_SIZE)


def index_for(path: str | os.PathLike[str]) -> SymbolIndex:
    """The symbol index of the file at path (e.g. /proc/self/fd/N), from the
    cache when the same file was indexed before."""
    return cached_index(path)[0]


def cached_index(path: str | os.PathLike[str]) -> tuple[SymbolIndex, bool]:
    """index_for(path), and whether the cache already held it (for the audit log)."""
    spath = os.fspath(path)
    try:
        fd = os.open(spath, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise SymbolError(f"cannot open {spath}: {e.strerror}") from None
    try:
        return _CACHE.get(fd, spath)
    except OSError as e:
        raise SymbolError(f"cannot read {spath}: {e.strerror}") from None
    finally:
        os.close(fd)


def cache_info() -> tuple[int, int, int]:
    """(hits, misses, files held) of the index cache."""
    return _CACHE.hits, _CACHE.misses, len(_CACHE._items)


def cache_clear() -> None:
    _CACHE.clear()


def resolve_symbol(path: str | os.PathLike[str], symbol: str) -> int:
    """File offset of function `symbol` in the ELF file at `path`.

    Looks in .dynsym first, then .symtab (static functions). Raises
    SymbolError if the file is not ELF, the symbol is missing, undefined
    (imported from another library), or not a function.
    """
    if not symbol or "\0" in symbol:
        raise SymbolError(f"invalid symbol name {symbol!r}")
    return index_for(path).offset(symbol)


def resolve_symbols(path: str | os.PathLike[str], symbols: Iterable[str]) -> list[int]:
    """File offsets of several functions, one index lookup for all."""
    idx = index_for(path)
    return [idx.offset(s) for s in symbols]


def list_functions(path: str | os.PathLike[str]) -> list[FunctionSymbol]:
    """Every defined function in the file, one per name (dynsym first), by name."""
    return index_for(path).functions()
