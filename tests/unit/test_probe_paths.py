"""ustackcopy rows whose copies unwound to different call sites of the same
functions (CPython 3.13's evaluation loop calls a C function from the generic
and the specialized instruction) are one path as a profile shows it; rows
whose copies ran through different functions keep the merged marker."""

from __future__ import annotations

from typing import Any

from gfxbpf.client.profiles.copies import MERGED, ProbeCopyReader

# Return addresses -> (file, function start): 0x1010/0x1020 are two call sites
# of one function ("eval"), 0x3010 another function ("other").
FUNCTIONS = {0x100F: ("py", 0x1000), 0x101F: ("py", 0x1000), 0x300F: ("py", 0x3000)}


class Tables:
    def function_at(self, maps: Any, pc: int) -> tuple[str, int] | None:
        return FUNCTIONS.get(pc)


def reader() -> ProbeCopyReader:
    return ProbeCopyReader(None, lambda tgid, refresh=False: object(), Tables())  # type: ignore[arg-type]


def test_paths_through_the_same_functions_are_one_path() -> None:
    r = reader()
    row = (7, 0, 0x500, 1, 1)
    r.paths[row] = {((0x500, 0x1010, 0x2000), None), ((0x500, 0x1020, 0x2000), None)}
    path, stop = r._path(row)
    assert path in ((0x500, 0x1010, 0x2000), (0x500, 0x1020, 0x2000)) and stop is None


def test_paths_through_other_functions_keep_the_marker() -> None:
    r = reader()
    row = (7, 0, 0x500, 1, 1)
    r.paths[row] = {((0x500, 0x1010, 0x2000), None), ((0x500, 0x3010, 0x2000), None)}
    assert r._path(row) == ((0x500,), MERGED)


def test_a_row_whose_copy_was_lost_takes_its_siblings_path() -> None:
    # Rows differ by their path hash (the last field); one sent no copy.
    r = reader()
    r._keep((7, 0, 0x500, 1, 0xA), (0x500, 0x1010, 0x2000), None, False, ())
    assert r._path((7, 0, 0x500, 1, 0xB)) == ((0x500, 0x1010, 0x2000), None)
    # Siblings that disagree: the shared frames and the marker, never one picked.
    r._keep((7, 0, 0x500, 1, 0xC), (0x500, 0x3010, 0x2000), None, False, ())
    assert r._path((7, 0, 0x500, 1, 0xB)) == ((0x500,), MERGED)
    # No sibling (another Python chain): the caller alone.
    assert r._path((7, 0, 0x500, 2, 0xB)) == ((0x500,), None)
