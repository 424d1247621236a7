"""gfxbpf.client.printable: other users' strings never reach a terminal raw
(issue 26 item 7). The attack itself, as real users against a real broker,
is in tests/kernel/test_client_attacks.py."""

from __future__ import annotations

import io
import json
import re
import unicodedata

from gfxbpf.client import mapdata as md
from gfxbpf.client.cli import display as d
from gfxbpf.client.printable import json_printable, printable
from gfxbpf.client.profiles.flamegraph import flamegraph_svg
from gfxbpf.client.profiles.model import Profile
from gfxbpf.client.profiles.top import format_top

TITLE = "\x1b]0;PWNED\x07"  # OSC 0: sets the terminal's title
CLIP = "\x1b]52;c;SGk=\x07"  # OSC 52: writes the clipboard
FORMAT = ("Cf", "Zl", "Zp")
C1 = "\x9b31mX\x7f\x9d"  # CSI and OSC as C1 characters (UTF-8 terminals may act on them), DEL
BIDI = "\u202ehs.nigol"  # shows as "login.sh" (issue 35 item 9)
# Anything a terminal acts on (C0, DEL, C1) or that hides or reorders text:
# bidi controls, zero-width characters, soft hyphen, BOM, tags, separators.
RAW = re.compile(
    "[\x00-\x1f\x7f-\x9f\xad\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\U000e0001-\U000e007f]"
)


def test_printable_escapes_every_control_and_keeps_the_rest() -> None:
    assert printable(TITLE) == "\\x1b]0;PWNED\\x07"
    assert printable(C1) == "\\x9b31mX\\x7f\\x9d"
    assert printable("\t\n\r\x00") == "\\x09\\x0a\\x0d\\x00"
    every = "".join(chr(c) for c in range(0x200))
    out = printable(every)
    assert not RAW.search(out)
    assert printable(out) == out  # idempotent: escaping twice changes nothing
    for plain in ("bash", "my prog", "ünïcødé ✓", "a\\b", "\u00a0\u00ff", "", "日本 עברית"):
        assert printable(plain) == plain


def test_printable_escapes_bidi_and_other_format_characters() -> None:
    assert printable(BIDI) == "\\u202ehs.nigol"
    assert printable("a\u200bb\u2066c\ufeff\u00ad\U000e0041\u2028") == (
        "a\\u200bb\\u2066c\\ufeff\\xad\\U000e0041\\u2028"
    )
    # Every format character (Cf) of this Python's Unicode database, and the separators.
    every = "".join(chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) in FORMAT)
    assert len(every) > 150
    out = printable(every)
    assert all(unicodedata.category(ch) not in FORMAT for ch in out)
    assert not RAW.search(out)
    assert printable(out) == out
    doc = {"comm": every + BIDI}
    text = json_printable(json.dumps(doc, ensure_ascii=False, indent=1))
    assert all(unicodedata.category(ch) not in FORMAT for ch in text)
    assert json.loads(text) == doc


def test_json_printable_is_the_same_document() -> None:
    doc = {"comm": TITLE + C1, "k": [CLIP]}
    text = json_printable(json.dumps(doc, ensure_ascii=False))
    assert not RAW.search(text)
    assert json.loads(text) == doc  # exact
    assert "\\u009b" in text and "\\u001b" in text


def test_json_printable_ascii_documents() -> None:
    """All-ASCII JSON skips the regex, yet DEL (ASCII, a control) is still escaped."""
    plain = json.dumps({"comm": "bash", "n": [1, 2]})
    assert json_printable(plain) is plain
    text = json_printable(json.dumps({"comm": "a\x7fb"}, ensure_ascii=False))
    assert text == '{"comm": "a\\u007fb"}'
    assert json.loads(text) == {"comm": "a\x7fb"}


def test_map_keys_values_and_events_are_escaped_where_formatted() -> None:
    assert d.format_key({"comm": TITLE}) == "\\x1b]0;PWNED\\x07"
    assert d.format_plain({"a": [CLIP, b"\x1b"]}) == "{a: [\\x1b]52;c;SGk=\\x07, 1b]}"
    data = md.MapData("counts", entries=[({"comm": TITLE}, 5), ({"comm": C1}, 3)])
    for lines in (
        d.render_map(data),
        d.render_map(md.MapData("t", show="table", entries=[({"c": TITLE}, {"n": 1, "s": C1})])),
        d.histogram_lines(md.MapData("h", entries=[({"comm": TITLE, "slot": 3}, 2)])),
    ):
        text = "".join(lines)
        assert not RAW.search(text), text
        assert "\\x1b]0;PWNED\\x07" in text or "\\x9b31mX" in text
    line = d.format_event({"pid": 1, "comm": TITLE, "filename": "/tmp/a b" + CLIP})
    assert not RAW.search(line)
    assert line == 'pid=1 comm=\\x1b]0;PWNED\\x07 filename="/tmp/a b\\x1b]52;c;SGk=\\x07"'


def test_json_output_stays_exact() -> None:
    rows = d.entries_json(md.MapData("counts", entries=[({"comm": TITLE + C1}, 5)]))
    text = d.json_line({"maps": {"counts": rows}})
    assert not RAW.search(text)
    assert json.loads(text)["maps"]["counts"][0]["key"] == {"comm": TITLE + C1}
    assert "label" not in rows[0]  # no display label made of the escaped text


def test_screen_writes_only_its_own_sequences() -> None:
    out = io.StringIO()
    screen = d.Screen(out)
    screen.draw(["head", "row " + TITLE + C1])
    text = out.getvalue()
    # Its own CSI sequences ("\x1b[" ...) only: no OSC, no BEL, no C1.
    assert "\x1b]" not in text and "\x07" not in text
    assert not re.search("[\x7f-\x9f]", text)
    assert "row \\x1b]0;PWNED\\x07" in text


def test_profile_names_are_escaped_in_the_table_and_the_flame_graph() -> None:
    p = Profile(stacks={(TITLE, "f" + C1): 3, ("prog", CLIP): 1, (BIDI, "g"): 1}, unit="samples")
    top = format_top(p, 10)
    assert not RAW.search(top.replace("\n", "")), top
    assert "f\\x9b31mX\\x7f\\x9d" in top
    p.notes.append("frames in /tmp/" + TITLE + " are named by file offset only")
    svg = flamegraph_svg(p)
    body = svg.split("<script>")[0]  # the script's own text has newlines only
    assert not RAW.search(body.replace("\n", ""))
    assert "\\x1b]0;PWNED\\x07" in body and "\\x1b]52;c;SGk=\\x07" in body
    assert "\\u202ehs.nigol" in body


def test_non_string_member_names_do_not_break_formatting() -> None:
    assert d.format_plain({1: "a\x1b"}) == "{1: a\\x1b}"
    assert d.format_key({1: 2, "b": "\x07"}) == "1=2, b=\\x07"
    assert d.format_event({2: "x"}) == "2=x"
