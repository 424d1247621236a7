"""The client's ELF header and symbol reading: agrees with binutils on real
files, and corrupt files are a clean "no" (None / []) and never an exception."""

from __future__ import annotations

import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gfxbpf.client.profiles.elfinfo import read_info
from gfxbpf.client.profiles.elfsyms import function_ranges
from tests.conftest import skip_or_fail

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


@pytest.fixture(scope="module")
def prog(tmp_path_factory) -> Path:
    if shutil.which("gcc") is None or shutil.which("readelf") is None:
        skip_or_fail("gcc and readelf are needed (apt-get install gcc binutils)")
    d = tmp_path_factory.mktemp("elf")
    (d / "p.c").write_text(
        "static int helper(int x) { return x * 2; }\nint main(int c, char **v) "
        "{ return helper(c); }\n"
    )
    subprocess.run(["gcc", "-O0", "-o", d / "p", d / "p.c"], check=True)
    return d / "p"


def _readelf(*args: str) -> str:
    return subprocess.run(["readelf", *args], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("path", ["prog", LIBC])
def test_agrees_with_readelf(path: str, prog: Path) -> None:
    target = str(prog) if path == "prog" else path
    info = read_info(target)
    assert info is not None
    m = re.search(r"Build ID: ([0-9a-f]+)", _readelf("-n", target))
    assert m and info.build_id == m.group(1)
    loads = [
        (int(o, 16), int(v, 16), int(f, 16))
        for o, v, f in re.findall(
            r"LOAD\s+0x([0-9a-f]+) 0x([0-9a-f]+) 0x[0-9a-f]+\s+0x([0-9a-f]+)",
            _readelf("-lW", target),
        )
    ]
    assert list(info.segments) == loads
    ours = {(a, n) for a, _, n in function_ranges(target)}
    theirs = set()
    for line in _readelf("-sW", target).splitlines():
        f = line.split()
        if len(f) >= 8 and f[3] in ("FUNC", "IFUNC") and f[6] != "UND":
            theirs.add((int(f[1], 16), f[7].split("@")[0]))
    assert ours == theirs


def test_versioned_symbols_are_named_as_their_function(tmp_path: Path) -> None:
    """A .symtab holds a symbol's versions as names of their own (glibc's debug
    file: "clock_gettime@GLIBC_2.2.5" beside "clock_gettime@@GLIBC_2.17"): the
    profile names the function, whichever alias sorts last."""
    if shutil.which("gcc") is None:
        skip_or_fail("gcc is needed (apt-get install gcc)")
    (tmp_path / "v.c").write_text(
        "int f_old(void) { return 1; }\nint f_new(void) { return 2; }\n"
        '__asm__(".symver f_old, f@VER_1");\n__asm__(".symver f_new, f@@VER_2");\n'
    )
    (tmp_path / "v.map").write_text("VER_1 { local: *; };\nVER_2 { global: f; } VER_1;\n")
    lib = tmp_path / "libv.so"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-Wl,--version-script", tmp_path / "v.map",
         "-o", lib, tmp_path / "v.c"],
        check=True,
    )  # fmt: skip
    assert "f@VER_1" in _readelf("-sW", str(lib)), "the .symtab holds the versioned name"
    names = {n for _, _, n in function_ranges(str(lib))}
    assert not any("@" in n for n in names), names
    assert {"f", "f_old", "f_new"} <= names


def test_corrupt_files_are_refused_quietly(prog: Path, tmp_path: Path) -> None:
    data = prog.read_bytes()
    rng = random.Random(7)
    bad = tmp_path / "bad"
    for i in range(300):
        mutated = bytearray(data)
        if i % 3 == 0:
            mutated = mutated[: rng.randrange(1, len(data))]
        else:
            for _ in range(8):  # the headers and tables are near the start and the end
                at = rng.choice([rng.randrange(0, 256), rng.randrange(len(data) - 4096, len(data))])
                mutated[at] = rng.randrange(256)
        bad.write_bytes(bytes(mutated))
        info = read_info(str(bad))
        assert info is None or isinstance(info.segments, tuple)
        assert isinstance(function_ranges(str(bad)), list)
    bad.write_bytes(b"\x7fELF")
    assert read_info(str(bad)) is None and function_ranges(str(bad)) == []
    assert read_info(str(tmp_path / "missing")) is None
