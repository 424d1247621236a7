"""Text that came from other users, made safe to show on a terminal.

Map keys and event fields carry strings other users choose: a process name
(comm, up to 15 bytes, set with prctl or by exec'ing a file so named), a
file name, a symbol name. Written raw, "\\x1b]0;title\\x07" retitles the
viewer's terminal and "\\x1b]52;c;…\\x07" writes their clipboard. Every
string shown as text (dump, watch, stream, profile's table, flame graph
titles) goes through printable(), which writes each C0 control, DEL and C1
control as \\xNN; `--json` output stays exact (JSON escapes C0 itself, and
json_printable() escapes DEL and C1 as \\u00NN, which decodes to the same
string).

printable() is idempotent (its output holds no control character), so a
line built from escaped pieces can be escaped again where it is written.
"""

from __future__ import annotations

import re

__all__ = ["json_printable", "printable"]

# C0 (U+0000–U+001F), DEL (U+007F) and C1 (U+0080–U+009F): a terminal acts on
# these (a UTF-8 terminal may take U+009B as CSI, U+009D as OSC).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
# What json.dumps(ensure_ascii=False) leaves raw of them (it escapes C0).
_JSON_RAW = re.compile("[\x7f-\x9f]")


def _hex(m: re.Match[str]) -> str:
    return f"\\x{ord(m.group()):02x}"


def _unicode(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group()):04x}"


def printable(text: str) -> str:
    """text with each control character written as \\xNN ("\\x1b", "\\x9b")."""
    if _CONTROL.search(text) is None:  # the usual case: no copy
        return text
    return _CONTROL.sub(_hex, text)


def json_printable(doc: str) -> str:
    """JSON text from json.dumps(..., ensure_ascii=False) with DEL and C1
    characters escaped (\\u009b): the same document, safe on a terminal.
    Such a character can only stand inside a JSON string (the syntax is ASCII)."""
    if _JSON_RAW.search(doc) is None:
        return doc
    return _JSON_RAW.sub(_unicode, doc)
