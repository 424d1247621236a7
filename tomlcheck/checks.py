"""The one toolkit that checks a TOML file: the catalog, the policy and the
exporter's configuration all read through it.

A check that fails records a problem and the reading goes on, so the
author of a file sees every problem at once, each naming the file, the
entry and the field:

    policy.toml: [[program]] #2 "syscount": field 'scope': unknown scope "all" ...

Each file's reader names its own error class (a FileProblems subclass) and
turns a checked table into its own data classes; this module knows no file.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import tomllib
from collections.abc import Iterable
from typing import Any


class FileProblems(ValueError):
    """A file that cannot be read, is not TOML, or fails its checks.
    .problems lists every problem found, each a line that names the file."""

    def __init__(self, source: str, problems: Iterable[str]) -> None:
        self.source = source
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def read_text(path: str | os.PathLike[str], error: type[FileProblems], what: str) -> str:
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise error(p, [f"{p}: cannot read the {what}: {e.strerror or e}"]) from e
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(p, [f"{p}: not UTF-8 text (byte {e.start})"]) from e


def parse_toml(text: str, source: str, error: type[FileProblems]) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise error(source, [f"{source}: TOML syntax error: {e}"]) from e


def toml_type(value: Any) -> str:
    """The TOML name of a decoded value's type, for messages."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return "date/time"
    return type(value).__name__


def show(value: Any) -> str:
    """A value as it would be written in TOML (near enough), for messages."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(show(v) for v in value) + "]"
    return str(value)


def shown(value: Any) -> str:
    """A value with its TOML type, for "expected X, got ..." messages."""
    return f"{toml_type(value)} {show(value)}"


def is_integer(value: Any) -> bool:
    """An integer that is not a boolean (TOML keeps the two apart; Python does not)."""
    return isinstance(value, int) and not isinstance(value, bool)


class Problems:
    """Every problem found in one file, each naming the file, the entry and the field."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines: list[str] = []

    def add(self, where: str, fld: str | None, message: str) -> None:
        loc = f"{self.source}: {where}"
        if fld is not None:
            loc += f": field {fld!r}"
        self.lines.append(f"{loc}: {message}")

    def entry(self, where: str) -> Entry:
        return Entry(self, where)

    def __len__(self) -> int:
        return len(self.lines)

    def raise_if_any(self, error: type[FileProblems]) -> None:
        if self.lines:
            raise error(self.source, self.lines)


class Entry:
    """The checks of one entry (a table) of a file. Each check that fails
    records a problem and returns None (or the default), so the caller goes
    on; `ok` says whether this entry recorded none."""

    def __init__(self, problems: Problems, where: str) -> None:
        self.problems = problems
        self.where = where
        self._start = len(problems)

    @property
    def ok(self) -> bool:
        return len(self.problems) == self._start

    def add(self, fld: str | None, message: str) -> None:
        self.problems.add(self.where, fld, message)

    def unknown_keys(self, table: dict[str, Any], known: Iterable[str]) -> None:
        names = tuple(known)
        for key in table:
            if key not in names:
                self.add(key, f"unknown key (known: {', '.join(names)})")

    def present(self, table: dict[str, Any], key: str, required: bool, why: str = "") -> bool:
        """Whether key is in table; a missing required key is a problem (why says what it is)."""
        if key in table:
            return True
        if required:
            self.add(key, f"missing ({why})" if why else "missing")
        return False

    def string(
        self, table: dict[str, Any], key: str, required: bool = False, why: str = ""
    ) -> str | None:
        """A non-empty string."""
        if not self.present(table, key, required, why):
            return None
        value = table[key]
        if not isinstance(value, str) or not value.strip():
            self.add(key, f"expected a non-empty string, got {shown(value)}")
            return None
        return value

    def matching(
        self,
        table: dict[str, Any],
        key: str,
        pattern: re.Pattern[str],
        expected: str,
        required: bool = False,
    ) -> str | None:
        """A string that matches pattern (expected says what it looks like)."""
        if not self.present(table, key, required):
            return None
        value = table[key]
        if not isinstance(value, str) or not pattern.match(value):
            self.add(key, f"expected {expected}, got {shown(value)}")
            return None
        return value

    def choice(
        self, table: dict[str, Any], key: str, choices: Iterable[str], required: bool = False
    ) -> str | None:
        """One string of choices."""
        names = tuple(choices)
        value = self.string(table, key, required)
        if value is not None and value not in names:
            self.add(key, f"{show(value)} is not one of {', '.join(names)}")
            return None
        return value

    def boolean(self, table: dict[str, Any], key: str, default: bool | None) -> bool | None:
        """true or false; a missing key is default, or a problem when default is None."""
        if not self.present(table, key, default is None):
            return default
        value = table[key]
        if not isinstance(value, bool):
            self.add(key, f"expected true or false, got {shown(value)}")
            return default
        return value

    def integer(
        self, table: dict[str, Any], key: str, low: int, high: int | None, expected: str = ""
    ) -> int | None:
        """An integer in low..high (high None: no bound; expected says what it
        counts, for the message); None if absent."""
        if key not in table:
            return None
        value = table[key]
        if is_integer(value) and low <= value and (high is None or value <= high):
            return int(value)
        what = expected or "an integer"
        if high is not None:
            what += f", {low} to {high}"
        self.add(key, f"expected {what}, got {shown(value)}")
        return None

    def strings(self, table: dict[str, Any], key: str) -> tuple[str, ...] | None:
        """An array of non-empty strings; () if absent, None if wrong."""
        if key not in table:
            return ()
        value = table[key]
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            self.add(key, f"expected an array of non-empty strings, got {shown(value)}")
            return None
        return tuple(value)

    def tables(
        self, table: dict[str, Any], key: str, header: str
    ) -> list[tuple[int, dict[str, Any]]]:
        """An array of tables written [[header]], each with its number in the
        file (from 1); anything else in its place is a problem."""
        value = table.get(key, [])
        if not isinstance(value, list):
            self.add(key, f"write each as a [[{header}]] table, got {toml_type(value)}")
            return []
        out = []
        for i, item in enumerate(value, start=1):
            if isinstance(item, dict):
                out.append((i, item))
            else:
                self.problems.add(
                    f"[[{header}]] #{i}", None, f"expected a table, got {toml_type(item)}"
                )
        return out

    def table(self, table: dict[str, Any], key: str) -> dict[str, Any] | None:
        """A table [key]; None if absent or not a table (a problem)."""
        if key not in table:
            return None
        value = table[key]
        if not isinstance(value, dict):
            self.add(key, f"expected a table [{key}], got {toml_type(value)}")
            return None
        return value
