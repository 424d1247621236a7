"""linetable.line_for against the interpreters' own line numbers.

- The running interpreter (the host's, whatever release): every code object
  of the tools/python_linetables.py sample and of a few stdlib modules is
  compiled here, and every code unit's line must be what co_positions()
  (3.11+) or co_lines() (3.10) says: CPython's C reading of the same table.
- Every other release: tables recorded by running that release
  (tests/data/python_linetables.json, which says which interpreter), with
  the lines that interpreter gave for each code unit.
- A table cut short (the walker copies a bounded prefix) gives the right
  line or None, never a wrong one.
"""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import CodeType

import pytest

from gfxbpf.client.profiles.python.linetable import NOT_STARTED, line_for

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import python_linetables  # noqa: E402

RECORDED = json.loads((ROOT / "tests/data/python_linetables.json").read_text())["tables"]
HOST = (sys.version_info[0], sys.version_info[1])


def _codes(code: CodeType) -> Iterator[CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _codes(const)


def _host_codes() -> Iterator[CodeType]:
    yield from _codes(compile(python_linetables.SAMPLE, "sample.py", "exec"))
    for module in (json.decoder, inspect, pytest):
        source = inspect.getsource(module)
        yield from _codes(compile(source, module.__name__, "exec"))


def _instr(version: tuple[int, int], unit: int) -> int:
    return unit * 2 if version <= (3, 9) else unit  # 3.9's f_lasti counts bytes


def test_host_tables_give_the_interpreters_lines() -> None:
    checked = 0
    for code in _host_codes():
        want = python_linetables._unit_lines(code)
        table = code.co_linetable if HOST >= (3, 10) else code.co_lnotab
        for unit, line in enumerate(want):
            got = line_for(HOST, table, code.co_firstlineno, _instr(HOST, unit))
            assert got == line, (code.co_qualname, unit)
            checked += 1
    assert checked > 10_000


@pytest.mark.parametrize("rec", RECORDED, ids=lambda r: ".".join(map(str, r["version"])))
def test_recorded_tables_give_the_recording_interpreters_lines(rec: dict) -> None:
    version = (rec["version"][0], rec["version"][1])
    for code in rec["codes"]:
        table = bytes.fromhex(code["table"])
        got = [
            line_for(version, table, code["firstlineno"], _instr(version, unit))
            for unit in range(len(code["lines"]))
        ]
        assert got == code["lines"], (rec["interpreter"], code["qualname"])


def test_every_release_is_recorded() -> None:
    assert {(r["version"][0], r["version"][1]) for r in RECORDED} == {(3, v) for v in range(9, 16)}


@pytest.mark.parametrize("rec", RECORDED, ids=lambda r: ".".join(map(str, r["version"])))
def test_a_cut_table_gives_the_line_or_none(rec: dict) -> None:
    version = (rec["version"][0], rec["version"][1])
    code = max(rec["codes"], key=lambda c: len(c["table"]))
    table = bytes.fromhex(code["table"])
    answered = 0
    for cut in range(len(table)):
        for unit, line in enumerate(code["lines"]):
            got = line_for(version, table[:cut], code["firstlineno"], _instr(version, unit), False)
            assert got in (None, line)
            answered += got is not None
    assert answered > 0


def test_a_frame_that_has_not_started_is_at_its_first_line() -> None:
    for version in ((3, 9), (3, 10), (3, 11), (3, 14)):
        assert line_for(version, b"", 42, NOT_STARTED) == 42
        assert line_for(version, b"", 42, -1) == 42


def test_an_instruction_past_the_table_has_no_line() -> None:
    rec = next(r for r in RECORDED if r["version"][:2] == [3, 12])
    code = rec["codes"][1]
    table = bytes.fromhex(code["table"])
    assert line_for((3, 12), table, code["firstlineno"], len(code["lines"])) is None
