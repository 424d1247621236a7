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


def test_copy_less_rows_of_one_caller_are_answered_once() -> None:
    """A PyTorch --memory profile: thousands of rows through c10::alloc_cpu
    lost their copies on a full ring and each compared its 300 siblings'
    paths function by function; gfxclient spun for over ten minutes."""
    calls = []

    class Counting(Tables):
        def function_at(self, maps: Any, pc: int) -> tuple[str, int] | None:
            calls.append(pc)
            return ("py", pc & ~0xFF)

    r = ProbeCopyReader(None, lambda tgid, refresh=False: object(), Counting())  # type: ignore[arg-type]
    for i in range(300):
        r._keep((7, 0, 0x500, 1, i), (0x500, 0x1000 + 0x100 * i, 0x2000), None, False, ())
    answers = {r._path((7, 0, 0x500, 1, 1000 + i)) for i in range(2000)}
    assert answers == {((0x500,), MERGED)}
    assert len(calls) <= 300 * 3, len(calls)  # one comparison, not one per row
    r._keep((7, 0, 0x500, 1, 5000), (0x500, 0x1000, 0x2000), None, False, ())  # no new path
    r._keep((7, 0, 0x500, 2, 1), (0x600,), None, False, ())  # a new one: answered again
    assert r._path((7, 0, 0x500, 2, 9)) == ((0x600,), None)


def test_launch_rows_fall_back_to_the_same_stack_pointer_then_to_the_chain() -> None:
    """cudakernels' rows (tgid, 0, stack pointer, chain, kernel): a kernel whose
    copy was lost takes the path of the chain's kernels launched at the same
    stack pointer (the same native path); failing those, the chain's paths,
    merged where they differ; never the stack pointer as a frame."""
    r = ProbeCopyReader(None, lambda tgid, refresh=False: object(), Tables(), by_chain=True)  # type: ignore[arg-type]
    deep, direct = (0x300F, 0x2000, 0x1010), (0x100F, 0x2000, 0x1010)
    r._keep((7, 0, 0x7F00, 1, 0xA), deep, None, False, ())
    r._keep((7, 0, 0x7F80, 1, 0xB), direct, None, False, ())
    assert r._path((7, 0, 0x7F00, 1, 0xC)) == (deep, None)
    assert r._path((7, 0, 0x7F80, 1, 0xC)) == (direct, None)
    assert r._path((7, 0, 0x7E00, 1, 0xC)) == ((), MERGED)  # no common innermost frame
    assert r._path((7, 0, 0x7E00, 2, 0xC)) == ((), None)  # a chain with no copy at all


def test_launch_rows_name_the_thread_their_path_came_from() -> None:
    """A launch stack's root is its thread's name, as in a CPU profile
    (autograd's pt_autograd_0 beside the main thread), taken from the copies
    that give the row its path; threads that disagree leave the process's."""
    r = ProbeCopyReader(None, lambda tgid, refresh=False: object(), Tables(), by_chain=True)  # type: ignore[arg-type]
    path = (0x100F, 0x2000)
    r._keep((7, 0, 0x7F00, 0, 0xA), path, None, False, (), (9, "pt_autograd_0"))
    r._keep((7, 0, 0x7F80, 1, 0xA), path, None, False, (), (7, "python3"))
    r._keep((7, 0, 0x7F80, 1, 0xA), path, None, False, (), (8, "python3"))
    assert r._thread((7, 0, 0x7F00, 0, 0xA)) == ("pt_autograd_0", 9)
    assert r._thread((7, 0, 0x7F00, 0, 0xB)) == ("pt_autograd_0", 9)  # its copy lost
    assert r._thread((7, 0, 0x7F80, 1, 0xA)) == ("python3", 0)  # one name, two threads
    r._keep((7, 0, 0x7F00, 0, 0xC), path, None, False, (), (10, "pt_autograd_1"))
    assert r._thread((7, 0, 0x7F00, 0, 0xB)) == ("", 0)  # siblings from two threads
    stack = r.chain_stack(7, 0, 0xA, 0x7F00, "gemm", 5)
    assert (stack.comm, stack.tid) == ("pt_autograd_0", 9)


def test_a_copy_from_a_library_the_maps_never_showed_still_names_its_row() -> None:
    # --stacks-at a library the process loaded, called and left between two
    # snapshots of its maps, read after it exited (CI: ctypes.CDLL, 4000 calls,
    # exit): the copy is walked from the caller on top of the stack, by the
    # caller's CFI; the probed function's own mapping is never needed.
    from gfxbpf.client.profiles import copies
    from gfxbpf.client.profiles.python import records as py
    from tests.event_stream import Records
    from tests.unit.test_unwind_walk import LIB, MID, ROOT, SP, FakeTables, maps, stack

    unmapped = 0x90_0000  # the probed function: in no mapping of the snapshot
    ra_mid, ra_root = LIB + MID + 0x10, LIB + ROOT + 0x10
    data = stack({0: ra_mid, 8 + 24: ra_root}, 0x100)  # mid's frame: CFA sp + 32
    rec = copies.HEADER.pack(4242, 4242, 0, len(data), unmapped, SP, 0, 1, 0x99, 0, 0, b"app")
    snapshot = maps()
    reader = copies.ProbeCopyReader(
        Records([rec + data]), lambda pid, refresh: snapshot, FakeTables()
    )  # type: ignore[arg-type]
    reader.drain()
    key = copies.CALL_KEY.pack(4242, 0, ra_mid, py.chain_hash(()), 0x99, 1)
    stacks, uncopied = reader.raw_stacks([(key, copies.CALL_STATS.pack(5, 0))], ["fn"], "calls")
    assert uncopied == 0 and stacks[0].user == (ra_mid, ra_root)
    assert stacks[0].unwind_stop is None and stacks[0].weight == 5
