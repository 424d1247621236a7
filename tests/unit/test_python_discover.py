"""discover.py on the host's real interpreter and on small ELF programs built
here with gcc that play each case: a PY_VERSION string beside another
library's version string, only a file name, no interpreter at all. The
runtime_off of each is checked against the address the running program
itself reports, from its own start_code, as the BPF walker computes it."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path

from gfxbpf.client.profiles.procmaps import parse_maps
from gfxbpf.client.profiles.python.discover import (
    interpreter_paths,
    kernel_dev,
    libpython_of,
    libpython_paths,
    python_file,
)
from tests.conftest import skip_or_fail
from tests.shared_python import build_shared_python

REPORT = (
    "with open('/proc/self/stat') as f: start = int(f.read().rsplit(')', 1)[1].split()[23])\n"
    "import ctypes, sys\n"
    "addr = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, '_PyRuntime'))\n"
    "print(start, addr, *sys.version_info[:3])\n"
)

PROGRAM = r"""
#include <stdio.h>
#include <string.h>
%(strings)s
%(runtime)s
int main(int argc, char **argv) {
    FILE *f = fopen("/proc/self/stat", "r");
    char buf[1024]; size_t n = fread(buf, 1, sizeof buf - 1, f); buf[n] = 0;
    char *p = strrchr(buf, ')') + 2; unsigned long start = 0;
    for (int i = 0; i < 23; i++) p = strchr(p, ' ') + 1;
    sscanf(p, "%%lu", &start);
    printf("%%lu %%lu\n", start, (unsigned long)%(addr)s);
    return argc > 5 ? (int)strlen(%(use)s) : 0;
}
"""


def _build(tmp: Path, name: str, strings: list[str], runtime: bool = True) -> Path:
    decl = "\n".join(f'const char version_{i}[] = "{s}";' for i, s in enumerate(strings))
    src = PROGRAM % {
        "strings": decl,
        "runtime": "char _PyRuntime[4096] = {1};" if runtime else "",
        "addr": "_PyRuntime" if runtime else "0",
        "use": " + ".join(f"(long)strlen(version_{i})" for i in range(len(strings))) or '""',
    }
    (tmp / "prog.c").write_text(src.replace("(int)strlen(", "(int)(").replace('(""', "(0"))
    out = tmp / name
    subprocess.run(["gcc", "-O0", "-o", out, tmp / "prog.c"], check=True)
    return out


def _run(argv: list[str]) -> list[int]:
    return [int(x) for x in subprocess.run(argv, check=True, capture_output=True).stdout.split()]


def test_the_host_interpreter() -> None:
    pf = python_file("/usr/bin/python3")
    start, addr, *version = _run(["/usr/bin/python3", "-c", REPORT])
    assert pf is not None and pf.walkable
    assert pf.version == tuple(version)
    assert pf.how == "Py_Version symbol"  # 3.11+
    assert (pf.static, pf.is_library) == (True, False)
    assert pf.runtime_off is not None and start + pf.runtime_off == addr
    st = os.stat("/usr/bin/python3")
    assert (pf.ino, pf.dev) == (st.st_ino, os.major(st.st_dev) << 20 | os.minor(st.st_dev))
    assert pf.debug_offsets_ok is (True if pf.version >= (3, 13) else None)


def test_the_kernel_encoding_of_a_device() -> None:
    assert kernel_dev(os.makedev(8, 1)) == 8 << 20 | 1
    assert kernel_dev(os.makedev(259, 70000)) == 259 << 20 | 70000
    with open("/proc/self/maps") as f:
        maps = parse_maps(f.read())
    exe = next(m for m in maps if m.file_path == os.path.realpath("/proc/self/exe"))
    major, minor = (int(x, 16) for x in exe.dev.split(":"))
    assert kernel_dev(os.stat(exe.file_path).st_dev) == major << 20 | minor


def test_a_version_string_next_to_another_librarys(tmp_path: Path) -> None:
    exe = _build(tmp_path, "pyrunner", ["3.10.13", "3.2.0"])
    pf = python_file(str(exe))
    assert pf is not None
    assert (pf.version, pf.how, pf.static, pf.walkable) == (
        (3, 10, 13),
        "PY_VERSION string",
        True,
        True,
    )
    start, addr = _run([str(exe)])
    assert pf.runtime_off is not None and start + pf.runtime_off == addr


def test_the_file_name_decides_between_version_strings(tmp_path: Path) -> None:
    exe = _build(tmp_path, "python3.12", ["3.12.7", "3.10.2"])
    pf = python_file(str(exe))
    assert pf is not None and (pf.version, pf.how) == ((3, 12, 7), "PY_VERSION string")
    # Two known releases and no name to choose: no guess.
    assert python_file(str(_build(tmp_path, "runner", ["3.12.7", "3.10.2"]))) is None


def test_a_debug_build_is_not_walked(tmp_path: Path) -> None:
    # Debian's python3.11d defines _Py_NegativeRefcount (Py_REF_DEBUG); release builds do not.
    src = tmp_path / "neg.c"
    src.write_text(
        "char _PyRuntime[64] = {1}; void _Py_NegativeRefcount(void) {}\n"
        'const char v[] = "3.11.9"; int main(void) { return v[0] == 0; }\n'
    )
    exe = tmp_path / "python3.11d"
    subprocess.run(["gcc", "-O0", "-o", exe, src], check=True)
    pf = python_file(str(exe))
    assert pf is not None and pf.debug_build and pf.version == (3, 11, 9)
    assert not pf.walkable
    assert not python_file("/usr/bin/python3").debug_build  # type: ignore[union-attr]


def test_only_the_file_name(tmp_path: Path) -> None:
    pf = python_file(str(_build(tmp_path, "python3.9", [])))
    assert pf is not None and (pf.version, pf.how, pf.walkable) == ((3, 9), "file name", True)


def test_not_an_interpreter(tmp_path: Path) -> None:
    assert python_file(str(_build(tmp_path, "python3.11", ["3.11.4"], runtime=False))) is None
    assert python_file("/bin/true") is None
    assert python_file(str(tmp_path / "missing")) is None
    (tmp_path / "text").write_text("3.11.4\n")
    assert python_file(str(tmp_path / "text")) is None


def test_a_process_running_libpython() -> None:
    maps = parse_maps(
        "7f0000000000-7f0000100000 r-xp 00000000 fd:01 12 /usr/lib/libpython3.12.so.1.0\n"
        "7f0000200000-7f0000300000 r-xp 00000000 fd:01 13 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
    )
    assert libpython_of(m.file_path for m in maps) == ("/usr/lib/libpython3.12.so.1.0", (3, 12))
    assert libpython_of(["/usr/bin/python3.11", "/usr/lib/libc.so.6"]) is None
    assert libpython_of(["/opt/py/lib/libpython3.13t.so"]) == (
        "/opt/py/lib/libpython3.13t.so",
        (3, 13),
    )


def test_an_open_file_descriptor_is_read_in_place() -> None:
    fd = os.open("/usr/bin/python3", os.O_RDONLY)
    try:
        by_fd = python_file("/proc/4242/exe", fd=fd)
        os.fstat(fd)  # still open: it is the caller's
    finally:
        os.close(fd)
    assert by_fd is not None and by_fd.path == "/proc/4242/exe"
    assert replace(by_fd, path="/usr/bin/python3") == python_file("/usr/bin/python3")


def test_interpreter_paths_under_a_root(tmp_path: Path) -> None:
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/local/bin").mkdir(parents=True)
    for name in ("python3.12", "python3.12-config", "python3.12d-config", "python3"):
        (tmp_path / "usr/bin" / name).write_text("")
    (tmp_path / "usr/local/bin/python3.14").write_text("")
    (tmp_path / "usr/local/bin/python3.13t").write_text("")  # free-threaded
    (tmp_path / "usr/local/bin/python3.13").symlink_to(tmp_path / "usr/bin/python3.12")
    assert interpreter_paths(str(tmp_path)) == [
        str(tmp_path / "usr/bin/python3.12"),
        str(tmp_path / "usr/local/bin/python3.13t"),
        str(tmp_path / "usr/local/bin/python3.14"),
    ]
    host = os.path.realpath("/usr/bin/python3")
    assert host in [os.path.realpath(p) for p in interpreter_paths()]


def test_a_shared_builds_libpython(tmp_path: Path) -> None:
    # The runtime address the walker computes from the mapping of an ip in
    # libpython's text (vm_start - vm_pgoff pages + runtime_off) is the one
    # the interpreter itself reports.
    prog = build_shared_python(tmp_path)
    if prog is None:
        skip_or_fail("gcc or /usr/bin/python3-config (python3-dev) is missing")
        return
    script = REPORT + "print(open('/proc/self/maps').read())\n"
    out = subprocess.run([str(prog), "-c", script], check=True, capture_output=True, text=True)
    head, _, maps_text = out.stdout.partition("\n")
    _, addr, *version = (int(x) for x in head.split())
    text = [
        m
        for m in parse_maps(maps_text)
        if os.path.basename(m.file_path).startswith("libpython") and "x" in m.perms
    ]
    assert len(text) == 1, maps_text
    lib = python_file(text[0].file_path)
    assert lib is not None and lib.walkable and lib.is_library and lib.static
    assert lib.version == tuple(version)
    assert lib.runtime_off is not None
    assert text[0].start - text[0].offset + lib.runtime_off == addr
    exe = python_file(str(prog))
    assert exe is None or not exe.walkable  # the executable of a shared build has no runtime


def test_libpython_paths_under_a_root(tmp_path: Path) -> None:
    lib = tmp_path / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libpython3.12.so.1.0").write_bytes(b"\x7fELF")
    (lib / "libpython3.12.so").symlink_to("libpython3.12.so.1.0")
    (lib / "libpython3.12.a").write_bytes(b"!<arch>")
    (lib / "libpythonista.so").write_bytes(b"")
    assert libpython_paths(str(tmp_path)) == [str(lib / "libpython3.12.so.1.0")]
