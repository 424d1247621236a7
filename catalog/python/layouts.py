"""CPython struct offsets per minor release (x86-64, default GIL build, release
build), for the BPF frame walker: the broker packs each entry into the
py_layouts map (struct py_layout in gfx_python.h), the client decodes what the
walker copied with the same entry.

Every number was measured, not typed: tools/python_layouts.py compiles an
offsetof() program with -DPy_BUILD_CORE against that release's installed
headers (Include/ and Include/internal/) and prints the entry; `source` says
which headers. tests/unit/test_python_layouts.py measures the host's headers
again and compares. For 3.13+ the interpreter also carries the same offsets in
_Py_DebugOffsets, which discover.py checks in each binary it finds.

owner_cstack is the owner value of the shim frame the eval loop pushes when
C code enters it: FRAME_OWNED_BY_CSTACK in 3.12 and 3.13, and in 3.14+
FRAME_OWNED_BY_INTERPRETER (3.14's Python/ceval.c sets that on its entry frame;
its FRAME_OWNED_BY_CSTACK, 4, is assigned nowhere; 3.15 has no CSTACK owner
at all). It is 3 in all four.
"""

from __future__ import annotations

import struct
from dataclasses import astuple, dataclass

__all__ = ["FREE_THREADED", "LAYOUTS", "NONE", "PyLayout", "all_layouts", "layout_for"]

NONE = 0xFFFFFFFF  # field absent in this version


@dataclass(frozen=True)
class PyLayout:
    version: tuple[int, int]
    source: str  # where the numbers come from (release, headers)
    runtime_interp_head: int  # offsetof(_PyRuntimeState, interpreters.head)
    interp_tstate_head: int  # offsetof(PyInterpreterState, tstate_head | threads.head)
    tstate_next: int
    tstate_thread_id: int
    tstate_frame: int  # 3.9/10 frame; 3.11/12 cframe; 3.13+ current_frame
    cframe_current_frame: int  # 3.11/12; NONE otherwise
    frame_kind: int  # 0 PyFrameObject (<=3.10), 1 _PyInterpreterFrame
    frame_code: int  # f_code / f_executable
    frame_code_tag_mask: int  # bits to clear from f_executable (_PyStackRef, 3.14), else 0
    frame_previous: int  # f_back / previous
    frame_instr: int  # f_lasti / prev_instr / instr_ptr
    frame_instr_kind: int  # 0 int f_lasti, 1 prev_instr pointer, 2 instr_ptr pointer
    frame_owner: int  # 3.11+, else NONE (a char)
    frame_is_entry: int  # 3.11 only, else NONE (a bool/char)
    owner_cstack: int  # the entry shim's owner value (3.12+, see above), else 0xFF
    code_adaptive: int  # offsetof(PyCodeObject, co_code_adaptive) (3.11+), else NONE
    code_name: int
    code_qualname: int  # 3.11+, else NONE
    code_filename: int
    code_firstlineno: int  # an int field
    code_linetable: int  # co_lnotab (3.9) / co_linetable (3.10+)
    unicode_state: int  # offset of the state bitfield word
    unicode_length: int
    unicode_ascii_data: int  # sizeof(PyASCIIObject)
    unicode_compact_data: int  # sizeof(PyCompactUnicodeObject)
    bytes_size: int  # PyVarObject ob_size of PyBytesObject
    bytes_data: int  # offsetof(PyBytesObject, ob_sval)
    free_threaded: bool = False  # a Py_GIL_DISABLED build ("3.13t"); not packed

    def pack(self) -> bytes:
        """struct py_layout: u32 major<<8|minor, then every field after source
        up to bytes_data."""
        fields = astuple(self)[2:-1]
        major, minor = self.version
        return struct.pack(f"<{1 + len(fields)}I", major << 8 | minor, *fields)


def layout_for(version: tuple[int, ...], free_threaded: bool = False) -> PyLayout | None:
    table = FREE_THREADED if free_threaded else LAYOUTS
    return table.get((version[0], version[1]))


def all_layouts() -> list[PyLayout]:
    """Every layout in py_layouts slot order: the default builds by version,
    then the free-threaded ones."""
    return [LAYOUTS[v] for v in sorted(LAYOUTS)] + [FREE_THREADED[v] for v in sorted(FREE_THREADED)]


_PYENV = "pyenv's build of the release tarball: include/python3.X/{,internal/}"
_DEBIAN = "Debian's python3.X-dev: /usr/include/python3.X/{,internal/} + multiarch pyconfig.h"

LAYOUTS: dict[tuple[int, int], PyLayout] = {
    (3, 9): PyLayout(
        version=(3, 9),
        source="v3.9.18; " + _PYENV,
        runtime_interp_head=32,
        interp_tstate_head=8,
        tstate_next=8,
        tstate_thread_id=176,
        tstate_frame=24,
        cframe_current_frame=NONE,
        frame_kind=0,
        frame_code=32,
        frame_code_tag_mask=0,
        frame_previous=24,
        frame_instr=104,
        frame_instr_kind=0,
        frame_owner=NONE,
        frame_is_entry=NONE,
        owner_cstack=255,
        code_adaptive=NONE,
        code_name=112,
        code_qualname=NONE,
        code_filename=104,
        code_firstlineno=40,
        code_linetable=120,
        unicode_state=32,
        unicode_length=16,
        unicode_ascii_data=48,
        unicode_compact_data=72,
        bytes_size=16,
        bytes_data=32,
    ),
    (3, 10): PyLayout(
        version=(3, 10),
        source="v3.10.13; " + _PYENV,
        runtime_interp_head=32,
        interp_tstate_head=8,
        tstate_next=8,
        tstate_thread_id=176,
        tstate_frame=24,
        cframe_current_frame=NONE,
        frame_kind=0,
        frame_code=32,
        frame_code_tag_mask=0,
        frame_previous=24,
        frame_instr=96,
        frame_instr_kind=0,
        frame_owner=NONE,
        frame_is_entry=NONE,
        owner_cstack=255,
        code_adaptive=NONE,
        code_name=112,
        code_qualname=NONE,
        code_filename=104,
        code_firstlineno=40,
        code_linetable=120,
        unicode_state=32,
        unicode_length=16,
        unicode_ascii_data=48,
        unicode_compact_data=72,
        bytes_size=16,
        bytes_data=32,
    ),
    (3, 11): PyLayout(
        version=(3, 11),
        source="v3.11.2 (Debian 12 3.11.2-6+deb12u6); same as v3.11.7 by pyenv; " + _DEBIAN,
        runtime_interp_head=40,
        interp_tstate_head=16,
        tstate_next=8,
        tstate_thread_id=152,
        tstate_frame=56,
        cframe_current_frame=8,
        frame_kind=1,
        frame_code=32,
        frame_code_tag_mask=0,
        frame_previous=48,
        frame_instr=56,
        frame_instr_kind=1,
        frame_owner=69,
        frame_is_entry=68,
        owner_cstack=255,
        code_adaptive=184,
        code_name=120,
        code_qualname=128,
        code_filename=112,
        code_firstlineno=72,
        code_linetable=136,
        unicode_state=32,
        unicode_length=16,
        unicode_ascii_data=48,
        unicode_compact_data=72,
        bytes_size=16,
        bytes_data=32,
    ),
    (3, 12): PyLayout(
        version=(3, 12),
        source="v3.12.1; " + _PYENV,
        runtime_interp_head=40,
        interp_tstate_head=72,
        tstate_next=8,
        tstate_thread_id=136,
        tstate_frame=56,
        cframe_current_frame=0,
        frame_kind=1,
        frame_code=0,
        frame_code_tag_mask=0,
        frame_previous=8,
        frame_instr=56,
        frame_instr_kind=1,
        frame_owner=70,
        frame_is_entry=NONE,
        owner_cstack=3,
        code_adaptive=192,
        code_name=120,
        code_qualname=128,
        code_filename=112,
        code_firstlineno=68,
        code_linetable=136,
        unicode_state=32,
        unicode_length=16,
        unicode_ascii_data=40,
        unicode_compact_data=56,
        bytes_size=16,
        bytes_data=32,
    ),
    (3, 13): PyLayout(
        version=(3, 13),
        source="v3.13.5 (Debian 13 3.13.5-2+deb13u5); same as v3.13.0 by pyenv; " + _DEBIAN,
        runtime_interp_head=0x278,
        interp_tstate_head=0x1CB0,
        tstate_next=8,
        tstate_thread_id=152,
        tstate_frame=72,
        cframe_current_frame=NONE,
        frame_kind=1,
        frame_code=0,
        frame_code_tag_mask=0,
        frame_previous=8,
        frame_instr=56,
        frame_instr_kind=2,
        frame_owner=70,
        frame_is_entry=NONE,
        owner_cstack=3,
        code_adaptive=200,
        code_name=120,
        code_qualname=128,
        code_filename=112,
        code_firstlineno=68,
        code_linetable=136,
        unicode_state=32,
        unicode_length=16,
        unicode_ascii_data=40,
        unicode_compact_data=56,
        bytes_size=16,
        bytes_data=32,
    ),
    (3, 14): PyLayout(
        version=(3, 14),
        source="v3.14.10 (Debian sid 3.14.10-1); " + _DEBIAN,
        runtime_interp_head=0x328,
        interp_tstate_head=0x1CB0,
        tstate_next=8,
        tstate_thread_id=152,
        tstate_frame=72,
        cframe_current_frame=NONE,
        frame_kind=1,
        frame_code=0,
        frame_code_tag_mask=3,
        frame_previous=8,
        frame_instr=56,
        frame_instr_kind=2,
        frame_owner=74,
        frame_is_entry=NONE,
        owner_cstack=3,
        code_adaptive=208,
        code_name=120,
        code_qualname=128,
        code_filename=112,
        code_firstlineno=68,
        code_linetable=136,
        unicode_state=32,
        unicode_length=16,
        unicode_ascii_data=40,
        unicode_compact_data=56,
        bytes_size=16,
        bytes_data=32,
    ),
    (3, 15): PyLayout(
        version=(3, 15),
        source="v3.15.2 (Debian unstable 3.15.2-1); " + _DEBIAN,
        runtime_interp_head=0x3A8,
        interp_tstate_head=0x1CA8,
        tstate_next=8,
        tstate_thread_id=176,
        tstate_frame=72,
        cframe_current_frame=NONE,
        frame_kind=1,
        frame_code=0,
        frame_code_tag_mask=3,
        frame_previous=8,
        frame_instr=56,
        frame_instr_kind=2,
        frame_owner=74,
        frame_is_entry=NONE,
        owner_cstack=3,
        code_adaptive=208,
        code_name=120,
        code_qualname=128,
        code_filename=112,
        code_firstlineno=68,
        code_linetable=136,
        unicode_state=32,
        unicode_length=16,
        unicode_ascii_data=40,
        unicode_compact_data=56,
        bytes_size=16,
        bytes_data=32,
    ),
}

# Free-threaded builds (PEP 703, configure --disable-gil): every object head
# is 16 bytes longer (ob_tid, ob_flags, ob_mutex, ob_gc_bits, ob_ref_local,
# ob_ref_shared before ob_type), so code, string and bytes fields move; the
# 3.13 frame and thread state keep the default build's layout. Told apart in
# a binary by its _Py_DebugOffsets, which match one table or the other.
FREE_THREADED: dict[tuple[int, int], PyLayout] = {
    (3, 13): PyLayout(
        version=(3, 13),
        source="v3.13.5 (Debian 13's python3.13 source, 3.13.5 orig tarball) configured with "
        "--disable-gil: Include/{,internal/} + the build's pyconfig.h",
        runtime_interp_head=0x278,
        interp_tstate_head=0x1CB0,
        tstate_next=8,
        tstate_thread_id=152,
        tstate_frame=72,
        cframe_current_frame=NONE,
        frame_kind=1,
        frame_code=0,
        frame_code_tag_mask=0,
        frame_previous=8,
        frame_instr=56,
        frame_instr_kind=2,
        frame_owner=70,
        frame_is_entry=NONE,
        owner_cstack=3,
        code_adaptive=216,
        code_name=136,
        code_qualname=144,
        code_filename=128,
        code_firstlineno=84,
        code_linetable=152,
        unicode_state=48,
        unicode_length=32,
        unicode_ascii_data=56,
        unicode_compact_data=72,
        bytes_size=32,
        bytes_data=48,
        free_threaded=True,
    ),
}
