"""gfxclient profile's pprof and speedscope files, read by the viewers' own
readers: Google's pprof (built from Debian's source package) and speedscope's
importer in headless Chromium (tests/viewers.py).

The profile goes through the real symbolizer: a native frame at libc's
getpid in this process (its mapping, build id and symbol), Python frames of
a real source file (so `pprof -list` can show its lines), three threads in
two processes. Needs what tools/test_deps.sh installs: a failure, not a skip,
when CI=true."""

from __future__ import annotations

import ctypes
import gzip
import os
import textwrap
from pathlib import Path

import pytest

from gfxbpf.client.profiles.elfinfo import read_info
from gfxbpf.client.profiles.model import FrameInfo, Profile, RawStack, Thread
from gfxbpf.client.profiles.procmaps import capture
from gfxbpf.client.profiles.symbolize import Symbolizer
from gfxbpf.client.profiles.writers import write_profile
from gfxbpf.proto import pprof_pb2
from tests.viewers import Speedscope, need_pprof, need_speedscope, pprof, pprof_top

SOURCE = textwrap.dedent(
    """\
    import math


    def train_step(n):
        total = 0
        for i in range(n):
            total += math.sqrt(i)
        return total


    print(sum(x for x in range(3)))
    """
)
FIRST = {"<module>": 1, "train_step": 4, "<genexpr>": 11}  # co_firstlineno in SOURCE
ME = os.getpid()
WORKER_TID = ME + 100_000  # a second thread of this process (ids are labels only here)
OTHER_PID, OTHER_TID = 4_000_000, 4_000_001  # a process with no maps: Python frames only


def _getpid_address() -> int:
    address = ctypes.cast(ctypes.CDLL(None).getpid, ctypes.c_void_p).value
    assert address
    return address + 4  # inside the function, as a sampled ip is


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> tuple[Path, Profile]:
    folder = tmp_path_factory.mktemp("viewers")
    script = folder / "train.py"
    script.write_text(SOURCE)

    def py(*frames: tuple[str, int]) -> dict:
        """RawStack's Python fields: one run, root first, and each function's first line."""
        names = [(f"{name} ({script}:{line})", FIRST[name]) for name, line in frames]
        return {"python": (tuple(n for n, _ in names),), "python_starts": tuple(names)}

    raw = [
        RawStack(ME, (_getpid_address(),), False, 30, "main", tid=ME,
                 **py(("<module>", 11), ("train_step", 7))),
        RawStack(ME, (), False, 10, "main", tid=ME, **py(("<module>", 11), ("train_step", 6))),
        RawStack(ME, (), False, 5, "worker", tid=WORKER_TID,
                 **py(("<module>", 11), ("<genexpr>", 11))),
        RawStack(OTHER_PID, (), False, 7, "other", tid=OTHER_TID, **py(("<module>", 1))),
    ]  # fmt: skip
    sym = Symbolizer(cache_dir=str(folder / "cache"))
    maps = capture(ME)
    assert maps is not None
    sym.add_process(ME, maps)
    return script, sym.symbolize(raw, "samples", period_ns=10_000_000, duration_s=2.0)


@pytest.fixture(scope="module")
def pb(made: tuple[Path, Profile], tmp_path_factory) -> Path:
    need_pprof()
    path = tmp_path_factory.mktemp("pprof") / "p.pb.gz"
    write_profile(made[1], "pprof", str(path))
    return path


def test_pprof_top_names_every_function_without_file_and_line(made, pb: Path) -> None:
    rows = pprof_top(pb, "-sample_index=samples")
    names = [name for _, name in rows]
    assert "" not in names, rows  # pprof's demangler blanks <module> when it may rewrite it
    for fn in ("train_step", "<module>", "<genexpr>"):
        assert fn in names, rows
    assert not any(" (" in n for n in names), names  # file:line is in Line, not in the name
    flat = dict((name, n) for n, name in rows)
    assert flat["train_step"] == "10" and flat["<genexpr>"] == "5", rows  # line 6; line 5 of 7
    leaf = next(s[-1] for s, w in made[1].stacks.items() if w == 30)  # libc's getpid
    assert "/libc.so" in made[1].frames[leaf].obj and flat[leaf] == "30", (leaf, rows)


def test_pprof_list_shows_the_python_functions_lines(made, pb: Path) -> None:
    script = made[0]
    out = pprof(pb, "-list=^train_step$", "-sample_index=samples")
    assert f"train_step in {script}" in out, out
    lines = {int(cols[2].rstrip(":")): cols[:2] for cols in _listed(out)}
    assert lines[6] == ["10", "10"], out  # flat, cum of `for i in range(n):`
    assert lines[7] == [".", "30"], out  # total += ...: getpid below it holds the 30
    assert "total += math.sqrt(i)" in out


def _listed(out: str) -> list[list[str]]:
    return [c for c in (line.split(maxsplit=3) for line in out.splitlines()) if len(c) > 2
            and c[2].rstrip(":").isdigit()]  # fmt: skip


@pytest.mark.parametrize(
    "focus, total, absent",
    [
        (f"pid={OTHER_PID}", 7, "train_step"),
        (f"tid={WORKER_TID}", 5, "train_step"),
        ("thread_name=^worker$", 5, "train_step"),
        (f"pid={ME}", 45, "other"),
        (f"tid={ME}", 40, "<genexpr>"),
    ],
)
def test_pprof_tagfocus_selects_a_process_and_a_thread(
    pb: Path, focus: str, total: int, absent: str
) -> None:
    rows = pprof_top(pb, "-sample_index=samples", f"-tagfocus={focus}")
    out = pprof(pb, "-top", "-sample_index=samples", f"-tagfocus={focus}")
    assert f"Showing nodes accounting for {total}, " in out, out
    assert absent not in [name for _, name in rows], rows


def test_pprof_mapping_names_the_file_and_its_build_id(pb: Path) -> None:
    msg = pprof_pb2.Profile.FromString(gzip.decompress(pb.read_bytes()))
    files = {msg.string_table[m.filename]: msg.string_table[m.build_id] for m in msg.mapping}
    libc = next(f for f in files if "/libc.so" in f)
    info = read_info(libc)
    assert info is not None and info.build_id and files[libc] == info.build_id, files
    raw = pprof(pb, "-raw")
    assert f"{libc} {info.build_id}" in raw, raw  # pprof read it so
    starts = {msg.string_table[f.name]: f.start_line for f in msg.function if f.filename}
    assert starts == FIRST, starts
    assert msg.period == 10_000_000 and msg.duration_nanos == 2_000_000_000
    assert msg.time_nanos > 0


def test_speedscope_imports_one_profile_per_thread(made, tmp_path: Path) -> None:
    need_speedscope()
    script, profile = made
    path = tmp_path / "p.speedscope.json"
    write_profile(profile, "speedscope", str(path))
    with Speedscope(path) as page:
        # The profile shown first is the heaviest, this process's main thread: a
        # Python frame's file and line show in the hover tooltip, below its name.
        names = page.profile_names()  # ends at the profile shown first
        tips = page.tooltips()
    python = ("<module>", "train_step")
    found = [tip[1] for tip in tips if len(tip) > 1 and tip[0].split()[-1] in python]
    assert found == [f"{script}:11", f"{script}:6"], tips  # the first samples: line 6
    assert len(names) == 3, names
    me = capture(ME).comm  # type: ignore[union-attr]  # this process's name: python, pytest, ...
    assert names == [
        f"{me} (pid {ME}) thread main (tid {ME}) (samples)",
        f"{me} (pid {ME}) thread worker (tid {WORKER_TID}) (samples)",
        f"pid {OTHER_PID} thread other (tid {OTHER_TID}) (samples)",
    ], names


def test_speedscope_shows_the_heaviest_thread_first_and_lists_them_all(tmp_path: Path) -> None:
    need_speedscope()
    threads = {
        (Thread(1, 1, "app", "app"), ("app", "main", "idle")): 1,
        (Thread(1, 2, "app", "busy"), ("app", "work", "spin")): 50,
        (Thread(3, 3, "tool", "tool"), ("tool", "main")): 2,
    }
    stacks = {frames: w for (_, frames), w in threads.items()}
    path = tmp_path / "heavy.json"
    write_profile(Profile(stacks, "samples", threads=threads), "speedscope", str(path))
    with Speedscope(path) as page:
        first = page.shown()
        names = page.profile_names()
    assert first == ("app (pid 1) thread busy (tid 2) (samples)", 2, 3), first
    assert names == [
        "app (pid 1) thread app (tid 1) (samples)",
        "app (pid 1) thread busy (tid 2) (samples)",
        "tool (pid 3) thread tool (tid 3) (samples)",
    ], names


def test_pprof_keeps_demangled_cpp_and_jit_names_as_written(tmp_path: Path) -> None:
    """A symbol keeps its mangled form as system_name (pprof leaves the
    demangled name alone); a perf map's JIT name has none (pprof would strip
    its <...> as C++ template arguments otherwise)."""
    need_pprof()
    cpp, jit = "std::vector<int>::push_back(int const&)", "py::<module>:/srv/app.py"
    frames = {
        cpp: FrameInfo(cpp, system_name="_ZNSt6vectorIiSaIiEE9push_backERKi", obj="/usr/lib/l.so"),
        jit: FrameInfo(jit),
    }
    stacks = {("app", jit, cpp): 3}
    path = tmp_path / "cpp.pb.gz"
    write_profile(Profile(stacks, "samples", frames=frames), "pprof", str(path))
    assert [name for _, name in pprof_top(path)] == [cpp, "app", jit]
