"""A user-space reference walk of CPython's thread and frame lists, following
a gfxbpf.catalog.python.layouts entry over any memory reader: a test image
(tests/python_image.py) or a live process's /proc/PID/mem.

It does what PYFRAMES-style BPF walking does, in the same order (runtime ->
main interpreter -> thread states -> frames -> code object -> strings, line
table), so a layout that lets this walk name a real process's frames is
one the BPF walker can follow too. It is a test tool, not the walker.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from gfxbpf.catalog.python.layouts import NONE, PyLayout
from gfxbpf.client.profiles.python.linetable import line_for
from gfxbpf.client.profiles.python.strings import decode_unicode

Read = Callable[[int, int], bytes]
LIMIT = 64
STRING_BYTES = 256  # what the walker copies of a string at most
TABLE_BYTES = 4096  # ... and of a line table


@dataclass(frozen=True)
class RawFrame:
    code: int
    instr: int  # u32, as the BPF records it
    entry: bool


@dataclass(frozen=True)
class PyFrame:
    name: str  # qualname (3.11+), else name
    filename: str
    line: int | None
    entry: bool


def _u64(read: Read, addr: int) -> int:
    return int(struct.unpack("<Q", read(addr, 8))[0])


def _u32(read: Read, addr: int) -> int:
    return int(struct.unpack("<I", read(addr, 4))[0])


def threads(lay: PyLayout, read: Read, runtime: int) -> list[tuple[int, int]]:
    """(tstate address, thread_id) of the main interpreter's threads."""
    interp = _u64(read, runtime + lay.runtime_interp_head)
    out: list[tuple[int, int]] = []
    tstate = _u64(read, interp + lay.interp_tstate_head) if interp else 0
    while tstate and len(out) < LIMIT:
        out.append((tstate, _u64(read, tstate + lay.tstate_thread_id)))
        tstate = _u64(read, tstate + lay.tstate_next)
    return out


def _first_frame(lay: PyLayout, read: Read, tstate: int) -> int:
    top = _u64(read, tstate + lay.tstate_frame)
    if lay.cframe_current_frame != NONE and top:
        return _u64(read, top + lay.cframe_current_frame)
    return top


def _instr(lay: PyLayout, read: Read, frame: int, code: int) -> int:
    if lay.frame_instr_kind == 0:
        return _u32(read, frame + lay.frame_instr)  # int f_lasti; -1 stays 0xFFFFFFFF
    ptr = _u64(read, frame + lay.frame_instr)
    return ((ptr - (code + lay.code_adaptive)) // 2) & 0xFFFFFFFF


def frames(lay: PyLayout, read: Read, tstate: int) -> list[RawFrame]:
    """The thread's frames, leaf first, shim frames left out."""
    out: list[RawFrame] = []
    frame = _first_frame(lay, read, tstate)
    for _ in range(LIMIT * 2):
        if not frame or len(out) >= LIMIT:
            break
        owner = read(frame + lay.frame_owner, 1)[0] if lay.frame_owner != NONE else None
        if owner is not None and lay.owner_cstack != 0xFF and owner >= lay.owner_cstack:
            if out:  # a shim: the frame nearer the leaf was entered from C
                out[-1] = RawFrame(out[-1].code, out[-1].instr, True)
        else:
            code = _u64(read, frame + lay.frame_code) & ~lay.frame_code_tag_mask
            entry = lay.frame_kind == 0 or (
                lay.frame_is_entry != NONE and read(frame + lay.frame_is_entry, 1)[0] != 0
            )
            out.append(RawFrame(code, _instr(lay, read, frame, code), entry))
        frame = _u64(read, frame + lay.frame_previous)
    return out


def string(lay: PyLayout, read: Read, obj: int) -> str:
    state = _u32(read, obj + lay.unicode_state)
    length = _u64(read, obj + lay.unicode_length)
    ascii_bit = state & (1 << 6)
    kind = 1 if ascii_bit else (state >> 2) & 7
    at = obj + (lay.unicode_ascii_data if ascii_bit else lay.unicode_compact_data)
    data = read(at, min(length * max(kind, 1), STRING_BYTES))
    return decode_unicode(lay.version, state, length, data)


def _table(lay: PyLayout, read: Read, obj: int) -> tuple[bytes, bool]:
    size = _u64(read, obj + lay.bytes_size)
    copied = min(size, TABLE_BYTES)
    return read(obj + lay.bytes_data, copied), copied == size


def decode(lay: PyLayout, read: Read, raw: RawFrame) -> PyFrame:
    name_at = lay.code_qualname if lay.code_qualname != NONE else lay.code_name
    table, complete = _table(lay, read, _u64(read, raw.code + lay.code_linetable))
    first = _u32(read, raw.code + lay.code_firstlineno)
    return PyFrame(
        name=string(lay, read, _u64(read, raw.code + name_at)),
        filename=string(lay, read, _u64(read, raw.code + lay.code_filename)),
        line=line_for(lay.version, table, first, raw.instr, complete),
        entry=raw.entry,
    )


def walk(lay: PyLayout, read: Read, runtime: int) -> dict[int, list[PyFrame]]:
    """{thread_id: its frames, leaf first} for every thread of the main interpreter."""
    return {
        tid: [decode(lay, read, raw) for raw in frames(lay, read, tstate)]
        for tstate, tid in threads(lay, read, runtime)
    }
