"""Which CPython executables a profile asks the kernel to walk, and what it
tells the user about the Python processes it could not read.

The walker decides per file (catalog/programs/gfx_python.h): the targets'
own executables (/proc/PID/exe, which is the file even inside a container
or chroot), COMMAND's, and the system's python3.X, so that a Python a
target starts later is walked too; likewise the libpython3.X.so of shared
builds: the one a target maps, the one beside COMMAND (../lib, as pyenv and
conda lay them out) and the system's.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gfxbpf.client.profiles import procmaps
from gfxbpf.client.profiles.python.discover import (
    PythonFile,
    interpreter_paths,
    libpython_of,
    libpython_paths,
    python_file,
)

MAX_FILES = 16  # what the broker takes (gfx_python.h GFX_PY_FILES)
_PYTHON_NAME = re.compile(r"python\d\.\d+$")


@dataclass
class Interpreters:
    files: dict[tuple[int, int], PythonFile] = field(default_factory=dict)  # (dev, ino) ->
    unreadable: dict[str, str] = field(default_factory=dict)  # path -> why not walked

    def add(self, path: str, fd: int | None = None) -> PythonFile | None:
        """Inspect one file; a walkable one is kept (16 at most)."""
        f = python_file(path, fd)
        if f is None:
            return None
        if f.walkable:
            if len(self.files) < MAX_FILES:
                self.files.setdefault((f.dev, f.ino), f)
        else:
            self.unreadable.setdefault(path, why_not(f))
        return f


def version_name(f: PythonFile, parts: int = 3) -> str:
    """ "3.15.2", or "3.13.5t" for a free-threaded build."""
    return ".".join(map(str, f.version[:parts])) + ("t" if f.free_threaded else "")


def why_not(f: PythonFile) -> str:
    v = version_name(f, 2)
    if f.debug_build:
        return f"Python {v} is a debug build (other structure layouts)"
    if not f.static:
        return f"Python {v} keeps its runtime in libpython (a shared build)"
    if f.debug_offsets_ok is False:
        return f"Python {v}'s own _Py_DebugOffsets disagree with this gfxclient's layout"
    return f"Python {v} has no layout in this gfxclient"


def find(pids: Iterable[int], command: list[str] | None) -> Interpreters:
    """The interpreters of the targets, COMMAND and the system (and those of
    a target's root: a container's or chroot's python3.X its children run)."""
    found = Interpreters()
    roots = ["/"]
    for pid in pids:
        _add_exe(found, pid)
        _add_mapped_libpython(found, pid)
        roots.append(f"/proc/{pid}/root")
    if command:
        path = shutil.which(command[0])
        if path:
            real = os.path.realpath(path)
            found.add(real)
            lib_dir = os.path.join(os.path.dirname(os.path.dirname(real)), "lib")
            for lib in libpython_paths(lib_dir, folders=("",)):
                found.add(lib)
    for root in _distinct(roots):
        for path in interpreter_paths(root) + libpython_paths(root):
            found.add(path)
    return found


def _add_mapped_libpython(found: Interpreters, pid: int) -> None:
    """The libpython a running shared build maps, seen from its own root."""
    lib = libpython_of(procmaps.mapped_files(pid))
    if lib is not None:
        found.add(f"/proc/{pid}/root{lib[0]}")


def _distinct(roots: list[str]) -> list[str]:
    """The roots that are different directories (most targets share "/")."""
    seen: set[tuple[int, int]] = set()
    out = []
    for root in roots:
        try:
            st = os.stat(root)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            out.append(root)
    return out


def _add_exe(found: Interpreters, pid: int) -> None:
    try:
        fd = os.open(f"/proc/{pid}/exe", os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return
    try:
        found.add(os.readlink(f"/proc/{pid}/exe"), fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def process_note(pid: int, comm: str, mapped: Iterable[str], exe: str | None) -> str | None:
    """Why a profiled process that looks like Python had no Python frame walked
    (None: it does not look like Python)."""
    lib = libpython_of(mapped)
    who = f"process {pid} ({comm})"
    if lib is not None:
        v = ".".join(map(str, lib[1]))
        f = python_file(f"/proc/{pid}/root{lib[0]}")
        if f is not None and not f.walkable:
            return f"{who} runs Python {v} from {os.path.basename(lib[0])}: {why_not(f)}"
        return (
            f"{who} runs Python {v} from {os.path.basename(lib[0])} (a shared build): no "
            "sample of it ran inside libpython, where the walker finds its runtime; only "
            "native frames are shown"
        )
    if exe and _PYTHON_NAME.search(exe):
        f = python_file(exe)
        if f is not None and not f.walkable:
            return f"{who}: {why_not(f)}; only native frames are shown"
    return None


def report(
    found: Interpreters | None,
    walked: dict[int, tuple[int, int]],
    profiled: dict[int, tuple[str, list[str]]],
) -> tuple[dict[str, Any], list[str]]:
    """The summary's "python" section and the notes: walked is tgid -> version
    of the processes whose Python frames came, profiled pid -> (command, the
    files it maps) of every process in the profile."""
    interpreters = [
        {"path": f.path, "version": version_name(f)}
        for f in (found.files.values() if found else ())
    ]
    notes = []
    for pid, (comm, mapped) in sorted(profiled.items()):
        if pid in walked:
            continue
        try:
            exe: str | None = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            exe = None
        note = process_note(pid, comm, mapped, exe)
        if note:
            notes.append(note)
    section = {
        "interpreters": interpreters,
        "processes_walked": {str(p): ".".join(map(str, v)) for p, v in sorted(walked.items())},
        "not_walked": dict(found.unreadable) if found else {},
    }
    return section, notes
