"""gfxclient profile's text report (issue 33 item 1): real lines for every kind
of profile, with other users' strings (process, function and file names)
escaped inside their fields, never the newlines between the rows."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from gfxbpf.client.cli import profile_cmd
from gfxbpf.client.cli.gfxclient import parse_args
from gfxbpf.client.profiles.engine.run import Run
from gfxbpf.client.profiles.engine.snapshots import Maps
from gfxbpf.client.profiles.engine.take import Taken
from gfxbpf.client.profiles.model import Profile

TITLE = "\x1b]0;PWNED\x07"  # OSC 0: retitles the terminal
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # any control but the newline

# (flags, unit, time kind) of each kind of profile
KINDS = {
    "cpu": (["--pid", "1"], "samples", None),
    "off-cpu": (["--off-cpu", "--pid", "1"], "nanoseconds", "off_cpu"),
    "wall": (["--wall", "--pid", "1"], "nanoseconds", "wall"),
    "stacks-at": (["--stacks-at", "/lib/x.so:f", "--pid", "1"], "calls", None),
}


class _NoAttachment:
    """The report reads nothing from the attachment."""

    program = "none"


def _report(kind: str, output: Path | None) -> str:
    flags, unit, time_kind = KINDS[kind]
    argv = ["profile", *flags, *(["-o", str(output)] if output else [])]
    args = parse_args(argv)
    req = profile_cmd.parse_request(args)
    r = Run(req, _NoAttachment(), Maps(None), None)  # type: ignore[arg-type]
    r.ended = r.started + 2.0
    r.seen = [(10, "evil\nname" + TITLE, 3_000_000_000), (11, "sh", 5)]
    r.python_summary = {
        "processes_walked": [10],
        "interpreters": [{"path": "/tmp/py\nthon" + TITLE, "version": "3.12"}],
    }
    stacks = {
        ("evil\nname" + TITLE, "main", "work\n" + TITLE): 3_000_000_000,
        ("sh", "main", "spin"): 5,
    }
    prof = Profile(stacks=stacks, unit=unit, time_kind=time_kind, notes=["one\nnote" + TITLE])
    out = io.StringIO()
    profile_cmd._output(args, out, req, Taken(prof, r, lost=0, read_s=0.0, empty=False))
    return out.getvalue()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_report_is_lines_with_each_field_escaped(kind: str, tmp_path: Path) -> None:
    output = tmp_path / ("x" + TITLE + ".folded")
    text = _report(kind, output)
    assert output.exists()
    lines = text.splitlines()
    assert text.endswith("\n")
    assert lines[0].split()[0] == "SELF"  # the top table's head: the first line
    assert not RAW.search(text)  # nothing a terminal acts on, but the line ends
    # Each hostile string is escaped where it stands, on its own line.
    assert any(line.endswith("work\\x0a\\x1b]0;PWNED\\x07") for line in lines)
    assert any(line.startswith("processes (2):") for line in lines)
    assert any("evil\\x0aname\\x1b]0;PWNED\\x07" in line for line in lines)
    assert "note: one\\x0anote\\x1b]0;PWNED\\x07" in lines
    assert any(line.startswith("python: 1 process(es) walked") for line in lines)
    assert any("/tmp/py\\x0athon\\x1b]0;PWNED\\x07 (3.12)" in line for line in lines)
    assert lines[-1].startswith("wrote ") and lines[-1].endswith(".folded (folded)")
    assert "x\\x1b]0;PWNED\\x07.folded" in lines[-1]
    # The table's head and 3 functions, the processes' 2 heads and 2 rows, the
    # total, python, the note and the file: one line each, nothing joined.
    assert len(lines) == 4 + 4 + 4


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_without_a_file_the_report_says_how_to_write_one(kind: str) -> None:
    lines = _report(kind, None).splitlines()
    assert lines[-1].startswith("write a flame graph with -o FILE.svg")
    assert lines[-2] == "note: one\\x0anote\\x1b]0;PWNED\\x07"


@pytest.mark.parametrize("kind", ["off-cpu", "wall"])
def test_time_profiles_show_processes_and_total_in_seconds_or_ms(kind: str) -> None:
    """Issue 33 item 5: the process table of a time profile was raw ns
    (311711483795); it reads as the top table does, in time."""
    flags, unit, time_kind = KINDS[kind]
    args = parse_args(["profile", *flags])
    req = profile_cmd.parse_request(args)
    r = Run(req, _NoAttachment(), Maps(None), None)  # type: ignore[arg-type]
    r.ended = r.started + 2.0
    r.seen = [(10, "app", 311_711_483_795), (11, "sh", 2_500_000)]
    stacks = {("app", "main", "[wait: futex]"): 311_711_483_795, ("sh", "[preempted]"): 2_500_000}
    prof = Profile(stacks=stacks, unit=unit, time_kind=time_kind)
    out = io.StringIO()
    profile_cmd._output(args, out, req, Taken(prof, r, lost=0, read_s=0.0, empty=False))
    text = out.getvalue()
    what = "off the CPU" if kind == "off-cpu" else "of wall-clock time"
    lines = text.splitlines()
    assert f"  {'pid':>8}  {'command':<16} {what}" in lines
    assert any(line.split() == ["10", "app", "311.711", "s"] for line in lines), text
    assert any(line.split() == ["11", "sh", "2.500", "ms"] for line in lines), text
    assert f"311.714 s {what} in 2 stacks over 2.0 s" in lines
    assert "311711483795" not in text and "2500000" not in text


def test_cpu_profiles_keep_counting_samples() -> None:
    text = _report("cpu", None)
    assert "3000000005 samples in 2 stacks" in text  # a count, not a time
