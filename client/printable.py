"""Text that came from other users, made safe to show on a terminal.

Map keys and event fields carry strings other users choose: a process name
(comm, up to 15 bytes, set with prctl or by exec'ing a file so named), a
file name, a symbol name. Written raw, "\\x1b]0;title\\x07" retitles the
viewer's terminal and "\\x1b]52;c;…\\x07" writes their clipboard, and an
invisible format character lies about what is shown: U+202E (right-to-left
override) + "hs.nigol" reads "login.sh". Every string shown as text (dump,
watch, stream, profile's table, flame graph titles) goes through
printable(), which writes each C0 control, DEL and C1 control as \\xNN and
each format character (Unicode category Cf: bidi controls, zero-width
characters, soft hyphen, tags) and line or paragraph separator as \\uNNNN
(\\UNNNNNNNN beyond the BMP); `--json` output stays exact (JSON escapes C0
itself, and json_printable() escapes the rest as \\uNNNN, which decodes to
the same string).

printable() is idempotent (its output holds no such character), so a line
built from escaped pieces can be escaped again where it is written.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["json_printable", "hidden", "printable"]

# Anything but printable ASCII may need a look; most text is ASCII and
# goes through without one.
_SUSPECT = re.compile("[^\x20-\x7e]")
# A terminal acts on controls (Cc: C0, DEL, C1; a UTF-8 terminal may take
# U+009B as CSI, U+009D as OSC); format characters (Cf) and the separators
# (Zl, Zp) are invisible or reorder, break or hide what is shown.
_HIDDEN = frozenset(("Cc", "Cf", "Zl", "Zp"))


def hidden(ch: str) -> bool:
    """Whether ch is a character printable() escapes."""
    return unicodedata.category(ch) in _HIDDEN


def _escape(m: re.Match[str]) -> str:
    ch = m.group()
    if not hidden(ch):
        return ch
    n = ord(ch)
    if n <= 0xFF:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n <= 0xFFFF else f"\\U{n:08x}"


def _json_escape(m: re.Match[str]) -> str:
    ch = m.group()
    n = ord(ch)
    if n < 0x20 or not hidden(ch):  # C0 stands only between tokens (indent)
        return ch
    if n <= 0xFFFF:
        return f"\\u{n:04x}"
    n -= 0x10000  # a surrogate pair, as JSON writes characters beyond the BMP
    return f"\\u{0xD800 + (n >> 10):04x}\\u{0xDC00 + (n & 0x3FF):04x}"


def printable(text: str) -> str:
    """text with each control character written as \\xNN ("\\x1b", "\\x9b")
    and each format character or separator as \\uNNNN ("\\u202e")."""
    if _SUSPECT.search(text) is None:  # the usual case: no copy
        return text
    return _SUSPECT.sub(_escape, text)


def json_printable(doc: str) -> str:
    """JSON text from json.dumps(..., ensure_ascii=False) with DEL, C1 and
    format characters escaped (\\u009b, \\u202e): the same document, safe on a
    terminal. Such a character can only stand inside a JSON string (the
    syntax is ASCII, and json.dumps escapes C0 itself)."""
    # An ASCII str knows it is one: a 10,000-row dump skips the regex's walk.
    if doc.isascii() and "\x7f" not in doc:
        return doc
    if _SUSPECT.search(doc) is None:
        return doc
    return _SUSPECT.sub(_json_escape, doc)
