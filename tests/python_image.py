"""Memory images laid out the way a CPython release lays out its runtime,
thread states, frames, code, str and bytes objects, built from a
gfxbpf.catalog.python.layouts entry, for tests of the reference walk
(tests/python_walk.py) on releases whose interpreter is not at hand.

Only the fields the walker reads are written; the rest stays zero. The str
state bits are the ones tools/python_layouts.py measured in every release
(kind at bits 2-4, compact bit 5, ascii bit 6).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from gfxbpf.catalog.python.layouts import NONE, PyLayout

BASE = 0x7F3A_0000_0000
_OBJECT = 512  # room for any struct the walker reads, above its highest offset


class Image:
    """A flat address space from BASE; reads outside it raise."""

    def __init__(self) -> None:
        self.mem = bytearray()

    def alloc(self, size: int, align: int = 16) -> int:
        self.mem.extend(b"\0" * (-len(self.mem) % align))
        addr = BASE + len(self.mem)
        self.mem.extend(b"\0" * size)
        return addr

    def write(self, addr: int, data: bytes) -> None:
        off = addr - BASE
        assert 0 <= off and off + len(data) <= len(self.mem), hex(addr)
        self.mem[off : off + len(data)] = data

    def u64(self, addr: int, value: int) -> None:
        self.write(addr, struct.pack("<Q", value))

    def read(self, addr: int, size: int) -> bytes:
        off = addr - BASE
        if off < 0 or off + size > len(self.mem):
            raise OSError(f"read of {size} bytes at {addr:#x} outside the image")
        return bytes(self.mem[off : off + size])


@dataclass(frozen=True)
class CodeSpec:
    name: str
    qualname: str
    filename: str
    firstlineno: int
    table: bytes
    units: int  # code units of bytecode


@dataclass(frozen=True)
class FrameSpec:
    code: CodeSpec
    instr: int  # the instruction value (f_lasti, or a code-unit index)
    entry: bool  # entered from C: 3.11 is_entry; 3.12+ a shim frame follows it


class Builder:
    def __init__(self, lay: PyLayout) -> None:
        self.lay, self.img = lay, Image()
        self._codes: dict[CodeSpec, int] = {}

    def string(self, text: str) -> int:
        top = max(map(ord, text), default=0)
        kind = 1 if top < 0x100 else 2 if top < 0x10000 else 4
        is_ascii = top < 0x80
        state = (kind << 2) | (1 << 5) | ((1 << 6) if is_ascii else 0)
        data_at = self.lay.unicode_ascii_data if is_ascii else self.lay.unicode_compact_data
        codec = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind]
        obj = self.img.alloc(data_at + (len(text) + 1) * kind)
        self.img.write(obj + self.lay.unicode_state, struct.pack("<I", state))
        self.img.u64(obj + self.lay.unicode_length, len(text))
        self.img.write(obj + data_at, text.encode(codec))
        return obj

    def bytes_object(self, data: bytes) -> int:
        obj = self.img.alloc(self.lay.bytes_data + len(data) + 1)
        self.img.u64(obj + self.lay.bytes_size, len(data))
        self.img.write(obj + self.lay.bytes_data, data)
        return obj

    def code(self, spec: CodeSpec) -> int:
        if spec in self._codes:
            return self._codes[spec]
        lay = self.lay
        body = 0 if lay.code_adaptive == NONE else lay.code_adaptive + 2 * spec.units
        obj = self.img.alloc(max(_OBJECT, body), align=64)
        self.img.u64(obj + lay.code_name, self.string(spec.name))
        if lay.code_qualname != NONE:
            self.img.u64(obj + lay.code_qualname, self.string(spec.qualname))
        self.img.u64(obj + lay.code_filename, self.string(spec.filename))
        self.img.write(obj + lay.code_firstlineno, struct.pack("<i", spec.firstlineno))
        self.img.u64(obj + lay.code_linetable, self.bytes_object(spec.table))
        self._codes[spec] = obj
        return obj

    def _frame(self, spec: FrameSpec | None, previous: int) -> int:
        """One frame (None: a shim frame of the eval loop's entry), linked to previous."""
        lay, img = self.lay, self.img
        frame = img.alloc(_OBJECT)
        img.u64(frame + lay.frame_previous, previous)
        if spec is None:
            img.write(frame + lay.frame_owner, bytes([lay.owner_cstack]))
            return frame
        code = self.code(spec.code)
        tagged = code | (1 if lay.frame_code_tag_mask else 0)  # 3.14: a deferred reference
        img.u64(frame + lay.frame_code, tagged)
        if lay.frame_instr_kind == 0:
            img.write(frame + lay.frame_instr, struct.pack("<i", spec.instr))
        else:
            img.u64(frame + lay.frame_instr, code + lay.code_adaptive + 2 * spec.instr)
        if lay.frame_is_entry != NONE:
            img.write(frame + lay.frame_is_entry, bytes([spec.entry]))
        return frame

    def stack(self, frames: list[FrameSpec]) -> int:
        """Link frames (leaf first) the way the release does; the leaf's address."""
        previous = 0
        for spec in reversed(frames):  # the oldest first: each links to the one before
            if spec.entry and self.lay.owner_cstack != 0xFF:
                previous = self._frame(None, previous)
            previous = self._frame(spec, previous)
        return previous

    def thread(self, thread_id: int, frames: list[FrameSpec], next_tstate: int) -> int:
        lay, img = self.lay, self.img
        tstate = img.alloc(_OBJECT)
        img.u64(tstate + lay.tstate_next, next_tstate)
        img.u64(tstate + lay.tstate_thread_id, thread_id)
        leaf = self.stack(frames)
        if lay.cframe_current_frame != NONE:
            cframe = img.alloc(64)
            img.u64(cframe + lay.cframe_current_frame, leaf)
            img.u64(tstate + lay.tstate_frame, cframe)
        else:
            img.u64(tstate + lay.tstate_frame, leaf)
        return tstate

    def runtime(self, threads: dict[int, list[FrameSpec]]) -> int:
        """The whole image: _PyRuntime's address, its threads listed in order."""
        head = 0
        for tid, frames in reversed(list(threads.items())):
            head = self.thread(tid, frames, head)
        interp = self.img.alloc(self.lay.interp_tstate_head + 8)
        self.img.u64(interp + self.lay.interp_tstate_head, head)
        runtime = self.img.alloc(self.lay.runtime_interp_head + 8)
        self.img.u64(runtime + self.lay.runtime_interp_head, interp)
        return runtime
