"""Where CPython keeps the thread states, frames and code objects, per version.

The BPF walker (catalog/programs/gfx_python.h, struct py_layout) reads these
numbers from its `py_layouts` map; one object serves every version.
"""

from __future__ import annotations

import struct
from dataclasses import astuple, dataclass, fields

NONE = 0xFFFFFFFF  # field absent in this version


@dataclass(frozen=True)
class PyLayout:
    version: tuple[int, int]
    source: str  # where the numbers come from (header, commit/tag)
    runtime_interp_head: int
    interp_tstate_head: int
    tstate_next: int
    tstate_thread_id: int
    tstate_frame: int
    cframe_current_frame: int
    frame_kind: int
    frame_code: int
    frame_code_tag_mask: int
    frame_previous: int
    frame_instr: int
    frame_instr_kind: int
    frame_owner: int
    frame_is_entry: int
    owner_cstack: int
    code_adaptive: int
    code_name: int
    code_qualname: int
    code_filename: int
    code_firstlineno: int
    code_linetable: int
    unicode_state: int
    unicode_length: int
    unicode_ascii_data: int
    unicode_compact_data: int
    bytes_size: int
    bytes_data: int

    def pack(self) -> bytes:
        """struct py_layout: u32 major<<8|minor, then every field after `source`."""
        values = astuple(self)[2:]
        major, minor = self.version
        return struct.pack(f"<{1 + len(values)}I", major << 8 | minor, *values)


PACKED_SIZE = 4 * (len(fields(PyLayout)) - 1)

LAYOUTS: dict[tuple[int, int], PyLayout] = {
    (3, 11): PyLayout(
        version=(3, 11),
        source="v3.11.7 Include/internal/pycore_runtime.h, pycore_interp.h, pycore_frame.h, "
        "cpython/pystate.h, cpython/code.h, cpython/unicodeobject.h, cpython/bytesobject.h",
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
        owner_cstack=0xFF,
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
}


def layout_for(version: tuple[int, int]) -> PyLayout | None:
    return LAYOUTS.get((version[0], version[1]))
