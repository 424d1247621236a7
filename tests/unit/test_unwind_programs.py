"""The unwinder on real stacks: programs built here with gcc -O2 (no frame
pointers; stripped and not; without CFI), and Debian's own python3 and xz,
sampled by bench/unwind_samples.py (SIGPROF: the interrupted registers and an
8 KiB stack copy, as the BPF program takes them), unwound offline, and named
by the symbolizer."""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from bench.unwind_samples import Capture, sample_run
from gfxbpf.client.profiles.elfinfo import read_info
from gfxbpf.client.profiles.elfsyms import function_ranges
from gfxbpf.client.profiles.model import RawStack
from gfxbpf.client.profiles.procmaps import ProcessMaps
from gfxbpf.client.profiles.symbolize import Symbolizer
from gfxbpf.client.profiles.unwind import Stop, UnwindResult, UnwindTables, marker_frame, unwind
from gfxbpf.client.profiles.unwind.compiled import CFA_NONE
from tests.c_programs import SIGNAL_C
from tests.conftest import skip_or_fail

CHAIN_C = r"""
#include <stdlib.h>
#define STEP __attribute__((noinline)) unsigned long
static volatile unsigned long sink;
__attribute__((noinline)) unsigned long leaf(unsigned long n) {
    unsigned long x = n;
    for (unsigned long i = 0; i < n; i++) x = x * 6364136223846793005UL + i;
    return x;
}
STEP d(unsigned long n) { unsigned long r = leaf(n); sink += r; return r ^ 4; }
STEP c(unsigned long n) { unsigned long r = d(n) * 3; sink += r; return r; }
STEP b(unsigned long n) { unsigned long r = c(n) + 7; sink += r; return r; }
STEP a(unsigned long n) { unsigned long r = b(n) - 1; sink += r; return r; }
int main(int argc, char **argv) {
    unsigned long n = strtoul(argv[1], 0, 10);
    for (int i = 0; i < 20; i++) sink += a(n / 20);
    return 0;
}
"""
CHAIN = ("main", "a", "b", "c", "d", "leaf")
LIBC_START = {"__libc_start_main", "__libc_start_main_impl", "__libc_start_call_main"}
ROUNDS = "400000000"
NO_FP = ["-fomit-frame-pointer"]  # about 0.4 s of CPU: a few hundred samples


@pytest.fixture(autouse=True)
def _tools() -> None:
    for tool in ("gcc", "strip"):
        if shutil.which(tool) is None:
            skip_or_fail(f"{tool} is missing (apt-get install gcc binutils)")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("unwind")


def _build(folder: Path, name: str, flags: list[str], strip: bool = False) -> Path:
    src, out = folder / "chain.c", folder / name
    src.write_text(CHAIN_C)
    subprocess.run(["gcc", "-O2", *flags, "-o", out, src], check=True)
    if strip:
        subprocess.run(["strip", out], check=True)
    return out


def _unwind_all(cap: Capture, cache: Path) -> list[UnwindResult]:
    tables = UnwindTables(cache_dir=str(cache))
    return [unwind(s.regs, s.stack, cap.maps, tables) for s in cap.samples]


def _names(
    results: list[UnwindResult], maps: ProcessMaps, cache: Path
) -> Counter[tuple[tuple[str, ...], str | None]]:
    """(frame names innermost first, stop) -> samples, named by the symbolizer."""
    sym = Symbolizer(cache_dir=str(cache / "sym"))
    sym.add_process(maps.pid, maps)
    out: Counter[tuple[tuple[str, ...], str | None]] = Counter()
    for r in results:
        raw = RawStack(maps.pid, r.frames, False, 1, comm="t", unwind_stop=r.stop)
        (stack,) = sym.symbolize([raw], "samples").stacks
        if r.stop is not None:  # the marker frame at the root end
            assert stack[1] == marker_frame(r.stop)
            stack = stack[1:]
        out[(tuple(reversed(stack[1:])), r.stop)] += 1
    return out


def _by_function_start(
    named: Counter[tuple[tuple[str, ...], str | None]], stripped: Path, unstripped: Path
) -> Counter[tuple[tuple[str, ...], str | None]]:
    """A stripped file's frames are [file+0xSTART] of their FDE: name them by
    the function starting exactly there in an unstripped build of the same code."""
    info = read_info(str(unstripped))
    assert info is not None
    starts = {}
    for vaddr, _, name in function_ranges(str(unstripped)):
        for off, seg_vaddr, size in info.segments:
            if seg_vaddr <= vaddr < seg_vaddr + size:
                starts[f"[{stripped.name}+{vaddr - seg_vaddr + off:#x}]"] = name
    out: Counter[tuple[tuple[str, ...], str | None]] = Counter()
    for (frames, stop), n in named.items():
        out[(tuple(starts.get(f, f) for f in frames), stop)] += n
    return out


def _check_chain(named: Counter[tuple[tuple[str, ...], str | None]]) -> None:
    total = sum(named.values())
    assert total >= 50, f"only {total} samples"
    in_leaf = {k: v for k, v in named.items() if k[0][0] == "leaf"}
    assert sum(in_leaf.values()) >= total * 0.8
    for (frames, stop), count in in_leaf.items():
        assert stop is None, (frames, stop, count)
        assert frames[:6] == tuple(reversed(CHAIN)), frames
        assert set(frames[6:-1]) <= LIBC_START and frames[-1] == "_start", frames
    complete = sum(v for (_, stop), v in named.items() if stop is None)
    assert complete == total, named.most_common(5)


@pytest.mark.parametrize("strip", [False, True], ids=["symbols", "stripped"])
def test_gcc_o2_without_frame_pointers(folder: Path, strip: bool) -> None:
    prog = _build(folder, f"chain-o2-{strip}", NO_FP, strip)
    cap = sample_run([str(prog), ROUNDS], folder)
    assert cap.returncode == 0
    named = _names(_unwind_all(cap, folder / "cache"), cap.maps, folder)
    if strip:
        # The chain's own frames are [file+0xSTART] (no symbols to name them);
        # a sample taken before main (the loader, libc's start) is not the chain's.
        own = {k: v for k, v in named.items() if k[0] and k[0][0].startswith(f"[{prog.name}+")}
        assert sum(own.values()) >= 0.8 * sum(named.values()), named.most_common(5)
        assert all(f.startswith("[") for frames, _ in own for f in frames[:6]), own
        named = _by_function_start(named, prog, _build(folder, "chain-o2-names", NO_FP))
    _check_chain(named)


def test_no_cfi_and_no_frame_pointers_stop_without_inventing_frames(folder: Path) -> None:
    flags = ["-fomit-frame-pointer", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"]
    prog = _build(folder, "chain-nocfi", flags)
    cap = sample_run([str(prog), ROUNDS], folder)
    results = _unwind_all(cap, folder / "cache")
    named = _names(results, cap.maps, folder)
    known = {*CHAIN, *LIBC_START, "_start"}
    in_leaf = [(frames, stop) for (frames, stop) in named if frames[0] == "leaf"]
    assert in_leaf
    for frames, stop in in_leaf:
        # leaf has no CFI and rbp is one of its data registers: the walk may
        # not guess past it unless the guess is code; what it shows is real.
        assert stop is Stop.NO_CFI or stop is None, (frames, stop)
        assert set(frames) <= known, frames
    for r in results:  # every frame is code of the program or a library
        assert all(cap.maps.find(pc) and cap.maps.find(pc).executable for pc in r.frames)


def test_frame_pointers_carry_a_walk_through_code_without_cfi(folder: Path) -> None:
    flags = ["-fno-omit-frame-pointer", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"]
    prog = _build(folder, "chain-fp-nocfi", flags)
    cap = sample_run([str(prog), ROUNDS], folder)
    named = _names(_unwind_all(cap, folder / "cache"), cap.maps, folder)
    total = sum(named.values())
    good = 0
    for (frames, stop), count in named.items():
        # leaf pushes no frame of its own (no -mno-omit-leaf-frame-pointer):
        # by frame pointers its caller d is skipped, the rest is found.
        if stop is None and frames[-1] == "_start" and {"main", "a", "b", "c"} <= set(frames):
            good += count
    assert good >= 0.95 * total, named.most_common(4)


def _debian(path: str) -> None:
    if not Path(path).exists():
        skip_or_fail(f"{path} is missing")


def test_debian_python3_reaches_py_bytes_main(folder: Path) -> None:
    _debian("/usr/bin/python3")
    code = "x = 0\nfor i in range(6_000_000):\n    x += i * i % 7\n"
    cap = sample_run(["/usr/bin/python3", "-c", code], folder)
    assert cap.returncode == 0
    named = _names(_unwind_all(cap, folder / "cache"), cap.maps, folder)
    total = sum(named.values())
    reach = sum(
        v for (frames, stop), v in named.items() if stop is None and "Py_BytesMain" in frames
    )
    assert total >= 50 and reach >= 0.95 * total, named.most_common(4)
    repeated = sum(v for (frames, _), v in named.items() if _repeats(frames, 8))
    assert repeated < 0.01 * total


def _repeats(frames: tuple[str, ...], n: int) -> bool:
    return any(len(set(frames[i : i + n])) == 1 for i in range(len(frames) - n + 1))


def test_debian_gzip_reaches_libc_start_main(folder: Path) -> None:
    # gzip, not xz: xz 5.6+ sandboxes itself (Landlock), which stops the
    # preloaded sampler writing its files (the kernel test profiles xz).
    _debian("/usr/bin/gzip")
    data = (folder / "random.bin").open("wb")
    with open("/dev/urandom", "rb") as rnd:
        # About a second of gzip -9 (12 MiB took 0.24 s: 62 samples of the
        # ITIMER_PROF sampler, which the kernel's tick paces; 47 on a machine
        # with three CPU burners, under the floor of 50): 48 MiB give ~250.
        data.write(rnd.read(48 << 20))
    data.close()
    cap = sample_run(["/usr/bin/gzip", "-9", "-c", str(folder / "random.bin")], folder)
    assert cap.returncode == 0
    named = _names(_unwind_all(cap, folder / "cache"), cap.maps, folder)
    total = sum(named.values())
    reach = sum(
        v for (frames, stop), v in named.items() if stop is None and LIBC_START & set(frames)
    )
    assert total >= 50 and reach >= 0.95 * total, named.most_common(4)


VDSO_C = r"""
#include <stdlib.h>
#include <time.h>
__attribute__((noinline)) long spin(long n) {
    struct timespec ts;
    long s = 0;
    for (long i = 0; i < n; i++) { clock_gettime(CLOCK_MONOTONIC, &ts); s += ts.tv_nsec; }
    return s;
}
int main(int argc, char **argv) { return (int)(spin(atol(argv[1])) & 0); }
"""


def test_through_the_vdso(folder: Path) -> None:
    # clock_gettime runs in the vDSO, whose CFI comes from the client's own copy.
    src, prog = folder / "vdso.c", folder / "vdso"
    src.write_text(VDSO_C)
    subprocess.run(["gcc", "-O2", "-o", prog, src], check=True)
    cap = sample_run([str(prog), "8000000"], folder)
    tables = UnwindTables(cache_dir=str(folder / "cache"))
    results = [unwind(s.regs, s.stack, cap.maps, tables) for s in cap.samples]
    vdso = next(m for m in cap.maps.mappings if m.path == "[vdso]")
    in_vdso = [r for r in results if vdso.start <= r.frames[0] < vdso.end]
    assert len(in_vdso) >= 5, f"{len(in_vdso)} of {len(results)} samples in the vDSO"
    resolve = tables.resolver(cap.maps)
    for r in in_vdso:  # unwound by the vDSO's own CFI, not by a frame-pointer guess
        where = resolve(r.frames[0])
        assert where is not None and where[0] is not None
        assert where[0].rule(r.frames[0] + where[1]).cfa != CFA_NONE
    named = _names(in_vdso, cap.maps, folder)
    for frames, stop in named:
        assert stop is None and frames[-1] == "_start" and "main" in frames, frames
        assert "spin" in frames, frames


@pytest.mark.parametrize("separate", [False, True], ids=["in-file", "debug-file"])
def test_debug_frame_fills_what_eh_frame_lacks(folder: Path, separate: bool) -> None:
    # Built with -g but no unwind tables: the program's own code has CFI only
    # in .debug_frame (the C runtime's _start still brings an .eh_frame);
    # stripped, that moves to a separate debug file found by .gnu_debuglink.
    flags = [*NO_FP, "-g", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"]
    prog = _build(folder, f"chain-dbg-{separate}", flags)
    if separate:
        debug = prog.with_name(prog.name + ".debug")
        subprocess.run(["objcopy", "--only-keep-debug", prog, debug], check=True)
        subprocess.run(["strip", prog], check=True)
        subprocess.run(["objcopy", f"--add-gnu-debuglink={debug}", prog], check=True)
    table = UnwindTables(cache_dir=str(folder / "cache-dbg")).file_table(str(prog))
    assert table is not None
    want = "debug file .debug_frame" if separate else ".debug_frame"
    assert table.source == f".eh_frame + {want}"
    cap = sample_run([str(prog), ROUNDS], folder)
    _check_chain(_names(_unwind_all(cap, folder / "cache"), cap.maps, folder))


def test_a_signal_handler_unwinds_through_the_sigreturn_frame(folder: Path) -> None:
    # The handler runs on the thread's stack above a signal frame (the kernel's
    # ucontext); libc's sigreturn trampoline (__restore_rt) has CFI that says
    # where the interrupted rsp, rip and rbp were saved: the walk goes on
    # through raise() to outer and main.
    src, prog = folder / "signal.c", folder / "signal"
    src.write_text(SIGNAL_C)
    subprocess.run(["gcc", "-O2", *NO_FP, "-o", prog, src], check=True)
    cap = sample_run([str(prog), ROUNDS], folder)
    named = _names(_unwind_all(cap, folder / "cache"), cap.maps, folder)
    in_handler = {k: n for k, n in named.items() if k[0][0] == "handler_spin"}
    total = sum(in_handler.values())
    # The handler is where the program spends its time: most samples, whatever
    # the compiler makes of the loop (Debian 13's gcc runs it in half the time).
    assert total >= 20 and total >= 0.8 * sum(named.values()), named.most_common(5)
    for (frames, stop), _ in in_handler.items():
        assert stop is None, (frames, stop)
        assert frames[:2] == ("handler_spin", "on_signal"), frames
        assert frames[-1] == "_start" and frames.index("outer") < frames.index("main"), frames
