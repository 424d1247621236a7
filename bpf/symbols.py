"""ELF function symbol -> file offset, for uprobes.

A uprobe is placed at a file offset, not a virtual address: offset =
st_value - sh_addr + sh_offset of the section holding the symbol (or of the
PT_LOAD segment holding it when the section index is unusable).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from gfxbpf.bpf.errors import InputError

__all__ = ["FunctionSymbol", "SymbolError", "list_functions", "resolve_symbol"]

_FUNC_TYPES = ("STT_FUNC", "STT_LOOS")  # STT_LOOS (10) is STT_GNU_IFUNC
_TABLES = (".dynsym", ".symtab")
_VERSYM_HIDDEN = 0x8000


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


class _Elf:
    """An open ELF file; every pyelftools failure becomes a SymbolError."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        try:
            self.f = open(self.path, "rb")
        except OSError as e:
            raise SymbolError(f"cannot open {self.path}: {e.strerror}") from None
        try:
            self.size = os.fstat(self.f.fileno()).st_size
            magic = self.f.read(4)
            self.f.seek(0)
            if magic != b"\x7fELF":
                raise SymbolError(f"{self.path} is not an ELF file")
            self.elf = ELFFile(self.f)
            self.machine = self.elf["e_machine"]
        except SymbolError:
            self.close()
            raise
        except (ELFError, Exception) as e:  # pyelftools raises many types on bad input
            self.close()
            raise SymbolError(f"{self.path} is not a valid ELF file: {e}") from None

    def close(self) -> None:
        self.f.close()

    def __enter__(self) -> _Elf:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fits(self, offset: int, size: int) -> bool:
        return 0 <= offset and 0 <= size and offset + size <= self.size

    def tables(self) -> Iterator[tuple[str, Any, Any]]:
        """(table name, symbol section, versym section or None)."""
        for name in _TABLES:
            try:
                sec = self.elf.get_section_by_name(name)
            except Exception as e:
                raise SymbolError(f"{self.path}: corrupt section headers: {e}") from None
            if sec is None or sec["sh_type"] == "SHT_NOBITS":
                continue
            # A corrupt size would make pyelftools walk far past the file.
            if not self._fits(sec["sh_offset"], sec["sh_size"]) or sec["sh_entsize"] <= 0:
                raise SymbolError(f"{self.path}: corrupt {name} section")
            versym = None
            if name == ".dynsym":
                try:
                    versym = self.elf.get_section_by_name(".gnu.version")
                except Exception:
                    versym = None
            yield name, sec, versym

    def symbols(self, sec: Any) -> Iterator[tuple[int, Any]]:
        try:
            yield from enumerate(sec.iter_symbols())
        except Exception as e:
            raise SymbolError(f"{self.path}: corrupt symbol table {sec.name}: {e}") from None

    def hidden(self, versym: Any, index: int) -> bool:
        """A non-default symbol version (memcpy@GLIBC_2.2.5 next to memcpy@@...)."""
        if versym is None:
            return False
        try:
            ndx = versym.get_symbol(index).entry["ndx"]
        except Exception:
            return False
        return isinstance(ndx, int) and bool(ndx & _VERSYM_HIDDEN)

    def file_offset(self, sym: Any, name: str) -> int:
        value = sym["st_value"]
        if self.machine == "EM_ARM":
            value &= ~1  # Thumb bit
        shndx = sym["st_shndx"]
        if isinstance(shndx, int):
            try:
                sec = self.elf.get_section(shndx)
            except Exception:
                sec = None
            if (
                sec is not None
                and sec["sh_type"] != "SHT_NOBITS"
                and sec["sh_addr"] <= value <= sec["sh_addr"] + sec["sh_size"]
            ):
                off = value - sec["sh_addr"] + sec["sh_offset"]
                if 0 <= off < self.size:
                    return off
        # Fall back to the loadable segment that maps the address.
        try:
            for seg in self.elf.iter_segments():
                if seg["p_type"] != "PT_LOAD":
                    continue
                if seg["p_vaddr"] <= value < seg["p_vaddr"] + seg["p_filesz"]:
                    off = value - seg["p_vaddr"] + seg["p_offset"]
                    if 0 <= off < self.size:
                        return off
        except Exception as e:
            raise SymbolError(f"{self.path}: corrupt program headers: {e}") from None
        raise SymbolError(
            f"{self.path}: symbol {name} at {value:#x} lies in no section or "
            "loadable segment of the file"
        )


def _iter_functions(elf: _Elf) -> Iterator[tuple[str, str, Any, bool]]:
    """(table, name, symbol, hidden) for every defined function symbol."""
    for table, sec, versym in elf.tables():
        for i, sym in elf.symbols(sec):
            if sym["st_info"]["type"] not in _FUNC_TYPES or not sym.name:
                continue
            if sym["st_shndx"] == "SHN_UNDEF":
                continue
            yield table, sym.name, sym, elf.hidden(versym, i)


def resolve_symbol(path: str | os.PathLike[str], symbol: str) -> int:
    """File offset of function `symbol` in the ELF file at `path`.

    Looks in .dynsym first, then .symtab (static functions). Raises
    SymbolError if the file is not ELF, the symbol is missing, undefined
    (imported from another library), or not a function.
    """
    if not symbol or "\0" in symbol:
        raise SymbolError(f"invalid symbol name {symbol!r}")
    with _Elf(path) as elf:
        other_kind: str | None = None
        undefined = False
        seen_tables = []
        for table, sec, versym in elf.tables():
            seen_tables.append(table)
            found: list[tuple[bool, Any]] = []
            for i, sym in elf.symbols(sec):
                if sym.name != symbol:
                    continue
                if sym["st_shndx"] == "SHN_UNDEF":
                    undefined = True
                    continue
                kind = sym["st_info"]["type"]
                if kind not in _FUNC_TYPES:
                    other_kind = other_kind or kind
                    continue
                found.append((elf.hidden(versym, i), sym))
            if found:
                # The default version wins over hidden (old) versions.
                found.sort(key=lambda t: t[0])
                return elf.file_offset(found[0][1], symbol)
        if other_kind is not None:
            kind = {"STT_OBJECT": "data object", "STT_TLS": "thread-local variable"}.get(
                other_kind, other_kind
            )
            raise SymbolError(f"symbol {symbol} in {elf.path} is a {kind}, not a function")
        if undefined:
            raise SymbolError(
                f"symbol {symbol} is not defined in {elf.path}: it is imported from "
                "another library; probe the library that defines it"
            )
        if not seen_tables:
            raise SymbolError(
                f"{elf.path} has no symbol table (.dynsym or .symtab): "
                "give a file offset instead of a symbol"
            )
        names = sorted({n for _, n, _, _ in _iter_functions(elf)})
        close = difflib.get_close_matches(symbol, names, n=5, cutoff=0.6)
        if not close:
            close = [n for n in names if symbol.lower() in n.lower()][:5]
        hint = f"; close names: {', '.join(close)}" if close else ""
        raise SymbolError(
            f"function {symbol} not found in {elf.path} ({' or '.join(seen_tables)}){hint}"
        )


def list_functions(path: str | os.PathLike[str]) -> list[FunctionSymbol]:
    """Every defined function in the file, one per name (dynsym first), by name."""
    out: dict[str, FunctionSymbol] = {}
    rank: dict[str, tuple[int, bool]] = {}
    with _Elf(path) as elf:
        for table, name, sym, hidden in _iter_functions(elf):
            key = (_TABLES.index(table), hidden)
            if name in rank and rank[name] <= key:
                continue
            rank[name] = key
            out[name] = FunctionSymbol(
                name=name,
                offset=elf.file_offset(sym, name),
                address=sym["st_value"],
                size=sym["st_size"],
                binding=sym["st_info"]["bind"],
                table=table,
            )
    return [out[k] for k in sorted(out)]
