"""The layout table against real interpreters: a child CPython blocks in a
known call chain, and the reference walk (tests/python_walk.py) reads its
memory through /proc/PID/mem, starting from start_code + runtime_off exactly
as the BPF walker does, and must name every frame, file and line.

This proves, for each interpreter it runs, that discover.py's runtime_off,
the thread list, the frame chain, the code object, str and bytes offsets of
that release's table are right on a real process, and that the line mapping
gives the lines of the source. It does not run BPF; and a walk of a blocked
process cannot show what a sample taken mid-instruction sees.

The host's /usr/bin/python3 always runs. pyenv's interpreters, where this
machine has them (shared builds: the runtime is found in libpython3.X.so,
from the mapping of its code, as the BPF walker finds it), and
GFXBPF_PYTHON_ROOTS (colon-separated chroot folders, e.g. debootstrapped
Debian 13 and sid: 3.13, 3.14) add the interpreters found there; chroots need
root.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import textwrap

import pytest

from gfxbpf.catalog.python.layouts import PyLayout, layout_for
from gfxbpf.client.profiles.procmaps import parse_maps
from gfxbpf.client.profiles.python.discover import PythonFile, libpython_of, python_file
from tests.python_walk import PyFrame, walk

CHILD = textwrap.dedent(
    """\
    import os, sys, threading
    def level3():
        sys.stdout.write(str(threading.get_ident()) + "\\n"); sys.stdout.flush(); os.read(0, 1)
    def level2():
        return level3()
    class Outer:
        def level1(self):
            level2()
    Outer().level1()
    """
)
# (name as 3.11+ reports it (qualname), as 3.9/3.10 do, line) leaf first.
EXPECTED = [
    ("level3", "level3", 3),
    ("level2", "level2", 5),
    ("Outer.level1", "level1", 8),
    ("<module>", "<module>", 9),
]


def _interpreters() -> list[tuple[str, str]]:
    """(root, path inside root) of every interpreter to walk."""
    out = [("/", os.path.realpath("/usr/bin/python3"))]
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    for path in sorted(glob.glob(os.path.join(pyenv, "versions/3.*/bin/python3.[0-9]*"))):
        v = _name_version(path)
        if v is not None and layout_for(v) is not None:
            out.append(("/", path))
    for root in filter(None, os.environ.get("GFXBPF_PYTHON_ROOTS", "").split(":")):
        for path in sorted(glob.glob(os.path.join(root, "usr/bin/python3.[0-9]*"))):
            if _name_version(path) is not None:
                out.append((root, "/" + os.path.relpath(path, root)))
    return out


def _name_version(path: str) -> tuple[int, int] | None:
    m = re.fullmatch(r"python(\d+)\.(\d+)", os.path.basename(path))
    return (int(m.group(1)), int(m.group(2))) if m else None


def _start_code(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[23])  # field 26, counted after the comm's ")"


def _run_child(root: str, exe: str, script: str) -> subprocess.Popen[str]:
    argv = [exe, script] if root == "/" else ["chroot", root, exe, script]
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )


@pytest.mark.parametrize("root,exe", _interpreters())
def test_reference_walk_of_a_live_interpreter(root: str, exe: str, tmp_path_factory) -> None:
    if root != "/" and os.geteuid() != 0:
        pytest.fail("GFXBPF_PYTHON_ROOTS needs root (chroot)")
    pf = python_file(os.path.join(root, exe.lstrip("/")))
    assert pf is not None
    folder = None if root != "/" else str(tmp_path_factory.mktemp("pywalk", numbered=True))
    script = _place_script(root, folder)
    child = _run_child(root, exe, script)
    try:
        assert child.stdout is not None
        tid = int(child.stdout.readline())
        runtime, version, runtime_off = _runtime_of(child.pid, pf)
        lay = layout_for(version)
        assert lay is not None
        found = _walk_child(child.pid, lay, runtime)
    finally:
        if child.stdin:
            child.stdin.write("x")
            child.stdin.close()
        child.wait(timeout=30)
    _check(found, tid, lay.version, script)


def _runtime_of(pid: int, pf: PythonFile) -> tuple[int, tuple[int, int], int]:
    """(_PyRuntime's address, version, runtime_off), as the BPF computes it:
    from start_code for a static interpreter; for a shared build, from the
    mapping of libpython's code (vm_start - vm_pgoff pages, the file's
    offset 0, plus that library's runtime_off)."""
    if pf.walkable:
        assert pf.runtime_off is not None
        return _start_code(pid) + pf.runtime_off, (pf.version[0], pf.version[1]), pf.runtime_off
    assert not pf.static, "only shared builds are not walked"
    with open(f"/proc/{pid}/maps") as f:
        maps = parse_maps(f.read())
    lib = libpython_of(m.file_path for m in maps)
    assert lib is not None, "a python without _PyRuntime maps libpython3.X.so"
    lpf = python_file(lib[0])
    assert lpf is not None and lpf.is_library and lpf.runtime_off is not None
    assert (lpf.version[0], lpf.version[1]) == lib[1]
    text = min((m for m in maps if m.file_path == lib[0] and m.executable), key=lambda m: m.start)
    return text.start - text.offset + lpf.runtime_off, lib[1], lpf.runtime_off


def _place_script(root: str, folder: str | None) -> str:
    """Write the child's script where the child sees it; its path inside."""
    if folder is None:
        folder = os.path.join(root, "tmp")
        inside = f"/tmp/gfxbpf_pywalk_{os.getpid()}.py"
    else:
        inside = os.path.join(folder, "child.py")
    with open(os.path.join(root, inside.lstrip("/")), "w") as f:
        f.write(CHILD)
    return inside


def _walk_child(pid: int, lay: PyLayout, runtime: int) -> dict[int, list[PyFrame]]:
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        return walk(lay, lambda addr, size: os.pread(fd, size, addr), runtime)
    finally:
        os.close(fd)


def _check(found: dict[int, list[PyFrame]], tid: int, version: tuple[int, int], script: str):
    assert list(found) == [tid], "one thread, identified by pthread_self()"
    stack = found[tid]
    modern = version >= (3, 11)
    assert [(f.name, f.line) for f in stack] == [
        (q if modern else n, line) for q, n, line in EXPECTED
    ]
    assert {f.filename for f in stack} == {script}
    # Entry frames: 3.9/3.10 one per frame; 3.11+ only the module's (run from C).
    assert [f.entry for f in stack] == ([False] * 3 + [True] if modern else [True] * 4)
