"""Python records of the stack-copy programs and the code objects they name.

A program that walks Python frames (catalog/programs/gfx_python.h) sends,
before a sample's stack record, a Python record in the same ring buffer:
tgid, tid and flags where the stack record has them (flags bit
FLAG_PYTHON tells them apart), the frame count, the version, then per frame
(code object address, instruction value, flags), innermost first; its time
stamp is the stack record's entry_ns, which joins the two. The code
objects are copied once per process into the map `py_codes`; CodeBook reads
them through the map's fd and names each frame `function (file:line)`.
"""

from __future__ import annotations

import re
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gfxbpf.client.errors import ProtocolError
from gfxbpf.client.profiles.python.linetable import line_for
from gfxbpf.client.profiles.python.strings import decode_unicode

FLAG_PYTHON = 16  # struct py_rec: a Python record (never set in a stack record)
FLAG_TRUNCATED = 32  # more Python frames than the program's python_frames
# The main thread's frames, taken for a thread that ran none (cudakernels:
# autograd's thread launches backward kernels while the main thread waits).
FLAG_MAIN = 64
FRAME_ENTRY = 1  # the last frame one C call of the evaluation loop ran
TAG_SHIFT = 8  # frame flags >> TAG_SHIFT: the code object's tag (py_codes key)
# The client's own marker, after the outermost frame of a chain cut at the
# program's python_frames: (0, 0, FRAME_CUT) names CUT_FRAME (no code is at 0).
FRAME_CUT = 2
CUT_FRAME = "[python frames cut at the depth limit]"
# The same for a record of the main thread's frames (FLAG_MAIN): (0, 0,
# FRAME_MAIN) after its outermost frame names MAIN_FRAME, so the stack says
# whose Python it shows.
FRAME_MAIN = 4
MAIN_FRAME = "[main thread's Python]"
# chain_hash() of such a record: gfx_pychain.h's GFX_PY_MAIN_SALT.
_MAIN_SALT = 0x6D61696E746872

HEADER = struct.Struct("<6IQ")  # tgid, tid, flags, nframes, version, pad, ts
FRAME = struct.Struct("<QII")  # code, instr, flags
CODE_KEY = struct.Struct("<IIQ")  # tgid, tag, code
CODE_HEAD = struct.Struct("<IiIIIIII")  # version, firstlineno, name/file state+len, table_len, pad
NAME_BYTES, PATH_BYTES, TABLE_BYTES = 96, 192, 1024  # gfx_python.h GFX_PY_NAME/PATH/TABLE
CODE_SIZE = CODE_HEAD.size + NAME_BYTES + PATH_BYTES + TABLE_BYTES

# (code address, instruction value, flags), innermost first
Frame = tuple[int, int, int]
# A code object: (tgid, tag, address)
CodeId = tuple[int, int, int]


@dataclass(frozen=True)
class PyRecord:
    tgid: int
    tid: int
    version: tuple[int, int]
    frames: tuple[Frame, ...]
    truncated: bool
    ts: int  # the stack record it goes with has the same (ustack_rec.entry_ns)
    main: bool = False  # FLAG_MAIN: the main thread's frames, not this thread's

    def marked(self) -> tuple[Frame, ...]:
        """The frames with the client's markers after the outermost: a chain
        cut at the depth limit, the main thread's frames."""
        marks = ((0, 0, FRAME_CUT),) if self.truncated else ()
        return self.frames + marks + (((0, 0, FRAME_MAIN),) if self.main else ())


def is_python(rec: bytes) -> bool:
    """A Python record (else a stack record) of the same ring buffer."""
    return len(rec) >= 12 and bool(struct.unpack_from("<I", rec, 8)[0] & FLAG_PYTHON)


def parse(rec: bytes) -> PyRecord:
    if len(rec) < HEADER.size:
        raise ProtocolError(f"a {len(rec)}-byte Python record (update gfxclient)")
    tgid, tid, flags, n, version, _, ts = HEADER.unpack_from(rec)
    if len(rec) < HEADER.size + n * FRAME.size:
        raise ProtocolError(f"a Python record of {n} frames in {len(rec)} bytes (update gfxclient)")
    frames = tuple(FRAME.unpack_from(rec, HEADER.size + i * FRAME.size) for i in range(n))
    ver = (version >> 8, version & 0xFF)
    return PyRecord(
        tgid, tid, ver, frames, bool(flags & FLAG_TRUNCATED), ts, bool(flags & FLAG_MAIN)
    )


_FNV_OFFSET, _FNV_PRIME, _U64 = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1


def chain_hash(frames: Iterable[Frame]) -> int:
    """ustackcopy's row key for a Python chain (python_hash() in
    ustackcopy.bpf.c): FNV-1a over each frame's code and instruction value,
    low bit set, salted for the main thread's frames; 0 for no frame."""
    h, n = _FNV_OFFSET, 0
    for code, instr, flags in frames:
        if not code:  # the client's markers: not frames the program saw
            h ^= _MAIN_SALT if flags & FRAME_MAIN else 0
            continue
        h = ((h ^ code) * _FNV_PRIME) & _U64
        h = ((h ^ instr) * _FNV_PRIME) & _U64
        n += 1
    return h | 1 if n else 0


@dataclass(frozen=True)
class CodeInfo:
    """What py_codes holds of one code object, decoded."""

    version: tuple[int, int]
    name: str
    filename: str
    firstlineno: int
    table: bytes
    complete: bool  # the whole line table was copied

    def line(self, instr: int) -> int | None:
        return line_for(self.version, self.table, self.firstlineno, instr, self.complete)


def decode_code(value: bytes) -> CodeInfo:
    if len(value) < CODE_SIZE:
        raise ProtocolError(f"py_codes: a {len(value)}-byte value (update gfxclient)")
    version, first, nstate, nlen, fstate, flen, tlen, _ = CODE_HEAD.unpack_from(value)
    ver = (version >> 8, version & 0xFF)
    o = CODE_HEAD.size
    name = decode_unicode(ver, nstate, nlen, bytes(value[o : o + NAME_BYTES]))
    o += NAME_BYTES
    filename = decode_unicode(ver, fstate, flen, bytes(value[o : o + PATH_BYTES]))
    o += PATH_BYTES
    table = bytes(value[o : o + min(tlen, TABLE_BYTES)])
    return CodeInfo(ver, name, filename, first, table, tlen <= TABLE_BYTES)


# Looks up packed py_codes keys; (key, value) of those present, or None when
# the map cannot be read through its fd (then read_all is used).
# (Values are bytes; per-CPU maps would give lists, which py_codes is not.)
Lookup = Callable[[Iterable[bytes]], "list[tuple[bytes, Any]] | None"]
ReadAll = Callable[[], "list[tuple[bytes, Any]]"]


class CodeBook:
    """Code objects by (tgid, address), read from py_codes as records name them
    (the map is an LRU: a code object is read soon after it is first met)."""

    # Without a direct fd the whole map comes through the broker: at most this often.
    READ_ALL_EVERY_S = 1.0

    def __init__(self, lookup: Lookup, read_all: ReadAll) -> None:
        self._lookup = lookup
        self._read_all = read_all
        self._read_all_at = -self.READ_ALL_EVERY_S
        self.codes: dict[CodeId, CodeInfo | None] = {}
        self._wanted: set[CodeId] = set()
        self._names: dict[tuple[int, int, int, int], str] = {}

    def want(self, tgid: int, frames: Iterable[Frame]) -> None:
        for code, _, flags in frames:
            cid = (tgid, flags >> TAG_SHIFT, code)
            if code and cid not in self.codes:
                self._wanted.add(cid)

    def resolve(self, final: bool = False) -> None:
        """Read what want() asked for since the last call (through the broker:
        at most every READ_ALL_EVERY_S, unless final)."""
        if not self._wanted:
            return
        keys = [CODE_KEY.pack(*cid) for cid in sorted(self._wanted)]
        found = self._lookup(keys)
        if found is None:
            now = time.monotonic()
            if not final and now - self._read_all_at < self.READ_ALL_EVERY_S:
                return  # keep them wanted
            self._read_all_at = now
            found = self._read_all()
        for key, value in found:
            cid: CodeId = CODE_KEY.unpack(key)
            if cid in self._wanted:
                self.codes[cid] = decode_code(bytes(value))
        for missing in self._wanted - self.codes.keys():
            self.codes[missing] = None  # stored before its record was sent: evicted since
        self._wanted.clear()

    def name(self, tgid: int, frame: Frame) -> str:
        """`function (file:line)`; a code object never read: its address."""
        code, instr, flags = frame
        if not code:
            return MAIN_FRAME if flags & FRAME_MAIN else CUT_FRAME
        key = (tgid, flags >> TAG_SHIFT, code, instr)
        got = self._names.get(key)
        if got is None:
            info = self.codes.get(key[:3])
            got = self._names[key] = _frame_name(info, code, instr)
        return got

    def first_line(self, tgid: int, frame: Frame) -> int:
        """The line its function starts at (co_firstlineno); 0 if not known."""
        code, _, flags = frame
        info = self.codes.get((tgid, flags >> TAG_SHIFT, code)) if code else None
        return info.firstlineno if info is not None else 0


# C0 and C1 control characters: no function or file name holds one, and one
# read from a code object copied mid-change (a frame being set up) must not
# reach a line-based format (seen on an H200, 1 sample in 3000).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _frame_name(info: CodeInfo | None, code: int, instr: int) -> str:
    if info is None:
        return f"[python code {code:#x}]"
    if _CONTROL.search(info.name) or _CONTROL.search(info.filename):
        return f"[python code {code:#x}: not a code object when read]"
    line = info.line(instr)
    return f"{info.name} ({info.filename}:{line if line is not None else '?'})"


def parse_frame_name(name: str) -> tuple[str, str, int] | None:
    """(function, file, line) of a name _frame_name made (line 0: "?");
    None for the names it makes up ([python code ...], the cut marker)."""
    if not name.endswith(")") or " (" not in name:
        return None
    function, _, where = name[:-1].rpartition(" (")
    file, _, line = where.rpartition(":")
    if not function or not file or not (line.isdigit() or line == "?"):
        return None
    return function, file, int(line) if line.isdigit() else 0
