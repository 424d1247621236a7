"""The one TOML checking toolkit: problems collected, each naming file, entry and field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gfxbpf.tomlcheck import checks
from gfxbpf.tomlcheck.checks import FileProblems, Problems


class DemoError(FileProblems):
    pass


def test_checks_record_problems_and_go_on() -> None:
    problems = Problems("f.toml")
    at = problems.entry('[[thing]] #1 "a"')
    table = {"name": "", "n": 0, "on": "yes", "tags": ["x", 3], "colour": 1, "kind": "z"}
    at.unknown_keys(table, ("name", "n", "on", "tags", "kind"))
    assert at.string(table, "name") is None
    assert at.string(table, "missing", True, "what it is") is None
    assert at.integer(table, "n", 1, 9, "things") is None
    assert at.boolean(table, "on", False) is False
    assert at.strings(table, "tags") is None
    assert at.choice(table, "kind", ("x", "y")) is None
    assert at.matching({"id": "9"}, "id", re.compile("^[a-z]+$"), "a word") is None
    assert not at.ok
    assert problems.lines == [
        "f.toml: [[thing]] #1 \"a\": field 'colour': unknown key (known: name, n, on, tags, kind)",
        'f.toml: [[thing]] #1 "a": field \'name\': expected a non-empty string, got string ""',
        "f.toml: [[thing]] #1 \"a\": field 'missing': missing (what it is)",
        "f.toml: [[thing]] #1 \"a\": field 'n': expected things, 1 to 9, got integer 0",
        'f.toml: [[thing]] #1 "a": field \'on\': expected true or false, got string "yes"',
        "f.toml: [[thing]] #1 \"a\": field 'tags': expected an array of non-empty strings, "
        'got array ["x", 3]',
        'f.toml: [[thing]] #1 "a": field \'kind\': "z" is not one of x, y',
        'f.toml: [[thing]] #1 "a": field \'id\': expected a word, got string "9"',
    ]
    with pytest.raises(DemoError) as ei:
        problems.raise_if_any(DemoError)
    assert ei.value.problems == problems.lines and ei.value.source == "f.toml"


def test_good_values_pass_and_keep_the_entry_ok() -> None:
    at = Problems("f.toml").entry("[x]")
    table = {"s": "v", "n": 3, "b": True, "l": ["a"], "t": [{"k": 1}, {"k": 2}]}
    assert at.string(table, "s") == "v" and at.integer(table, "n", 1, None) == 3
    assert at.boolean(table, "b", None) is True and at.strings(table, "l") == ("a",)
    assert at.tables(table, "t", "t") == [(1, {"k": 1}), (2, {"k": 2})]
    assert at.integer(table, "absent", 0, 1) is None and at.strings(table, "absent") == ()
    assert at.ok


def test_tables_name_what_is_not_a_table() -> None:
    problems = Problems("f.toml")
    at = problems.entry("top level")
    assert at.tables({"p": [{"a": 1}, 2]}, "p", "p") == [(1, {"a": 1})]
    assert at.tables({"p": "x"}, "p", "p") == []
    assert problems.lines == [
        "f.toml: [[p]] #2: expected a table, got integer",
        "f.toml: top level: field 'p': write each as a [[p]] table, got string",
    ]


def test_reading_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(DemoError, match="nope.toml: cannot read the demo: No such file"):
        checks.read_text(tmp_path / "nope.toml", DemoError, "demo")
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"a = '\xff'")
    with pytest.raises(DemoError, match="bad.toml: not UTF-8 text"):
        checks.read_text(bad, DemoError, "demo")
    with pytest.raises(DemoError, match="bad.toml: TOML syntax error"):
        checks.parse_toml("a = ", "bad.toml", DemoError)
    assert checks.parse_toml("a = 1", "bad.toml", DemoError) == {"a": 1}
