"""The reference walk (tests/python_walk.py) on memory images laid out as each
release 3.9-3.15 lays its objects out (tests/python_image.py, from the
layout table), with the real line tables each release produced
(tests/data/python_linetables.json).

What this proves: for every release, the table has every field a walk needs
and the fields are used consistently (thread list, cframe or not, frame
links, shim frames and ENTRY marks, the 3.14+ tag bits, instruction value to
line, 1/2/4-byte and ASCII strings, truncated strings), and the decoders
agree with the walk. What it does not prove: that the numbers are CPython's;
the builder follows the same table, so a wrong offset would be wrong on
both sides. That is what test_python_layouts.py (headers, _Py_DebugOffsets)
and test_python_live_walk.py (real processes) are for.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gfxbpf.catalog.python.layouts import PyLayout, all_layouts
from gfxbpf.client.profiles.python.strings import ELLIPSIS
from tests.python_image import Builder, CodeSpec, FrameSpec
from tests.python_walk import STRING_BYTES, PyFrame, walk

ROOT = Path(__file__).resolve().parents[2]
RECORDED = json.loads((ROOT / "tests/data/python_linetables.json").read_text())["tables"]
# One recording per release: the newest patch release recorded.
BY_RELEASE = {tuple(r["version"][:2]): r for r in RECORDED}


def _specs(rec: dict, filename: str) -> list[tuple[CodeSpec, list[int | None]]]:
    return [
        (
            CodeSpec(
                c["name"],
                c["qualname"],
                filename,
                c["firstlineno"],
                bytes.fromhex(c["table"]),
                len(c["lines"]),
            ),
            c["lines"],
        )
        for c in rec["codes"]
    ]


def _instr(lay: PyLayout, unit: int) -> int:
    return unit * 2 if lay.version == (3, 9) else unit


def _frame(lay: PyLayout, spec: tuple[CodeSpec, list[int | None]], unit: int, entry: bool):
    code, lines = spec
    name = code.qualname if lay.version >= (3, 11) else code.name
    want = PyFrame(name, code.filename, lines[unit], entry or lay.version <= (3, 10))
    return FrameSpec(code, _instr(lay, unit), entry), want


def _layout_id(lay: PyLayout) -> str:
    return ".".join(map(str, lay.version)) + ("t" if lay.free_threaded else "")


# Every layout, the free-threaded ones too (their line tables are their release's).
@pytest.mark.parametrize("lay", all_layouts(), ids=_layout_id)
def test_walk_names_every_frame_of_every_thread(lay: PyLayout) -> None:
    rec = BY_RELEASE[lay.version]
    ucs4, latin1 = _specs(rec, rec["filename"]), _specs(rec, "/srv/app/café.py")
    # thread 1, leaf first: a nested function (2-byte qualname), a method, a class body
    # entered from C, the module (4-byte file name); thread 2: two frames, a Latin-1 file name
    picks1 = [(ucs4[-1], False), (ucs4[3], False), (ucs4[2], True), (ucs4[0], True)]
    picks2 = [(latin1[1], False), (latin1[0], True)]
    threads, wanted = {}, {}
    for tid, picks in ((0x7F00_1000_0700, picks1), (0x7F00_2000_0700, picks2)):
        pairs = [_frame(lay, spec, len(spec[1]) // 2, entry) for spec, entry in picks]
        threads[tid] = [p[0] for p in pairs]
        wanted[tid] = [p[1] for p in pairs]
    builder = Builder(lay)
    runtime = builder.runtime(threads)
    assert walk(lay, builder.img.read, runtime) == wanted
    assert all(w.line is not None for ws in wanted.values() for w in ws)


@pytest.mark.parametrize("lay", all_layouts(), ids=_layout_id)
def test_a_long_name_is_cut_and_a_fresh_frame_is_at_its_first_line(lay: PyLayout) -> None:
    version, rec = lay.version, BY_RELEASE[lay.version]
    code, _ = _specs(rec, "x.py")[1]
    long = CodeSpec("n" * 300, "q" * 300, "x.py", code.firstlineno, code.table, code.units)
    # A frame that has not run yet: f_lasti -1 (3.9/3.10), prev_instr one unit before
    # the code (3.11/3.12); 3.13+ frames start at unit 0, which has a line of its own.
    fresh = -1 if version <= (3, 12) else 0
    builder = Builder(lay)
    runtime = builder.runtime({1: [FrameSpec(long, fresh, True)]})
    (frame,) = walk(lay, builder.img.read, runtime)[1]
    assert frame.name == ("q" if version >= (3, 11) else "n") * STRING_BYTES + ELLIPSIS
    first_line = rec["codes"][1]["lines"][0] if version >= (3, 13) else code.firstlineno
    assert frame.line == first_line
