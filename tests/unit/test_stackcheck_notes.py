"""The profile's note on samples with no user stack says what their reasons
mean: a stack-copy profile of `-- true` said "the kernel could not record it
(its stack table was full ...)" of samples whose process exited before its
maps were read, a program with no stack table."""

from __future__ import annotations

from gfxbpf.client.profiles.model import RawStack
from gfxbpf.client.profiles.stackcheck import NO_MAPS, NOT_UNWOUND, StackCheck
from gfxbpf.client.profiles.symbolize import Symbolizer

TABLE = "stack table was full"


def note(*reasons: str) -> str:
    check = StackCheck()
    check.add_kind(("complete", "", set()), 10)
    for reason in reasons:
        check.add_lost(reason, 5)
    (line,) = [n for n in check.notes() if "has no user stack" in n]
    return line


def test_a_process_gone_before_its_maps_is_not_blamed_on_a_stack_table() -> None:
    line = note(NO_MAPS)
    assert "exited before it could read them" in line and TABLE not in line, line


def test_no_frame_unwound_says_the_address_was_in_no_code_read() -> None:
    line = note(f"{NOT_UNWOUND} (not-code)")
    assert "had just run exec" in line and TABLE not in line, line


def test_the_stack_tables_errors_keep_their_advice_and_each_meaning_is_said_once() -> None:
    assert TABLE in note("stack table full")
    line = note("stack table full", NO_MAPS, "stack table collision (another stack holds its slot)")
    assert line.count(TABLE) == 1 and line.count("exited before") == 1, line


def test_a_symbolized_profile_carries_the_meaning() -> None:
    raw = [RawStack(pid=1, user=(), kernel=True, weight=3, comm="true", user_error=NO_MAPS)]
    prof = Symbolizer().symbolize(raw, "samples")
    assert any("exited before it could read them" in n for n in prof.notes), prof.notes
    assert not any(TABLE in n for n in prof.notes), prof.notes
