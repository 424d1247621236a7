"""gfxbpf.bpf.symbols against small libraries built with gcc.

Offsets are checked two independent ways: from `readelf` output (value -
section address + section offset), and by comparing the file bytes at the
offset with the function's bytes in memory after ctypes loads the library.
"""

from __future__ import annotations

import ctypes
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gfxbpf.bpf.symbols import (
    CACHE_SIZE,
    SymbolError,
    cache_clear,
    cache_info,
    cached_index,
    index_for,
    list_functions,
    resolve_symbol,
)

LIB_SRC = r"""
#include <stdio.h>
int demo_data = 5;
__attribute__((noinline, used)) static int demo_static(int x) { return x * 3 + demo_data; }
__attribute__((noinline)) int demo_add(int a, int b) { return a + b + demo_static(a); }
__attribute__((noinline)) int demo_mul(int a, int b) { return a * b - demo_data; }
void demo_print(void) { printf("hi %d\n", demo_data); }
static int demo_impl(int x) { return x + 1; }
static int (*demo_resolve(void))(int) { return demo_impl; }
int demo_ifunc(int) __attribute__((ifunc("demo_resolve")));
"""

pytestmark = pytest.mark.skipif(
    shutil.which("gcc") is None or shutil.which("readelf") is None,
    reason="gcc and readelf are needed to build test libraries",
)


def _build(tmp: Path, name: str, extra: list[str]) -> Path:
    src = tmp / "demo.c"
    src.write_text(LIB_SRC)
    out = tmp / name
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O1", "-o", str(out), str(src), *extra],
        check=True,
        capture_output=True,
    )
    return out


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("symlibs")
    out = {
        "default": _build(tmp, "libdemo.so", []),
        # A different link base makes section address != file offset.
        "shifted": _build(tmp, "libdemo_shifted.so", ["-Wl,-Ttext-segment=0x10000"]),
    }
    stripped = tmp / "libdemo_stripped.so"
    shutil.copy(out["shifted"], stripped)
    subprocess.run(["strip", "--strip-all", str(stripped)], check=True)
    out["stripped"] = stripped
    return out


def _readelf_offsets(path: Path) -> dict[str, int]:
    """name -> file offset computed from readelf's section and symbol tables."""
    sections: dict[int, tuple[int, int]] = {}
    text = subprocess.run(
        ["readelf", "-SW", str(path)], check=True, capture_output=True, text=True
    ).stdout
    for m in re.finditer(
        r"^\s*\[\s*(\d+)\]\s+\S+\s+\S+\s+([0-9a-f]+)\s+([0-9a-f]+)\s", text, re.MULTILINE
    ):
        sections[int(m.group(1))] = (int(m.group(2), 16), int(m.group(3), 16))
    syms = subprocess.run(
        ["readelf", "-sW", str(path)], check=True, capture_output=True, text=True
    ).stdout
    out: dict[str, int] = {}
    for line in syms.splitlines():
        parts = line.split()
        # Num: Value Size Type Bind Vis Ndx Name
        if len(parts) < 8 or parts[3] not in ("FUNC", "IFUNC") or not parts[6].isdigit():
            continue
        value, ndx, name = int(parts[1], 16), int(parts[6]), parts[7].split("@")[0]
        addr, off = sections[ndx]
        out.setdefault(name, value - addr + off)
    return out


@pytest.mark.parametrize("which", ["default", "shifted"])
def test_offsets_match_readelf(libs: dict[str, Path], which: str) -> None:
    lib = libs[which]
    expected = _readelf_offsets(lib)
    for name in ("demo_add", "demo_mul", "demo_print", "demo_static", "demo_ifunc"):
        assert resolve_symbol(lib, name) == expected[name], name


def test_shifted_library_really_differs(libs: dict[str, Path]) -> None:
    # Guard for the test above: the shifted build must not map address == offset.
    nm = subprocess.run(
        ["nm", "-D", "--defined-only", str(libs["shifted"])],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    values = [int(ln.split()[0], 16) for ln in nm.splitlines() if ln.endswith(" demo_add")]
    assert len(values) == 1
    assert values[0] != resolve_symbol(libs["shifted"], "demo_add")


@pytest.mark.parametrize("which", ["default", "shifted"])
def test_offset_bytes_equal_loaded_code(libs: dict[str, Path], which: str) -> None:
    lib = libs[which]
    data = lib.read_bytes()
    dl = ctypes.CDLL(str(lib))
    for name in ("demo_add", "demo_mul"):
        fn = getattr(dl, name)
        addr = ctypes.cast(fn, ctypes.c_void_p).value
        assert addr is not None
        mem = ctypes.string_at(addr, 13)
        off = resolve_symbol(lib, name)
        assert data[off : off + 13] == mem, name
    assert dl.demo_add(2, 3) == 2 + 3 + 2 * 3 + 5  # the library works as built


def test_static_function_only_in_symtab(libs: dict[str, Path]) -> None:
    assert resolve_symbol(libs["shifted"], "demo_static") > 0
    with pytest.raises(SymbolError, match="demo_static not found"):
        resolve_symbol(libs["stripped"], "demo_static")
    # dynsym survives stripping.
    assert resolve_symbol(libs["stripped"], "demo_add") == resolve_symbol(
        libs["shifted"], "demo_add"
    )


def test_missing_symbol_lists_close_names(libs: dict[str, Path]) -> None:
    with pytest.raises(SymbolError) as ei:
        resolve_symbol(libs["default"], "demo_ad")
    msg = str(ei.value)
    assert "demo_ad not found" in msg and "close names" in msg and "demo_add" in msg
    with pytest.raises(SymbolError, match="not found") as ei:
        resolve_symbol(libs["default"], "zzzz_nothing_like_it")
    assert "close names" not in str(ei.value)


def test_data_symbol_is_not_a_function(libs: dict[str, Path]) -> None:
    with pytest.raises(SymbolError, match="demo_data .* is a data object, not a function"):
        resolve_symbol(libs["default"], "demo_data")


def test_imported_symbol(libs: dict[str, Path]) -> None:
    with pytest.raises(SymbolError, match="imported from another library"):
        resolve_symbol(libs["default"], "printf")


def test_not_elf_and_missing_file(tmp_path: Path) -> None:
    txt = tmp_path / "notes.txt"
    txt.write_text("hello, not an ELF file\n")
    with pytest.raises(SymbolError, match="not an ELF file"):
        resolve_symbol(txt, "main")
    with pytest.raises(SymbolError, match="cannot open"):
        resolve_symbol(tmp_path / "absent.so", "main")
    with pytest.raises(SymbolError, match="invalid symbol"):
        resolve_symbol(txt, "")


def test_list_functions(libs: dict[str, Path]) -> None:
    funcs = {f.name: f for f in list_functions(libs["shifted"])}
    for name in ("demo_add", "demo_mul", "demo_print", "demo_static", "demo_ifunc"):
        assert funcs[name].offset == resolve_symbol(libs["shifted"], name)
    assert funcs["demo_add"].table == ".dynsym"
    assert funcs["demo_static"].table == ".symtab"
    assert funcs["demo_static"].binding == "STB_LOCAL"
    assert funcs["demo_add"].address != funcs["demo_add"].offset
    assert "demo_data" not in funcs and "printf" not in funcs
    names = [f.name for f in list_functions(libs["default"])]
    assert names == sorted(names)


def test_corrupt_files_raise_symbol_error(libs: dict[str, Path], tmp_path: Path) -> None:
    good = libs["shifted"].read_bytes()
    rng = random.Random(1234)
    bad = tmp_path / "bad.so"
    cases = [good[:64], good[:200], good[: len(good) // 2], b"\x7fELF" + b"\0" * 60]
    for _ in range(150):
        data = bytearray(good)
        for _ in range(rng.randint(1, 8)):
            # Hit the ELF header, the section headers and the symbol tables.
            pos = rng.choice(
                [rng.randrange(0, 64), rng.randrange(len(data) - 1024, len(data))]
                + [rng.randrange(0x298, 0x400)]
            )
            data[pos] = rng.randrange(256)
        cases.append(bytes(data))
    for data in cases:
        bad.write_bytes(data)
        for name in ("demo_add", "demo_static"):
            try:
                off = resolve_symbol(bad, name)
            except SymbolError:
                continue
            assert 0 <= off < len(data)
        try:
            list_functions(bad)
        except SymbolError:
            pass


def test_index_is_parsed_once_per_file_identity(libs: dict[str, Path], tmp_path: Path) -> None:
    cache_clear()
    lib = tmp_path / "libcached.so"
    shutil.copy(libs["default"], lib)
    first = index_for(lib)
    fd = os.open(lib, os.O_RDONLY)
    try:
        # The same inode, as the broker sees it: from the cache, messages naming this path.
        again, hit = cached_index(f"/proc/self/fd/{fd}")
        assert hit and again.path == f"/proc/self/fd/{fd}" and again.names() == first.names()
        with pytest.raises(SymbolError, match=f"not found in /proc/self/fd/{fd} "):
            again.offset("demo_nothing")
    finally:
        os.close(fd)
    hits, misses, held = cache_info()
    assert (hits, misses, held) == (1, 1, 1)
    # Rewritten in place (same inode): size, mtime and ctime change, so it is parsed again.
    lib.write_bytes(libs["shifted"].read_bytes() + b"\0" * 16)
    again = index_for(lib)
    assert again is not first
    assert again.offset("demo_add") == resolve_symbol(libs["shifted"], "demo_add")
    # A copy is another file (another inode).
    other = tmp_path / "libother.so"
    shutil.copy(libs["default"], other)
    assert index_for(other) is not first


def test_index_cache_is_bounded(libs: dict[str, Path], tmp_path: Path) -> None:
    cache_clear()
    for i in range(CACHE_SIZE + 3):
        p = tmp_path / f"lib{i}.so"
        shutil.copy(libs["default"], p)
        index_for(p)
    assert cache_info()[2] == CACHE_SIZE


def test_many_symbols_match_readelf(tmp_path: Path) -> None:
    src = tmp_path / "many.c"
    src.write_text("\n".join(f"int f{i}(int x) {{ return x + {i}; }}" for i in range(3000)))
    lib = tmp_path / "libmany.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    expected = _readelf_offsets(lib)
    got = {f.name: f.offset for f in list_functions(lib)}
    assert {n: got[n] for n in expected} == expected
    assert sum(n.startswith("f") and n[1:].isdigit() for n in got) == 3000
