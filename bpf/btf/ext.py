""".BTF.ext: func_info, line_info and CO-RE relocation records of an object.

clang writes instruction offsets here in BYTES from the start of the ELF
section; BPF_PROG_LOAD wants them in INSTRUCTIONS from the start of the
program being loaded. records() selects and relocates one program's records,
func_info_bytes()/line_info_bytes() pack them for the syscall, keeping any
bytes past the fields we know (records may grow in later versions).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any, NamedTuple

from gfxbpf.bpf.btf.kinds import BtfError
from gfxbpf.bpf.btf.table import TypeTable

BTF_EXT_MAGIC = 0xEB9F
INSN_SIZE = 8
FUNC_INFO_MIN = 8
LINE_INFO_MIN = 16
CORE_RELO_MIN = 16
_HDR_MIN = 24  # up to line_info_len
_HDR_CORE = 32  # up to core_relo_len

_U32 = struct.Struct("<I")
_II = struct.Struct("<II")
_IIII = struct.Struct("<IIII")


class FuncInfo(NamedTuple):
    insn_off: int  # bytes from the section start (as clang writes it)
    type_id: int  # the FUNC


class LineInfo(NamedTuple):
    insn_off: int
    file_name_off: int
    line_off: int
    line_col: int  # line << 10 | column


class CoreRelo(NamedTuple):
    insn_off: int
    type_id: int
    access_str_off: int
    kind: int


class BtfExt:
    """A parsed .BTF.ext section; dicts are keyed by ELF section name."""

    def __init__(self) -> None:
        self.version = 1
        self.flags = 0
        self.hdr_len = _HDR_MIN
        # Record sizes; the standard ones when a subsection is absent, so the
        # encoders below always have a size to write.
        self.func_info_rec_size = FUNC_INFO_MIN
        self.line_info_rec_size = LINE_INFO_MIN
        self.core_relo_rec_size = CORE_RELO_MIN
        self.func_info: dict[str, list[FuncInfo]] = {}
        self.line_info: dict[str, list[LineInfo]] = {}
        self.core_relos: dict[str, list[CoreRelo]] = {}
        # Whole records, rec_size bytes each, parallel to the lists above.
        self.func_info_raw: dict[str, list[bytes]] = {}
        self.line_info_raw: dict[str, list[bytes]] = {}
        self.core_relos_raw: dict[str, list[bytes]] = {}
        self._tail_cache: dict[str, dict[bytes, bytes]] = {}

    def __repr__(self) -> str:
        return (
            f"<BtfExt func_info {sum(map(len, self.func_info.values()))}, "
            f"line_info {sum(map(len, self.line_info.values()))}, "
            f"core_relos {sum(map(len, self.core_relos.values()))}>"
        )

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview, btf: TypeTable) -> BtfExt:
        data = bytes(data)
        n = len(data)
        if n < 8:
            raise BtfError(f".BTF.ext is {n} bytes, shorter than its 8-byte preamble")
        magic, version, flags, hdr_len = struct.unpack_from("<HBBI", data, 0)
        if magic != BTF_EXT_MAGIC:
            raise BtfError(f"bad .BTF.ext magic 0x{magic:04x} at byte offset 0 (expected 0xeb9f)")
        if version != 1:
            raise BtfError(f"unsupported .BTF.ext version {version} at byte offset 2 (expected 1)")
        if hdr_len < _HDR_MIN or hdr_len > n:
            raise BtfError(
                f".BTF.ext hdr_len {hdr_len} at byte offset 4 is invalid "
                f"(section is {n} bytes, header needs at least {_HDR_MIN})"
            )
        ext = cls()
        ext.version, ext.flags, ext.hdr_len = version, flags, hdr_len
        fi_off, fi_len, li_off, li_len = struct.unpack_from("<IIII", data, 8)
        ext.func_info_rec_size = _parse_sub(
            data, btf, hdr_len, fi_off, fi_len, FUNC_INFO_MIN, "func_info",
            "<II", FuncInfo, ext.func_info, ext.func_info_raw,
        )  # fmt: skip
        ext.line_info_rec_size = _parse_sub(
            data, btf, hdr_len, li_off, li_len, LINE_INFO_MIN, "line_info",
            "<IIII", LineInfo, ext.line_info, ext.line_info_raw,
        )  # fmt: skip
        if hdr_len >= _HDR_CORE:
            cr_off, cr_len = struct.unpack_from("<II", data, 24)
            ext.core_relo_rec_size = _parse_sub(
                data, btf, hdr_len, cr_off, cr_len, CORE_RELO_MIN, "core_relo",
                "<IIII", CoreRelo, ext.core_relos, ext.core_relos_raw,
            )  # fmt: skip
        return ext

    def records(
        self, what: str, sec: str, start: int, end: int, insn_base: int = 0
    ) -> list[tuple[int, bytes]]:
        """One program's records, relocated for BPF_PROG_LOAD.

        what: "func_info" or "line_info". Takes the records of section `sec`
        with start <= insn_off < end (byte offsets, as clang wrote them) and
        returns (insn_base + (insn_off - start) // 8, raw record) pairs, the
        instruction index the kernel wants. insn_base places an appended
        subprogram after its caller.
        """
        if what == "func_info":
            raws = self.func_info_raw.get(sec, [])
        elif what == "line_info":
            raws = self.line_info_raw.get(sec, [])
        else:
            raise ValueError(f"records(): what must be 'func_info' or 'line_info', not {what!r}")
        out = []
        for raw in raws:
            (off,) = _U32.unpack_from(raw, 0)
            if start <= off < end:
                rel = off - start
                if rel % INSN_SIZE:
                    raise BtfError(
                        f".BTF.ext {what} record of section '{sec}' at byte offset {off} "
                        "is not on an instruction boundary"
                    )
                out.append((insn_base + rel // INSN_SIZE, raw))
        return out

    def encode_func_info(self, records: Iterable[tuple[int, int]]) -> bytes:
        """(insn index, FUNC type id) pairs -> func_info for BPF_PROG_LOAD.

        Records are func_info_rec_size bytes; when that is more than the
        8 we know, the extra bytes come from the original record with the
        same type id (zeros if there is none).
        """
        size = self.func_info_rec_size
        if size == FUNC_INFO_MIN:
            return pack_func_info(records)
        tails = self._tails("func", self.func_info_raw, FUNC_INFO_MIN)
        return b"".join(
            _II.pack(insn, tid) + tails.get(_II.pack(0, tid)[4:], bytes(size - FUNC_INFO_MIN))
            for insn, tid in records
        )

    def encode_line_info(self, records: Iterable[tuple[int, int, int, int]]) -> bytes:
        """(insn index, file_name_off, line_off, line_col) -> line_info for BPF_PROG_LOAD.

        Extra bytes of larger records are kept as in encode_func_info().
        """
        size = self.line_info_rec_size
        if size == LINE_INFO_MIN:
            return pack_line_info(records)
        tails = self._tails("line", self.line_info_raw, LINE_INFO_MIN)
        return b"".join(
            _IIII.pack(insn, f, ln, col)
            + tails.get(_IIII.pack(0, f, ln, col)[4:], bytes(size - LINE_INFO_MIN))
            for insn, f, ln, col in records
        )

    def _tails(self, what: str, raw: dict[str, list[bytes]], known: int) -> dict[bytes, bytes]:
        """Known fields after insn_off -> the record's bytes past the known fields."""
        cache = self._tail_cache.get(what)
        if cache is None:
            cache = {}
            for recs in raw.values():
                for r in recs:
                    cache.setdefault(r[4:known], r[known:])
            self._tail_cache[what] = cache
        return cache

    def func_info_bytes(self, records: Iterable[tuple[int, bytes]]) -> bytes:
        """Pack (insn index, raw record) pairs with func_info_rec_size."""
        return pack_ext_records(records, self.func_info_rec_size)

    def line_info_bytes(self, records: Iterable[tuple[int, bytes]]) -> bytes:
        """Pack (insn index, raw record) pairs with line_info_rec_size."""
        return pack_ext_records(records, self.line_info_rec_size)


def _parse_sub(
    data: bytes,
    btf: TypeTable,
    hdr_len: int,
    off: int,
    length: int,
    min_rec: int,
    what: str,
    fmt: str,
    rec_type: type[FuncInfo] | type[LineInfo] | type[CoreRelo],
    out: dict[str, list[Any]],
    out_raw: dict[str, list[bytes]],
) -> int:
    """Parse one info subsection into `out`/`out_raw`; return its record size."""
    if length == 0:
        return min_rec
    start = hdr_len + off
    rec_size = _record_size(data, off, start, length, min_rec, what)
    pos = start + 4
    end = start + length
    known = struct.calcsize(fmt)
    while pos < end:
        if end - pos < 8:
            raise BtfError(f".BTF.ext {what}: truncated section header at byte offset {pos}")
        name_off, num = _II.unpack_from(data, pos)
        if num == 0:
            raise BtfError(f".BTF.ext {what}: section header at byte offset {pos} has 0 records")
        body = pos + 8
        if num * rec_size > end - body:
            raise BtfError(
                f".BTF.ext {what}: {num} records of {rec_size} bytes at byte offset {body} "
                f"run past the end of the subsection (byte {end})"
            )
        try:
            sec = btf.string_at(name_off)
        except ValueError as e:
            raise BtfError(f".BTF.ext {what}: section name at byte offset {pos}: {e}") from None
        recs = out.setdefault(sec, [])
        raws = out_raw.setdefault(sec, [])
        stop = body + num * rec_size
        if rec_size == known:
            recs.extend(map(rec_type._make, struct.iter_unpack(fmt, data[body:stop])))
        else:
            unpack = struct.Struct(fmt).unpack_from
            recs.extend(rec_type._make(unpack(data, p)) for p in range(body, stop, rec_size))
        raws.extend(data[p : p + rec_size] for p in range(body, stop, rec_size))
        pos = stop
    return rec_size


def _record_size(data: bytes, off: int, start: int, length: int, min_rec: int, what: str) -> int:
    """The record size a subsection starts with, once its bounds are checked."""
    n = len(data)
    if off % 4:
        raise BtfError(f".BTF.ext {what} offset {off} is not 4-byte aligned")
    if start + length > n:
        raise BtfError(
            f".BTF.ext {what} subsection (bytes {start}..{start + length}) runs past the end "
            f"of the {n}-byte section"
        )
    if length < 4:
        raise BtfError(f".BTF.ext {what} subsection at byte offset {start} has no record size")
    (rec_size,) = _U32.unpack_from(data, start)
    if rec_size < min_rec or rec_size % 4:
        raise BtfError(
            f".BTF.ext {what} record size {rec_size} at byte offset {start} is invalid "
            f"(at least {min_rec}, a multiple of 4)"
        )
    return rec_size


def pack_ext_records(records: Iterable[tuple[int, bytes]], rec_size: int) -> bytes:
    """(insn index, raw record) pairs -> bytes; insn_off is rewritten, the rest kept."""
    parts = []
    for insn, raw in records:
        if len(raw) != rec_size:
            raise BtfError(f".BTF.ext record is {len(raw)} bytes, expected {rec_size}")
        if not 0 <= insn <= 0xFFFFFFFF:
            raise BtfError(f".BTF.ext record instruction index {insn} out of range")
        parts.append(_U32.pack(insn))
        parts.append(raw[4:])
    return b"".join(parts)


def pack_func_info(records: Iterable[tuple[int, int]]) -> bytes:
    """(insn index, FUNC type id) pairs -> 8-byte bpf_func_info records."""
    return b"".join(_II.pack(insn, tid) for insn, tid in records)


def pack_line_info(records: Iterable[tuple[int, int, int, int]]) -> bytes:
    """(insn index, file_name_off, line_off, line_col) -> 16-byte bpf_line_info records."""
    return b"".join(_IIII.pack(*r) for r in records)
