"""Which files are CPython interpreters the BPF walker can follow, and what it
needs to know of each: (dev, ino, runtime_off, version).

- version: the Py_Version symbol (PY_VERSION_HEX, 3.11+), else a PY_VERSION
  string ("3.9.18") in .rodata, else the file name (python3.X, libpython3.X).
- runtime_off: for an executable, st_value(_PyRuntime) minus the lowest
  p_vaddr of the PF_X PT_LOAD segments, since the kernel's mm->start_code is
  that p_vaddr plus the load bias (load_elf_binary). For a shared libpython,
  st_value(_PyRuntime) minus (p_vaddr - p_offset) of its PF_X PT_LOAD: the
  BPF program finds the mapping of an ip in that segment, and vm_start -
  vm_pgoff pages is where file offset 0 would sit.
- dev: st_dev in the kernel's encoding, (major << 20) | minor, what the BPF
  program reads from the inode's superblock.
- static: _PyRuntime is defined in this file: an executable with libpython
  linked in, or libpython3.X.so itself (a shared build; the executable of
  such a build has no _PyRuntime and is not walked itself).
- debug_offsets_ok (3.13+): the offsets CPython itself wrote into the
  binary's _Py_DebugOffsets agree with catalog/python/layouts.py.
- free_threaded (3.13+): they agree with the free-threaded build's table
  (configure --disable-gil, "python3.13t"), whose objects are laid out
  otherwise; the walker then gets that layout.

Symbols, segments and data are read with gfxbpf.elf (the project's ELF layer).
"""

from __future__ import annotations

import glob
import os
import re
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gfxbpf.catalog.python import debug_offsets as debug_table
from gfxbpf.catalog.python.layouts import LAYOUTS, PyLayout, layout_for
from gfxbpf.client.profiles.fileid import open_regular
from gfxbpf.elf.reader import SHN_UNDEF, ElfError, ElfFile

__all__ = [
    "PythonFile",
    "debug_offsets",
    "interpreter_paths",
    "kernel_dev",
    "libpython_of",
    "libpython_paths",
    "python_file",
]

_EM_X86_64 = 62
_PT_INTERP = 3
_PF_X = 1
# _Py_NegativeRefcount exists only in Py_REF_DEBUG (debug) builds, whose
# structs the release-build table does not describe.
_DEBUG_SYMBOL = "_Py_NegativeRefcount"
_SYMBOLS = ("_PyRuntime", "Py_Version", "Py_BytesMain", _DEBUG_SYMBOL)
_VERSION_STRING = re.compile(rb"(?<![\w.])3\.(\d{1,2})\.(\d{1,3})(?:(?:a|b|rc)\d+)?\+?\x00")
_NAME = re.compile(r"python(\d+)\.(\d+)")
_INTERPRETER_NAME = re.compile(r"python\d+\.\d+t?")  # python3.13t: free-threaded
_INTERPRETER_DIRS = ("usr/bin", "usr/local/bin")
_LIBRARY_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib", "usr/local/lib")
_LIBPYTHON = re.compile(r"/libpython(\d+)\.(\d+)[a-z]*\.so(?:\.[\d.]+)?$")


@dataclass(frozen=True)
class PythonFile:
    path: str
    version: tuple[int, ...]  # (major, minor, micro), or (major, minor) from the name
    how: str  # which clue gave the version: "Py_Version symbol", "PY_VERSION string", "file name"
    runtime_off: int | None  # None when _PyRuntime is not defined here
    dev: int  # st_dev in the kernel's encoding
    ino: int
    static: bool  # _PyRuntime defined in this file
    is_library: bool  # a shared object (no PT_INTERP): libpython3.X.so itself
    debug_offsets_ok: bool | None  # 3.13+: _Py_DebugOffsets agree with the table
    debug_build: bool = False  # a Py_DEBUG interpreter (python3.X-dbg): other layouts
    free_threaded: bool = False  # a Py_GIL_DISABLED build (by its _Py_DebugOffsets)

    @property
    def walkable(self) -> bool:
        """What the attach request may carry: a file with its own _PyRuntime
        (an executable or libpython), a release build of a version with a
        layout, that contradicts no check."""
        return (
            self.static
            and not self.debug_build
            and self.runtime_off is not None
            and layout_for(self.version, self.free_threaded) is not None
            and self.debug_offsets_ok is not False
        )


def kernel_dev(st_dev: int) -> int:
    """st_dev as the kernel's s_dev: (major << 20) | minor."""
    return (os.major(st_dev) << 20) | os.minor(st_dev)


def python_file(path: str, fd: int | None = None) -> PythonFile | None:
    """What the walker needs of the interpreter at path (or of the open file
    fd, which stays the caller's), None when it is not a CPython x86-64 ELF
    file with a known version."""
    own = fd is None
    try:
        if fd is None:
            fd, _ = open_regular(os.path.realpath(path))
        return _inspect(path, fd)
    except (OSError, ValueError, struct.error):
        return None
    finally:
        if own and fd is not None:
            os.close(fd)


def _inspect(path: str, fd: int) -> PythonFile | None:
    st = os.fstat(fd)
    elf = ElfFile(fd, path)
    if elf.machine != _EM_X86_64:
        return None
    syms = _symbols(elf, _SYMBOLS)
    if not syms:
        return None
    version, how = _version(elf, syms, path)
    if version is None:
        return None
    runtime = syms.get("_PyRuntime")
    static = runtime is not None and runtime[1] != SHN_UNDEF
    is_library = not any(p.type == _PT_INTERP for p in elf.segments)
    text = _text_base(elf, is_library)
    runtime_off = runtime[0] - text if static and runtime and text is not None else None
    debug_ok, free_threaded = _debug_match(elf, version, syms) if static else (None, False)
    return PythonFile(
        path=path,
        version=version,
        how=how,
        runtime_off=runtime_off,
        dev=kernel_dev(st.st_dev),
        ino=st.st_ino,
        static=static,
        is_library=is_library,
        debug_offsets_ok=debug_ok,
        debug_build=syms.get(_DEBUG_SYMBOL, (0, SHN_UNDEF))[1] != SHN_UNDEF,
        free_threaded=free_threaded,
    )


def _symbols(elf: ElfFile, names: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """{name: (st_value, st_shndx)}; a defined symbol wins over an import."""
    out: dict[str, tuple[int, int]] = {}
    for table_name in (".dynsym", ".symtab"):
        try:
            table = elf.symbol_table(table_name)
        except ElfError:
            continue
        if table is None:
            continue
        _, _, i_shndx, i_value, _ = table.fields
        for _, name, raw in table.named():
            if name in names and (name not in out or out[name][1] == SHN_UNDEF):
                out[name] = (raw[i_value], raw[i_shndx])
    return out


def _read_vaddr(elf: ElfFile, vaddr: int, size: int) -> bytes | None:
    """size bytes of initialized data at vaddr, None if not in the file."""
    for seg in elf.loads():
        if seg.vaddr <= vaddr and vaddr + size <= seg.vaddr + seg.filesz:
            return elf.read(seg.offset + vaddr - seg.vaddr, size, "data")
    return None


def _text_base(elf: ElfFile, is_library: bool) -> int | None:
    """What runtime_off is counted from (see the module docstring)."""
    loads = sorted((s for s in elf.loads() if s.flags & _PF_X), key=lambda s: s.vaddr)
    if not loads:
        return None
    return loads[0].vaddr - loads[0].offset if is_library else loads[0].vaddr


def _version(
    elf: ElfFile, syms: dict[str, tuple[int, int]], path: str
) -> tuple[tuple[int, ...] | None, str]:
    sym = syms.get("Py_Version")
    if sym is not None and sym[1] != SHN_UNDEF:
        raw = _read_vaddr(elf, sym[0], 4)
        if raw is not None:
            hexv = struct.unpack("<I", raw)[0]
            return (hexv >> 24, (hexv >> 16) & 0xFF, (hexv >> 8) & 0xFF), "Py_Version symbol"
    named = _name_version(path)
    found = _string_version(elf, named)
    if found is not None:
        return found, "PY_VERSION string"
    return named, "file name"


def _name_version(path: str) -> tuple[int, int] | None:
    m = _NAME.search(os.path.basename(path))
    return (int(m.group(1)), int(m.group(2))) if m else None


def _string_version(elf: ElfFile, named: tuple[int, int] | None) -> tuple[int, ...] | None:
    """The PY_VERSION string in .rodata: the one agreeing with the file name,
    else the only one of a release this project has a layout for (other
    libraries' version strings, "3.2.0", lie there too)."""
    sec = elf.section(".rodata")
    if sec is None or sec.size > 64 << 20:
        return None
    found = {(3, int(m.group(1)), int(m.group(2))) for m in _VERSION_STRING.finditer(elf.data(sec))}
    if named is not None:
        agree = [v for v in found if v[:2] == named]
        return agree[0] if len(agree) == 1 else None
    known = [v for v in found if (v[0], v[1]) in LAYOUTS]
    return known[0] if len(known) == 1 else None


def debug_offsets(elf_path: str) -> dict[str, int] | None:
    """The _Py_DebugOffsets a 3.13+ binary (or libpython) carries at the start
    of _PyRuntime, as {PyLayout field name: offset, "version": PY_VERSION_HEX};
    None when the file has no such struct or its release is not tabled."""
    try:
        fd, _ = open_regular(os.path.realpath(elf_path))
    except OSError:
        return None
    try:
        elf = ElfFile(fd, elf_path)
        runtime = _symbols(elf, ("_PyRuntime",)).get("_PyRuntime")
        if runtime is None or runtime[1] == SHN_UNDEF:
            return None
        return _read_debug(elf, runtime[0])
    except (OSError, ValueError, struct.error):
        return None
    finally:
        os.close(fd)


def _read_debug(elf: ElfFile, runtime: int) -> dict[str, int] | None:
    head = _read_vaddr(elf, runtime, 16)
    if head is None or head[:8] != debug_table.COOKIE:
        return None
    hexv = struct.unpack_from("<Q", head, 8)[0]
    fields = debug_table.FIELDS.get((hexv >> 24, (hexv >> 16) & 0xFF))
    if fields is None:
        return None
    raw = _read_vaddr(elf, runtime, max(fields.values()) + 8)
    if raw is None:
        return None
    return {name: struct.unpack_from("<Q", raw, pos)[0] for name, pos in fields.items()}


def _debug_match(
    elf: ElfFile, version: tuple[int, ...], syms: dict[str, tuple[int, int]]
) -> tuple[bool | None, bool]:
    """(the binary's _Py_DebugOffsets agree with a layout, None: not 3.13+
    or no layout; that layout is the free-threaded build's)."""
    layouts = [x for x in (layout_for(version), layout_for(version, True)) if x is not None]
    if not layouts or max(x.version for x in layouts) < (3, 13):
        return None, False
    found = _read_debug(elf, syms["_PyRuntime"][0])
    if found is None:
        return False, False  # a 3.13+ _PyRuntime without the struct: not what the table describes
    for layout in layouts:
        if _agrees(layout, found):
            return True, layout.free_threaded
    return False, False


def _agrees(layout: PyLayout, found: dict[str, int]) -> bool:
    return all(getattr(layout, k) == v for k, v in found.items() if k != "version")


def libpython_of(paths: Iterable[str]) -> tuple[str, tuple[int, int]] | None:
    """(path, version) of the libpython3.X.so among a process's mapped files
    (e.g. m.file_path for each procmaps.Mapping), None if it maps none."""
    for p in paths:
        m = _LIBPYTHON.search(p)
        if m:
            return p, (int(m.group(1)), int(m.group(2)))
    return None


def libpython_paths(root: str = "/", folders: tuple[str, ...] = _LIBRARY_DIRS) -> list[str]:
    """The libpython3.X.so files in the usual library folders under root (a
    shared build's runtime), real files only, each once, by their real path."""

    def named(path: str, real: str) -> bool:  # libpython3.12.so -> libpython3.12.so.1.0
        return _LIBPYTHON.search("/" + os.path.basename(real)) is not None

    return [real for _, real in _files_under(root, folders, "libpython3.*.so*", named)]


def interpreter_paths(root: str = "/") -> list[str]:
    """The python3.X executables in /usr/bin and /usr/local/bin under root (a
    container's /proc/PID/root, say), real files only, each once."""

    def named(path: str, real: str) -> bool:  # python3.11, not python3.11-config
        return _INTERPRETER_NAME.fullmatch(os.path.basename(path)) is not None

    return [path for path, _ in _files_under(root, _INTERPRETER_DIRS, "python3.*", named)]


def _files_under(
    root: str, folders: tuple[str, ...], pattern: str, named: Callable[[str, str], bool]
) -> list[tuple[str, str]]:
    """(path, real path) of the regular files matching pattern in folders
    under root that named() accepts, each real file once."""
    seen: set[str] = set()
    out: list[tuple[str, str]] = []
    for folder in folders:
        for path in sorted(glob.glob(os.path.join(root, folder, pattern))):
            real = os.path.realpath(path)
            if named(path, real) and real not in seen and os.path.isfile(real):
                seen.add(real)
                out.append((path, real))
    return out
