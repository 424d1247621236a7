"""The Python frame walker's data (catalog/programs/gfx_python.h): every
known layout into `py_layouts`, the interpreter files of a request into
`py_files`. Written after load, before attach; the maps stay broker-only."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from gfxbpf.bpf.errors import InputError
from gfxbpf.bpf.loader import LoadedObject
from gfxbpf.catalog.python.layouts import all_layouts

LAYOUTS_MAP = "py_layouts"
FILES_MAP = "py_files"
MAX_FILES = 16  # gfx_python.h GFX_PY_FILES
DEFAULT_FRAMES = 64  # gfx_python.h python_frames
MAX_FRAMES = 128  # gfx_python.h GFX_PY_MAX_FRAMES

_FILE_KEY = struct.Struct("<QQ")  # struct py_file_key: dev, ino
_FILE_VAL = struct.Struct("<QII")  # struct py_file_val: runtime_off, layout, flags
LIB_FLAG = 1  # gfx_python.h GFX_PYFILE_LIB


class PythonFileError(ValueError, InputError):
    """A Python file the walker cannot take (too many, unknown version)."""


@dataclass(frozen=True)
class PythonFile:
    """A CPython executable with libpython linked in, or a shared libpython,
    as the kernel names it."""

    dev: int  # kernel st_dev encoding: major << 20 | minor
    ino: int
    # executable: _PyRuntime minus the lowest executable PT_LOAD p_vaddr;
    # library: _PyRuntime minus (p_vaddr - p_offset) of its executable PT_LOAD
    runtime_off: int
    version: tuple[int, int]
    library: bool = False
    free_threaded: bool = False  # a Py_GIL_DISABLED build: its own layout


def layout_index(version: tuple[int, int], free_threaded: bool = False) -> int | None:
    """The slot of the layout in py_layouts (None: no layout)."""
    for i, layout in enumerate(all_layouts()):
        if layout.version == version and layout.free_threaded == free_threaded:
            return i
    return None


def _name(version: tuple[int, int], free_threaded: bool) -> str:
    return f"{version[0]}.{version[1]}{'t' if free_threaded else ''}"


def check(files: tuple[PythonFile, ...]) -> None:
    """Raise PythonFileError for a request the walker cannot take."""
    if len(files) > MAX_FILES:
        raise PythonFileError(f"{len(files)} Python files; at most {MAX_FILES}")
    for f in files:
        if layout_index(f.version, f.free_threaded) is None:
            have = ", ".join(_name(x.version, x.free_threaded) for x in all_layouts())
            raise PythonFileError(
                f"Python {_name(f.version, f.free_threaded)} (file {f.dev:#x}:{f.ino}) has no "
                f"layout in this broker (known: {have})"
            )
        if not (0 <= f.runtime_off < 1 << 40 and 0 <= f.dev < 1 << 32 and 0 < f.ino < 1 << 64):
            raise PythonFileError(f"Python file {f.dev:#x}:{f.ino}: offsets out of range")


def fill(obj: LoadedObject, files: tuple[PythonFile, ...]) -> None:
    """Every layout, then the files (checked first)."""
    check(files)
    layouts = obj.map(LAYOUTS_MAP)
    for i, layout in enumerate(all_layouts()):
        layouts.update(struct.pack("<I", i), layout.pack())
    table = obj.map(FILES_MAP)
    for f in files:
        index = layout_index(f.version, f.free_threaded)
        assert index is not None
        flags = LIB_FLAG if f.library else 0
        table.update(_FILE_KEY.pack(f.dev, f.ino), _FILE_VAL.pack(f.runtime_off, index, flags))
