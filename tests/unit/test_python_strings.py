"""strings.decode_unicode on the memory of real str objects of the running
interpreter (read with ctypes at id(s), offsets from its layout entry): ASCII,
Latin-1, UCS-2 and UCS-4 compact strings, whole and cut short, and what
the walker cannot decode."""

from __future__ import annotations

import ctypes
import struct
import sys

import pytest

from gfxbpf.catalog.python.layouts import layout_for
from gfxbpf.client.profiles.python.strings import ELLIPSIS, decode_unicode

HOST = (sys.version_info[0], sys.version_info[1])
LAYOUT = layout_for(HOST)
SAMPLES = ["plain_ascii", "", "café crème", "naïve_日本", "file_\U0001d518_😀.py", "ÿ" * 40]


def _copy(s: str, limit: int = 256) -> tuple[int, int, bytes]:
    """(state word, length, first bytes of data) as the walker copies them."""
    assert LAYOUT is not None
    head = ctypes.string_at(id(s), LAYOUT.unicode_compact_data)
    (state,) = struct.unpack_from("<I", head, LAYOUT.unicode_state)
    (length,) = struct.unpack_from("<q", head, LAYOUT.unicode_length)
    ascii_bit = state & (1 << 6)
    at = LAYOUT.unicode_ascii_data if ascii_bit else LAYOUT.unicode_compact_data
    return state, length, ctypes.string_at(id(s) + at, limit)


@pytest.mark.parametrize("text", SAMPLES)
def test_real_strings_decode(text: str) -> None:
    state, length, data = _copy(text)
    assert length == len(text)
    assert decode_unicode(HOST, state, length, data) == text


@pytest.mark.parametrize("text", SAMPLES[2:])
def test_a_cut_copy_gives_a_prefix_and_an_ellipsis(text: str) -> None:
    state, length, data = _copy(text)
    # 7 bytes: whole code points then, for 2- and 4-byte kinds, part of one
    got = decode_unicode(HOST, state, length, data[:7])
    assert got.endswith(ELLIPSIS) and text.startswith(got[: -len(ELLIPSIS)])
    assert 1 < len(got) < len(text) + 1


def test_what_the_walker_did_not_copy_is_an_ellipsis() -> None:
    state, length, data = _copy("café")
    assert decode_unicode(HOST, state & ~(1 << 5), length, data) == ELLIPSIS  # not compact
    assert decode_unicode((3, 8), state, length, data) == ELLIPSIS  # no table for 3.8
    assert decode_unicode(HOST, (state & ~0x1C) | (3 << 2), length, data) == ELLIPSIS  # kind 3
