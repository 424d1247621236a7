"""Where _Py_DebugOffsets (3.13+) keeps the offsets this project also has in
layouts.py: the struct lies at the start of _PyRuntime, initialized in the
binary's data, so a binary can be checked against the table without running
it (gfxbpf.client.profiles.python.discover.debug_offsets).

FIELDS maps a PyLayout field name to the position, inside _Py_DebugOffsets,
of the u64 that holds the same offset ("version" is PY_VERSION_HEX). Measured
by tools/python_layouts.py --debug with offsetof(_Py_DebugOffsets, ...)
against the headers named in layouts.py's source for that release.
"""

from __future__ import annotations

__all__ = ["COOKIE", "FIELDS"]

COOKIE = b"xdebugpy"  # _Py_Debug_Cookie, the struct's first 8 bytes

FIELDS: dict[tuple[int, int], dict[str, int]] = {
    (3, 13): {
        "runtime_interp_head": 40,
        "interp_tstate_head": 72,
        "tstate_next": 168,
        "tstate_thread_id": 192,
        "tstate_frame": 184,
        "frame_previous": 232,
        "frame_code": 240,
        "frame_instr": 248,
        "frame_owner": 264,
        "code_adaptive": 344,
        "code_name": 288,
        "code_qualname": 296,
        "code_filename": 280,
        "code_firstlineno": 312,
        "code_linetable": 304,
        "unicode_state": 544,
        "unicode_length": 552,
        "unicode_ascii_data": 560,
        "bytes_size": 520,
        "bytes_data": 528,
        "version": 8,
    },
    (3, 14): {
        "runtime_interp_head": 40,
        "interp_tstate_head": 72,
        "tstate_next": 192,
        "tstate_thread_id": 216,
        "tstate_frame": 208,
        "frame_previous": 256,
        "frame_code": 264,
        "frame_instr": 272,
        "frame_owner": 288,
        "code_adaptive": 384,
        "code_name": 328,
        "code_qualname": 336,
        "code_filename": 320,
        "code_firstlineno": 352,
        "code_linetable": 344,
        "unicode_state": 624,
        "unicode_length": 632,
        "unicode_ascii_data": 640,
        "bytes_size": 600,
        "bytes_data": 608,
        "version": 8,
    },
    (3, 15): {
        "runtime_interp_head": 40,
        "interp_tstate_head": 72,
        "tstate_next": 192,
        "tstate_thread_id": 240,
        "tstate_frame": 208,
        "frame_previous": 320,
        "frame_code": 328,
        "frame_instr": 336,
        "frame_owner": 352,
        "code_adaptive": 448,
        "code_name": 392,
        "code_qualname": 400,
        "code_filename": 384,
        "code_firstlineno": 416,
        "code_linetable": 408,
        "unicode_state": 720,
        "unicode_length": 728,
        "unicode_ascii_data": 736,
        "bytes_size": 696,
        "bytes_data": 704,
        "version": 8,
    },
}
