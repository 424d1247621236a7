"""A CPython str from what the BPF walker copied of it: the PyASCIIObject
state word, the length in code points and the first bytes of its data.

The state word's bitfields (interned:2, kind:3, compact:1, ascii:1, then
ready:1 up to 3.11 or statically_allocated:1 from 3.12) put kind at bits
2-4, compact at bit 5 and ascii at bit 6 in every release from 3.9 to 3.14
on x86-64 (tools/python_layouts.py measures them; the layout test checks the
host's headers agree). The walker copies from sizeof(PyASCIIObject) when the
ascii bit is set, else from sizeof(PyCompactUnicodeObject); names and file
names of code objects are always compact. A non-compact (legacy) string
keeps its data elsewhere, which the walker does not follow.
"""

from __future__ import annotations

__all__ = ["ELLIPSIS", "STATE_BITS", "decode_unicode"]

ELLIPSIS = "…"

# (kind shift, kind mask, compact bit, ascii bit) by release; the same in all.
STATE_BITS: dict[tuple[int, int], tuple[int, int, int, int]] = {
    (3, v): (2, 7, 1 << 5, 1 << 6) for v in range(9, 16)
}

_CODECS = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}


def decode_unicode(version: tuple[int, ...], state: int, length: int, data: bytes) -> str:
    """The string, or its prefix ending in "…" when data holds less than
    length code points; "…" alone for a string whose data was not copied
    (not compact, or an unknown kind or release)."""
    bits = STATE_BITS.get((version[0], version[1]))
    if bits is None or length < 0:
        return ELLIPSIS
    shift, mask, compact, ascii_bit = bits
    if not state & compact:
        return ELLIPSIS
    kind = 1 if state & ascii_bit else (state >> shift) & mask
    codec = _CODECS.get(kind)
    if codec is None:
        return ELLIPSIS
    have = min(length, len(data) // kind)
    text = data[: have * kind].decode(codec, "replace")
    return text if have == length else text + ELLIPSIS
