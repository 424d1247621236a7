"""A Python frame's line number from its code object's line table.

The BPF walker records per frame an "instruction value" and copies the code
object's table; line_for() turns the two into the line CPython itself would
report for that frame (frame.f_lineno), per version:

- 3.9: the value is f_lasti, a byte offset into co_code; the table is
  co_lnotab (pairs of unsigned address step, signed line step).
- 3.10: the value is f_lasti, counted in 2-byte code units; the table is
  co_linetable (PEP 626: pairs of unsigned byte-range length, signed line
  step, -128 meaning "no line"), in bytes, so the unit index is doubled.
- 3.11 and 3.12: the value is prev_instr's code-unit index, the instruction
  running now (or, in a caller, the CALL it waits in); 3.13 and 3.14: the
  value is instr_ptr's index, which the eval loop sets to the instruction it
  starts, so it means the same. Both are what CPython's own
  _PyInterpreterFrame_LASTI computes, and frame.f_lineno is the line of that
  code unit in the location table (PEP 657), as here.

A value of -1 (0xFFFFFFFF after the walker's u32 conversion: a 3.9/3.10 frame
or a 3.11/3.12 frame that has not run its first instruction) gives
co_firstlineno, as CPython does. The walker may copy only the first bytes of
a long table: pass complete=False then, and an instruction beyond what the
copy covers gives None rather than a guess.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["NOT_STARTED", "line_for", "ranges"]

NOT_STARTED = 0xFFFFFFFF


def line_for(
    version: tuple[int, ...], linetable: bytes, firstlineno: int, instr: int, complete: bool = True
) -> int | None:
    """The line of instruction value instr (see the module doc), None when the
    instruction has no line or lies beyond the (possibly truncated) table."""
    if instr in (NOT_STARTED, -1):
        return firstlineno
    major_minor = (version[0], version[1])
    if major_minor <= (3, 9):
        return _lnotab_line(linetable, firstlineno, instr, complete)
    offset = instr * 2  # code units to bytes: both tables count bytes
    for start, end, line in ranges(major_minor, linetable, firstlineno):
        if start <= offset < end:
            return line
    return None


def _lnotab_line(table: bytes, firstlineno: int, lasti: int, complete: bool) -> int | None:
    """3.9's PyCode_Addr2Line: add line steps until the address passes lasti."""
    line, addr = firstlineno, 0
    for i in range(0, len(table) - 1, 2):
        addr += table[i]
        if addr > lasti:
            return line
        step = table[i + 1]
        line += step - 256 if step > 127 else step
    return line if complete else None


def ranges(
    version: tuple[int, int], linetable: bytes, firstlineno: int
) -> Iterator[tuple[int, int, int | None]]:
    """(start byte, end byte, line or None) of each range in a 3.10+ table."""
    if version == (3, 10):
        return _pep626_ranges(linetable, firstlineno)
    return _location_ranges(linetable, firstlineno)


def _pep626_ranges(table: bytes, firstlineno: int) -> Iterator[tuple[int, int, int | None]]:
    line, start = firstlineno, 0
    for i in range(0, len(table) - 1, 2):
        end = start + table[i]
        step = table[i + 1] - 256 if table[i + 1] > 127 else table[i + 1]
        if step != -128:
            line += step
        if end > start:
            yield start, end, None if step == -128 else line
        start = end


def _varint(table: bytes, pos: int) -> tuple[int, int]:
    """An unsigned varint of 6-bit chunks, low first, bit 6 = more follow."""
    value = shift = 0
    while pos < len(table):
        b = table[pos]
        pos += 1
        value |= (b & 63) << shift
        shift += 6
        if not b & 64:
            return value, pos
    raise IndexError("varint runs off the table")


def _svarint(table: bytes, pos: int) -> tuple[int, int]:
    value, pos = _varint(table, pos)
    return (-(value >> 1) if value & 1 else value >> 1), pos


def _location_ranges(table: bytes, firstlineno: int) -> Iterator[tuple[int, int, int | None]]:
    """PEP 657 location entries: a first byte 1cccclll (code c, length l+1
    units), then what code c needs; only the line matters here."""
    line, start, pos = firstlineno, 0, 0
    while pos < len(table):
        first = table[pos]
        if not first & 0x80:
            return  # not an entry start: a corrupt or cut table
        code, end = (first >> 3) & 15, start + ((first & 7) + 1) * 2
        pos += 1
        try:
            step, pos = _location_step(code, table, pos)
        except IndexError:
            return  # the entry runs off a truncated copy
        if step is not None:
            line += step
        yield start, end, None if step is None else line
        start = end


def _location_step(code: int, table: bytes, pos: int) -> tuple[int | None, int]:
    """(line step or None for "no location", position of the next entry)."""
    if code == 15:
        return None, pos
    if code == 14:  # long form: line step, end line step, column, end column
        step, pos = _svarint(table, pos)
        for _ in range(3):
            _, pos = _varint(table, pos)
        return step, pos
    if code == 13:  # no columns: line step only
        return _svarint(table, pos)
    if code >= 10:  # one-line form: step code-10, then column and end column
        if pos + 2 > len(table):
            raise IndexError("entry runs off the table")
        return code - 10, pos + 2
    if pos + 1 > len(table):  # short form: same line, one column byte
        raise IndexError("entry runs off the table")
    return 0, pos + 1
