"""The stack scan past code without CFI (client/profiles/unwind/scan.py) on
real stacks: a gcc -O2 chain main -> a -> b -> c whose leaf is assembly with
no CFI that pushes callee-saved registers and keeps data in rbp, sampled by
bench/unwind_samples.py (SIGPROF: registers and an 8 KiB stack copy, as the
BPF program takes them). The scan must recover the chain and never take a
frame that is not on it, also when the leaf's stack holds stale return
addresses of functions that are not."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from bench.unwind_samples import Capture, sample_run
from gfxbpf.client.profiles.elfsyms import function_ranges
from gfxbpf.client.profiles.model import RawStack
from gfxbpf.client.profiles.procmaps import ProcessMaps
from gfxbpf.client.profiles.symbolize import Symbolizer
from gfxbpf.client.profiles.unwind import (
    Stop,
    UnwindResult,
    UnwindTables,
    UserRegs,
    marker_frame,
    scan,
    unwind,
    walk,
)
from gfxbpf.client.profiles.unwind.scan import SCAN_BYTES, is_indirect_call
from tests.conftest import skip_or_fail
from tests.event_stream import Records
from tests.unit.test_unwind_walk import HEAP, LEAF, LIB, MID, NOCFI, SP, FakeTables
from tests.unit.test_unwind_walk import ROOT as ROOT_FDE
from tests.unit.test_unwind_walk import maps as fake_maps
from tests.unit.test_unwind_walk import stack as fake_stack

# The leaf: no .cfi directives, rbx/r12/rbp pushed, rbp a data register, and
# (STALE bytes) a local area it never writes: whatever earlier calls left there stays.
LEAF_S = """
    .text
    .globl leaf
    .type leaf, @function
leaf:
    push %rbp
    push %rbx
    push %r12
    sub $STALE, %rsp
    mov %rdi, %rcx
    mov $12345, %eax
    movabs $0x9e3779b97f4a7c15, %rbp
1:  imul %rbp, %rax
    add %rcx, %rax
    xor %rax, %rbp
    or $1, %rbp
    mov %rax, %rbx
    mov %rbp, %r12
    dec %rcx
    jnz 1b
    add $STALE, %rsp
    pop %r12
    pop %rbx
    pop %rbp
    ret
    .size leaf, .-leaf
    .section .note.GNU-stack,"",@progbits
"""
CHAIN_C = r"""
#include <stdlib.h>
#define STEP __attribute__((noinline)) unsigned long
static volatile unsigned long sink;
unsigned long leaf(unsigned long n);
/* Not on the sampled chain: a deep recursion that leaves its return
   addresses in the stack below main, where the leaf's local area lies later. */
STEP stale(unsigned long n) { unsigned long r = n ? stale(n - 1) : 1; sink += r; return r * 3; }
#ifdef INDIRECT  /* the leaf called through a pointer: call *%rax, not E8 */
static unsigned long (*volatile leaf_at)(unsigned long) = leaf;
#define LEAF leaf_at
#else
#define LEAF leaf
#endif
STEP c(unsigned long n) { unsigned long r = LEAF(n); sink += r; return r ^ 4; }
STEP b(unsigned long n) { unsigned long r = c(n) + 7; sink += r; return r; }
STEP a(unsigned long n) { unsigned long r = b(n) - 1; sink += r; return r; }
int main(int argc, char **argv) {
    unsigned long n = strtoul(argv[1], 0, 10);
    for (int i = 0; i < 20; i++) { if (argc > 2) sink += stale(64); sink += a(n / 20); }
    return 0;
}
"""
CHAIN = ("leaf", "c", "b", "a", "main")  # innermost first
ROOT = {"__libc_start_main", "__libc_start_main_impl", "__libc_start_call_main", "_start"}
ROUNDS = "300000000"


@pytest.fixture(autouse=True)
def _tools() -> None:
    if shutil.which("gcc") is None:
        skip_or_fail("gcc is missing (apt-get install gcc)")


def _run(
    folder: Path, stale_bytes: int, indirect: bool = False, stale: bool = True
) -> tuple[Capture, list[UnwindResult]]:
    """Build and sample the chain; stale: run stale() before each round."""
    src_s, src_c = folder / "leaf.s", folder / "chain.c"
    src_s.write_text(LEAF_S.replace("STALE", str(stale_bytes)))
    src_c.write_text(CHAIN_C)
    prog = folder / f"scan-{stale_bytes}"
    flags = ["-O2", "-fomit-frame-pointer"] + (["-DINDIRECT"] if indirect else [])
    subprocess.run(["gcc", *flags, "-o", prog, src_c, src_s], check=True)
    cap = sample_run([str(prog), ROUNDS, *(["stale"] if stale else [])], folder)
    assert cap.returncode == 0
    tables = UnwindTables(cache_dir=str(folder / "cache"))
    return cap, [unwind(s.regs, s.stack, cap.maps, tables) for s in cap.samples]


def _stale_words(cap: Capture, prog: Path) -> int:
    """Samples in the leaf whose copied stack holds, below the leaf's return
    address, a return address into stale() (which is never on the chain)."""
    ranges = {name: (at, at + size) for at, size, name in function_ranges(str(prog))}
    m = next(m for m in cap.maps.mappings if m.executable and m.path == str(prog))
    load = m.start - m.offset  # a PIE's load bias (its text segment maps at offset == vaddr)
    lo, hi = (load + x for x in ranges["stale"])
    leaf_lo, leaf_hi = (load + x for x in ranges["leaf"])
    count = 0
    for s in cap.samples:
        if leaf_lo <= s.regs.ip < leaf_hi:
            words = struct.unpack_from(f"<{SCAN_BYTES // 8}Q", s.stack)
            count += any(lo < w <= hi for w in words)
    return count


def _named(cap: Capture, results: list[UnwindResult], folder: Path) -> list[tuple[str, ...]]:
    """Each sample's frame names, innermost first (a marker frame last)."""
    sym = Symbolizer(cache_dir=str(folder / "sym"))
    sym.add_process(cap.maps.pid, cap.maps)
    out = []
    for r in results:
        raw = RawStack(cap.maps.pid, r.frames, False, 1, comm="t", unwind_stop=r.stop)
        (stack,) = sym.symbolize([raw], "samples").stacks
        out.append(tuple(reversed(stack[1:])))  # without the process frame
    return out


@pytest.mark.parametrize(
    ("stale_bytes", "indirect"),
    [(8, False), (256, False), (8, True)],
    ids=["direct", "direct-stale-area", "through-pointer"],
)
def test_scan_recovers_the_chain_under_a_leaf_without_cfi(
    tmp_path: Path, stale_bytes: int, indirect: bool
) -> None:
    # Through a pointer the call is taken only as the window's first return
    # address: there stale() does not run (see the test below for when it does).
    cap, results = _run(tmp_path, stale_bytes, indirect, stale=not indirect)
    named = _named(cap, results, tmp_path)
    in_leaf = [(n, r) for n, r in zip(named, results, strict=True) if n and n[0] == "leaf"]
    assert len(in_leaf) >= 50, f"only {len(in_leaf)} samples in the leaf"
    whole = 0
    for names, r in in_leaf:
        # Never a frame off the chain: not the stale recursion, nothing made up.
        assert set(names) <= {*CHAIN, *ROOT, marker_frame("no-cfi")}, names
        if r.stop is None and names[:5] == CHAIN and names[-1] == "_start":
            assert r.scanned == 1
            whole += 1
    assert whole >= 0.9 * len(in_leaf), (whole, len(in_leaf))
    if stale_bytes > 8:  # the trap was set: stale return addresses lay in the window
        assert _stale_words(cap, tmp_path / f"scan-{stale_bytes}") >= 0.9 * len(in_leaf)


@pytest.mark.parametrize(
    "indirect", [False, True], ids=["real-call-unrecognised", "through-pointer"]
)
def test_stale_return_addresses_are_never_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, indirect: bool
) -> None:
    """The leaf's window holds stale calls of stale() to itself below the
    real return address. When that one is not a direct call into the leaf
    (the leaf called through a pointer, or, by a patch, its direct call not
    recognised) it is not taken past them, and they are refused (stale() is
    not the code the frame runs): the stacks keep their marker rather than
    gain stale() frames or lose the ones between."""
    if not indirect:
        monkeypatch.setattr(scan, "_same_function", lambda *args: False)
    cap, results = _run(tmp_path, 256, indirect)
    named = _named(cap, results, tmp_path)
    in_leaf = [(n, r) for n, r in zip(named, results, strict=True) if n and n[0] == "leaf"]
    assert len(in_leaf) >= 50
    assert _stale_words(cap, tmp_path / "scan-256") >= 0.9 * len(in_leaf)
    for names, r in in_leaf:
        assert "stale" not in names, names
        assert r.stop is Stop.NO_CFI and r.scanned == 0, (names, r)


def test_the_summary_counts_stacks_recovered_by_the_scan(tmp_path: Path) -> None:
    cap, results = _run(tmp_path, 8)
    sym = Symbolizer(cache_dir=str(tmp_path / "sym"))
    sym.add_process(cap.maps.pid, cap.maps)
    raws = [
        RawStack(
            cap.maps.pid, r.frames, False, 1, "t", unwind_stop=r.stop, unwind_scanned=r.scanned > 0
        )
        for r in results
    ]
    share = 100 * sum(r.scanned > 0 for r in results) / len(results)
    assert share >= 50
    notes = sym.symbolize(raws, "samples").notes
    assert f"{share:.1f}% of the user stacks were recovered by a stack scan" in " ".join(notes)


def test_without_the_scan_the_leaf_stops_the_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The baseline: the same program unwound without the scan stops at the
    leaf (no CFI, rbp holds data), with the marker and no caller."""
    monkeypatch.setattr(walk, "scan_caller", lambda *args: None)
    cap, results = _run(tmp_path, 8)
    named = _named(cap, results, tmp_path)
    in_leaf = [(n, r) for n, r in zip(named, results, strict=True) if n and n[0] == "leaf"]
    assert len(in_leaf) >= 50
    for names, r in in_leaf:
        assert r.stop is Stop.NO_CFI and r.scanned == 0
        assert names == ("leaf", marker_frame(Stop.NO_CFI)), names


@pytest.mark.parametrize(
    "code",
    [
        "ffd0",  # call *%rax
        "41ffd3",  # call *%r11
        "ff5008",  # call *0x8(%rax)
        "ff1424",  # call *(%rsp)
        "ff542408",  # call *0x8(%rsp)
        "ff1501020304",  # call *disp32(%rip)
        "ff9001020304",  # call *disp32(%rax)
        "ff942401020304",  # call *disp32(%rsp)
        "41ff9701020304",  # call *disp32(%r15)
    ],
)
def test_indirect_call_forms(code: str) -> None:
    assert is_indirect_call(bytes.fromhex(code))


@pytest.mark.parametrize("code", ["ffe0", "ff20", "ff5008ff", "ffd000", "e801020304", "90ffd0", ""])
def test_not_indirect_calls(code: str) -> None:
    assert not is_indirect_call(bytes.fromhex(code))


class _CodeTables(FakeTables):
    """The fake library, with the code bytes before chosen return addresses
    (everything else reads as nops)."""

    def __init__(self, code: dict[int, bytes]) -> None:
        super().__init__()
        self.code = code

    def code_before(self, maps: ProcessMaps, addr: int, n: int) -> bytes | None:
        return self.code.get(addr, b"\x90" * n)[-n:]


def _direct_call(target: int, ra: int) -> bytes:
    return b"\x90\x90\xe8" + struct.pack("<i", target - ra)


def _scan_walk(words: dict[int, int], code: dict[int, bytes]) -> UnwindResult:
    """A sample in the fake library's code without CFI (NOCFI), rbp data."""
    regs = UserRegs(LIB + NOCFI + 0x10, SP, 0x1234)
    return unwind(regs, fake_stack(words), fake_maps(), _CodeTables(code))


RA_ROOT = LIB + ROOT_FDE + 0x10  # the thread's root: its CFI ends the walk there
RA_MID = LIB + MID + 0x10  # mid's CFI: CFA = sp + 32 (it pushed rbx, took 16 bytes)


def test_a_direct_call_into_the_frame_is_taken_past_other_words() -> None:
    # Data, a code address with no call before it, then the real return address.
    words = {0: HEAP + 8, 8: LIB + LEAF + 4, 0x18: RA_ROOT}
    got = _scan_walk(words, {RA_ROOT: _direct_call(LIB + NOCFI, RA_ROOT)})
    assert got == UnwindResult((LIB + NOCFI + 0x10, RA_ROOT), None, scanned=1)


def test_words_that_are_not_checked_return_addresses_are_not_taken() -> None:
    for code in (
        {},  # no call before it
        {RA_ROOT: _direct_call(LIB + MID, RA_ROOT)},  # a direct call to another function
        {RA_ROOT: _direct_call(HEAP, RA_ROOT)},  # a "call" to data
    ):
        got = _scan_walk({0x18: RA_ROOT}, code)
        assert got == UnwindResult((LIB + NOCFI + 0x10,), Stop.NO_CFI), code
    # A call before it, but no FDE covers it (the caller has no CFI either).
    got = _scan_walk({0: LIB + NOCFI + 0x80}, {LIB + NOCFI + 0x80: b"\x90" * 5 + b"\xff\xd0"})
    assert got == UnwindResult((LIB + NOCFI + 0x10,), Stop.NO_CFI)


def test_a_candidate_whose_walk_does_not_go_on_is_dropped() -> None:
    # mid's frame above the word would hold its return address at +32: data there.
    words = {0: RA_MID, 8 + 24: HEAP + 8}
    got = _scan_walk(words, {RA_MID: _direct_call(LIB + NOCFI, RA_MID)})
    assert got == UnwindResult((LIB + NOCFI + 0x10,), Stop.NO_CFI)
    # ... and the walk goes on where it holds the root's.
    got = _scan_walk({0: RA_MID, 8 + 24: RA_ROOT}, {RA_MID: _direct_call(LIB + NOCFI, RA_MID)})
    assert got == UnwindResult((LIB + NOCFI + 0x10, RA_MID, RA_ROOT), None, scanned=1)


def test_a_call_through_a_pointer_is_taken_only_as_the_first_candidate() -> None:
    indirect = {RA_ROOT: b"\x90" * 5 + b"\xff\xd0"}
    got = _scan_walk({0x18: RA_ROOT}, indirect)
    assert got == UnwindResult((LIB + NOCFI + 0x10, RA_ROOT), None, scanned=1)
    # A stale return address below it (a direct call elsewhere): nothing is taken.
    stale = LIB + LEAF + 0x20
    code = {**indirect, stale: _direct_call(LIB + MID, stale)}
    got = _scan_walk({8: stale, 0x18: RA_ROOT}, code)
    assert got == UnwindResult((LIB + NOCFI + 0x10,), Stop.NO_CFI)


def test_a_probe_row_a_scan_carried_is_counted_in_the_summary(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # --stacks-at (ustackcopy): a row whose copy needed a stack scan says so,
    # like a sampled stack, so the summary's scan note counts it.
    from gfxbpf.client.profiles import copies
    from gfxbpf.client.profiles.python import records as py

    caller = 0x4444
    rec = copies.HEADER.pack(7, 7, 0, 8, 0x1000, 0x2000, 0, 1, 0x99, 0, 0, b"app")  # path 0x99
    rec += struct.pack("<Q", caller)

    monkeypatch.setattr(copies, "_unwind", lambda *a: ((caller, 0x5555), None, True))
    reader = copies.ProbeCopyReader(Records([rec]), lambda pid, refresh: object(), None)  # type: ignore[arg-type]
    reader.drain()
    key = copies.CALL_KEY.pack(7, 0, caller, py.chain_hash(()), 0x99, 1)
    stacks, uncopied = reader.raw_stacks([(key, copies.CALL_STATS.pack(3, 0))], ["fn"], "calls")
    assert uncopied == 0 and stacks[0].user == (caller, 0x5555) and stacks[0].unwind_scanned
