"""The symbol table and its cache file."""

from __future__ import annotations

import os
import shutil
import subprocess

from gfxbpf.bpf.symbols import list_functions
from gfxbpf.client.profiles import diskcache, symtab
from gfxbpf.client.profiles.elfsyms import function_ranges
from gfxbpf.client.profiles.symtab import SymbolTable
from tests.conftest import skip_or_fail

SEGMENTS = ((0, 0, 0x800), (0x1000, 0x401000, 0x2000))
FUNCS = [
    (0x401000, 0x100, "outer"),
    (0x401040, 0x10, "nested_label"),
    (0x401200, 0, "asm_no_size"),
    (0x401300, 0x20, "after"),
]


def test_lookup() -> None:
    t = SymbolTable.build(SEGMENTS, FUNCS)
    assert t.vaddr(0x1010) == 0x401010 and t.vaddr(0x900) is None
    assert t.lookup(0x401000) == "outer"
    assert t.lookup(0x401045) == "nested_label"
    assert t.lookup(0x401080) == "outer", "past the nested symbol, still in outer"
    assert t.lookup(0x401150) is None, "a gap between functions"
    assert t.lookup(0x4012F0) == "asm_no_size", "size 0 reaches the next symbol"
    assert t.lookup(0x401310) == "after" and t.lookup(0x401320) is None
    assert t.lookup(0x400000) is None


def test_cache_round_trip(tmp_path) -> None:
    t = SymbolTable.build(SEGMENTS, FUNCS + [(0x401400, 4, "línea\nrota")])
    symtab.store(str(tmp_path), "abc", t)
    back = symtab.load(str(tmp_path), "abc")
    assert back is not None
    assert back.segments == SEGMENTS
    assert list(back.starts) == list(t.starts) and list(back.sizes) == list(t.sizes)
    assert back == t and back.lookup(0x401401) == "línea rota"
    assert symtab.load(str(tmp_path), "missing") is None
    (tmp_path / "bad").write_bytes(symtab._MAGIC + b"\xff" * 20)
    (tmp_path / "old").write_bytes(b"GFXSYM1\n" + t.encode()[8:])
    assert symtab.load(str(tmp_path), "old") is None, "a table of the format before is parsed again"
    (tmp_path / "v2").write_bytes(b"GFXSYM2\n" + t.encode()[8:])
    assert symtab.load(str(tmp_path), "v2") is None, "v2 kept no name ends: parsed again"
    (tmp_path / "cut").write_bytes(t.encode()[:-3])
    assert symtab.load(str(tmp_path), "cut") is None, "names shorter than their ends: a miss"
    assert symtab.load(str(tmp_path), "bad") is None, "a corrupt file is a miss, not a crash"


def test_a_loaded_table_keeps_its_names_in_the_files_bytes(tmp_path) -> None:
    """libtorch_cpu.so's 380,000 names as a list of str took 214 MB to load;
    they stay in the cache file's bytes and are decoded as looked up."""
    t = SymbolTable.build(SEGMENTS, FUNCS)
    symtab.store(str(tmp_path), "k", t)
    back = symtab.load(str(tmp_path), "k")
    assert back is not None and back == t
    assert back.blob is not None and back.base > 0 and back.blob.startswith(symtab._MAGIC)
    assert [back.lookup(a) for a in (0x401000, 0x401045, 0x4012F0, 0x401310)] == [
        "outer",
        "nested_label",
        "asm_no_size",
        "after",
    ]


def test_unwritable_cache_is_only_a_miss(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    symtab.store(str(blocker / "sub"), "k", SymbolTable.build(SEGMENTS, FUNCS))
    assert symtab.load(str(blocker / "sub"), "k") is None


def test_function_ranges_keeps_same_named_statics(tmp_path) -> None:
    """Two files' static helper() are two functions (bpf.symbols.list_functions,
    made for uprobes by name, keeps one)."""
    if shutil.which("gcc") is None:
        skip_or_fail("gcc is missing")
    (tmp_path / "a.c").write_text(
        "static int helper(int x) { return x + 1; }\nint a(int x) { return helper(x); }\n"
    )
    (tmp_path / "b.c").write_text(
        "static int helper(int x) { return x * 3; }\nint b(int x) { return helper(x); }\n"
    )
    lib = tmp_path / "libab.so"
    subprocess.run(
        ["gcc", "-O0", "-shared", "-fPIC", "-o", lib, tmp_path / "a.c", tmp_path / "b.c"],
        check=True,
    )
    ranges = function_ranges(lib)
    assert ranges == sorted(ranges)
    helpers = [r for r in ranges if r[2] == "helper"]
    assert len(helpers) == 2 and helpers[0][0] != helpers[1][0]
    assert all(size > 0 for _, size, _ in helpers)
    assert sum(f.name == "helper" for f in list_functions(lib)) == 1


def test_prune_drops_the_least_recently_used(tmp_path) -> None:
    t = SymbolTable.build(SEGMENTS, FUNCS)
    for i, key in enumerate(("old", "mid", "new")):
        symtab.store(str(tmp_path), key, t)
        os.utime(tmp_path / key, ns=(i * 10**9, i * 10**9))
    assert symtab.load(str(tmp_path), "old") is not None  # used now: newest
    size = (tmp_path / "old").stat().st_size
    diskcache.prune(str(tmp_path), limit=2 * size)
    assert sorted(os.listdir(tmp_path)) == ["new", "old"]
