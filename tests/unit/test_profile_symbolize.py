"""Symbolization of real addresses: a gcc-built program and shared library,
built here with and without frame pointers, stripped with a separate debug
file, and JIT names from a perf map. The program walks its own frame-pointer
chain the way the kernel does for a user stack and prints the addresses;
the test captures its /proc/PID/maps while it waits, and symbolizes."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gfxbpf.client.profiles import fileid, procmaps
from gfxbpf.client.profiles import vdso as vdso_module
from gfxbpf.client.profiles.elfinfo import open_debug_file, read_info
from gfxbpf.client.profiles.model import Profile, RawStack
from gfxbpf.client.profiles.procmaps import capture
from gfxbpf.client.profiles.symbolize import Symbolizer
from tests.conftest import skip_or_fail


@pytest.fixture(autouse=True)
def _compilers() -> None:
    for tool in ("gcc", "objcopy"):
        if shutil.which(tool) is None:
            skip_or_fail(f"{tool} is missing (apt-get install gcc binutils)")


LIB_C = r"""
#include <stdio.h>
/* Print this function's address, then the frame-pointer chain: the return
   address above each saved frame pointer, innermost first (what the kernel's
   user stack walk records). Stop at a pointer that does not go up the stack. */
__attribute__((noinline)) void foo_walk(void) {
    void **fp = __builtin_frame_address(0);
    printf("%p\n", (void *)((char *)foo_walk + 1));
    for (int i = 0; i < 32 && fp; i++) {
        printf("%p\n", fp[1]);
        void **next = fp[0];
        if (next <= fp || (char *)next - (char *)fp > (1 << 20)) break;
        fp = next;
    }
    printf("end\n");
    fflush(stdout);
}
"""

PROG_C = r"""
#include <stdio.h>
void foo_walk(void);
static volatile int sink;
__attribute__((noinline)) void hot(void) { foo_walk(); sink++; }
int main(void) { hot(); getchar(); return sink - 1; }
"""


@dataclass
class Build:
    prog: Path
    lib: Path
    folder: Path


def _gcc(folder: Path, flags: list[str], extra: list[str] | None = None) -> Build:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "foo.c").write_text(LIB_C)
    (folder / "prog.c").write_text(PROG_C)
    lib, prog = folder / "libfoo.so", folder / "prog"
    base = ["gcc", "-O2", "-g", *flags, *(extra or [])]
    subprocess.run([*base, "-shared", "-fPIC", "-o", lib, folder / "foo.c"], check=True)
    subprocess.run(
        [*base, "-o", prog, folder / "prog.c", f"-L{folder}", "-lfoo", f"-Wl,-rpath,{folder}"],
        check=True,
    )
    return Build(prog, lib, folder)


FP = ["-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer"]
NO_FP = ["-fomit-frame-pointer"]


@pytest.fixture(scope="module")
def fp_build(tmp_path_factory) -> Build:
    return _gcc(tmp_path_factory.mktemp("fp"), FP)


@dataclass
class Run:
    pid: int
    maps: procmaps.ProcessMaps
    addrs: tuple[int, ...]  # innermost first


@pytest.fixture
def run_prog() -> Iterator:
    procs: list[subprocess.Popen] = []

    def start(b: Build, perf_map_dir: str | None = None) -> Run:
        p = subprocess.Popen([b.prog], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout is not None
        addrs = []
        for line in p.stdout:
            if line.strip() == "end":
                break
            addrs.append(int(line, 16))
        maps = capture(p.pid, perf_map_dir) if perf_map_dir else capture(p.pid)
        assert maps is not None
        return Run(p.pid, maps, tuple(addrs))

    yield start
    for p in procs:
        p.communicate(input="\n", timeout=10)


def _symbolize(run: Run, cache: Path, **kw) -> tuple[Profile, Symbolizer]:
    sym = Symbolizer(cache_dir=str(cache), **kw)
    sym.add_process(run.pid, run.maps)
    raw = [RawStack(pid=run.pid, user=run.addrs, kernel=False, weight=5, comm="prog")]
    return sym.symbolize(raw, "samples", period_ns=10_000_000), sym


def _one(p: Profile) -> tuple[str, ...]:
    (stack,) = p.stacks
    return stack


def _libc_has_debug_file(pid: int) -> bool:
    """Whether libc's separate debug symbols (Debian: libc6-dbg) are installed:
    only they name glibc's static functions, __libc_start_call_main among them."""
    with open(f"/proc/{pid}/maps") as f:
        paths = {line.split()[-1] for line in f if "/libc.so" in line}
    for p in paths:
        found = open_debug_file(p, read_info(p))
        if found is not None:
            os.close(found.fd)
            return True
    return False


def test_frame_pointer_stack_folds_to_main_hot(fp_build, run_prog, tmp_path) -> None:
    run = run_prog(fp_build)
    prof, sym = _symbolize(run, tmp_path / "cache")
    stack = _one(prof)
    print("with frame pointers:", ";".join(stack))
    assert stack[0] == "prog"
    assert stack[-3:] == ("main", "hot", "foo_walk"), stack
    # main's caller is in libc: named where libc's debug symbols are installed,
    # its file and offset where not (libc's own symbol table lacks static names).
    # tools/setup.sh installs them (libc6-dbg); a developer's machine may lack them.
    if _libc_has_debug_file(run.pid):
        assert stack[-4] == "__libc_start_call_main", stack
        assert prof.notes == [], "a complete stack needs no warning"
    else:
        assert re.fullmatch(r"\[libc\.so\.6\+0x[0-9a-f]+\]", stack[-4]), stack
    assert prof.stacks[stack] == 5 and prof.unit == "samples"
    assert sym.parsed >= 2  # prog, libfoo.so, libc


def test_libc_frame_without_debug_symbols_is_named_by_offset(fp_build, run_prog, tmp_path) -> None:
    # As on a host without libc6-dbg (Debian 13's minimal install, say).
    run = run_prog(fp_build)
    prof, _ = _symbolize(run, tmp_path / "cache", debug_root=str(tmp_path / "no-debug"))
    stack = _one(prof)
    assert stack[0] == "prog" and stack[-3:] == ("main", "hot", "foo_walk"), stack
    assert re.fullmatch(r"\[libc\.so\.6\+0x[0-9a-f]+\]", stack[-4]), stack


def test_exited_process_still_resolves(fp_build, run_prog, tmp_path) -> None:
    run = run_prog(fp_build)
    sym = Symbolizer(cache_dir=str(tmp_path / "c"))
    sym.add_process(run.pid, run.maps)
    os.kill(run.pid, 9)  # the fixture reaps it
    raw = [RawStack(pid=run.pid, user=run.addrs, kernel=True, weight=1)]
    stack = _one(sym.symbolize(raw, "samples"))
    assert stack[-4:] == ("main", "hot", "foo_walk", "[kernel]")
    assert stack[0] == "prog", "comm comes from the snapshot when the stack has none"


def test_second_symbolizer_loads_the_cache_instead_of_parsing(fp_build, run_prog, tmp_path):
    run = run_prog(fp_build)
    first, s1 = _symbolize(run, tmp_path / "cache")
    assert s1.parsed >= 2 and s1.cache_hits == 0
    keys = os.listdir(tmp_path / "cache")
    bid = read_info(str(fp_build.prog)).build_id
    ident = fileid.FileId.of(os.stat(fp_build.prog)).text()
    assert bid and f"{bid}-{ident}" in keys, "tables are keyed by build-id and file identity"
    second, s2 = _symbolize(run, tmp_path / "cache")
    assert s2.parsed == 0 and s2.cache_hits == s1.parsed
    assert second.stacks == first.stacks


def test_file_without_build_id_is_cached_by_inode(tmp_path, run_prog) -> None:
    b = _gcc(tmp_path / "noid", FP, ["-Wl,--build-id=none"])
    assert read_info(str(b.prog)).build_id is None
    run = run_prog(b)
    prof, _ = _symbolize(run, tmp_path / "cache")
    assert _one(prof)[-3:] == ("main", "hot", "foo_walk")
    assert any(k.startswith("noid-") for k in os.listdir(tmp_path / "cache"))


def _strip_with_debuglink(b: Build, debug: Path) -> None:
    subprocess.run(["objcopy", "--only-keep-debug", b.prog, debug], check=True)
    subprocess.run(["objcopy", "--strip-all", b.prog], check=True)
    subprocess.run(["objcopy", f"--add-gnu-debuglink={debug}", b.prog], check=True)


def test_stripped_binary_uses_its_debuglink_file(tmp_path, run_prog) -> None:
    b = _gcc(tmp_path / "dbg", FP)
    (b.folder / ".debug").mkdir()
    debug = b.folder / ".debug" / "prog.debug"
    _strip_with_debuglink(b, debug)
    run = run_prog(b)
    prof, _ = _symbolize(run, tmp_path / "cache", debug_root=str(tmp_path / "none"))
    assert _one(prof)[-3:] == ("main", "hot", "foo_walk")


def test_debuglink_with_the_wrong_crc_is_not_used(tmp_path, run_prog) -> None:
    b = _gcc(tmp_path / "crc", FP)
    debug = b.folder / "prog.debug"
    _strip_with_debuglink(b, debug)
    other = _gcc(tmp_path / "other", FP + ["-DUNUSED=1"], ["-fno-inline"])
    subprocess.run(["objcopy", "--only-keep-debug", other.prog, debug], check=True)
    run = run_prog(b)
    prof, _ = _symbolize(run, tmp_path / "cache", debug_root=str(tmp_path / "none"))
    stack = _one(prof)
    # hot and main are static to prog and gone with its .symtab: named by file offset.
    assert stack[-1] == "foo_walk"
    assert all(s.startswith("[prog+0x") for s in stack[-3:-1]), stack


def test_stripped_binary_found_by_build_id(tmp_path, run_prog) -> None:
    b = _gcc(tmp_path / "bid", FP)
    bid = read_info(str(b.prog)).build_id
    assert bid
    root = tmp_path / "debugroot"
    target = root / ".build-id" / bid[:2] / f"{bid[2:]}.debug"
    target.parent.mkdir(parents=True)
    subprocess.run(["objcopy", "--only-keep-debug", b.prog, target], check=True)
    subprocess.run(["objcopy", "--strip-all", b.prog], check=True)
    run = run_prog(b)
    prof, _ = _symbolize(run, tmp_path / "cache", debug_root=str(root))
    assert _one(prof)[-3:] == ("main", "hot", "foo_walk")


def test_without_frame_pointers_the_stack_is_cut_and_the_user_is_told(tmp_path, run_prog):
    b = _gcc(tmp_path / "nofp", NO_FP)
    run = run_prog(b)
    prof, _ = _symbolize(run, tmp_path / "cache")
    stack = _one(prof)
    print("without frame pointers:", ";".join(stack))
    assert stack[-1] == "foo_walk"
    assert "main" not in stack, f"the walk cannot get past hot without frame pointers: {stack}"
    (note,) = prof.notes
    assert "-fno-omit-frame-pointer" in note and "100%" in note


def test_unknown_addresses_are_named_by_mapping_or_unknown(fp_build, run_prog, tmp_path):
    run = run_prog(fp_build)
    lib = next(m for m in run.maps.mappings if m.path.endswith("libfoo.so") and m.executable)
    past_symbols = lib.end - 1  # the end of the text mapping: past the last function
    raw = [RawStack(run.pid, (past_symbols, 0x10), False, 1, comm="prog")]
    sym = Symbolizer(cache_dir=str(tmp_path / "c"))
    sym.add_process(run.pid, run.maps)
    stack = _one(sym.symbolize(raw, "calls"))
    off = past_symbols - lib.start + lib.offset
    assert stack == ("prog", "[unknown]", f"[libfoo.so+{off:#x}]")


def test_perf_map_names_jit_code(fp_build, run_prog, tmp_path) -> None:
    run = run_prog(fp_build)
    anon = 0x7A0000000000  # not mapped in the process: only the perf map knows it
    (tmp_path / f"perf-{run.pid}.map").write_text(
        f"{anon:x} 40 py::hot_loop:/srv/app.py\n{anon + 0x40:x} 20 py::main:/srv/app.py\n"
        "garbage line\n"
    )
    maps = capture(run.pid, str(tmp_path))
    assert maps is not None and maps.perf_map_path == str(tmp_path / f"perf-{run.pid}.map")
    sym = Symbolizer(cache_dir=str(tmp_path / "c"))
    sym.add_process(run.pid, maps)
    raw = [RawStack(run.pid, (anon + 0x10, anon + 0x45, *run.addrs[1:]), False, 2, comm="py")]
    stack = _one(sym.symbolize(raw, "samples"))
    assert stack[-3:] == ("hot", "py::main:/srv/app.py", "py::hot_loop:/srv/app.py")


@pytest.mark.skipif(os.getuid() != 0, reason="chown needs root")
def test_perf_map_planted_by_another_user_is_ignored(fp_build, run_prog, tmp_path) -> None:
    run = run_prog(fp_build)
    path = tmp_path / f"perf-{run.pid}.map"
    path.write_text("7a0000000000 40 evil\n")
    os.chown(path, 65534, 65534)
    maps = capture(run.pid, str(tmp_path))
    assert maps is not None and maps.perf_map == [] and maps.perf_map_path is None


def test_lost_stack_and_leaf_frame(fp_build, run_prog, tmp_path) -> None:
    run = run_prog(fp_build)
    sym = Symbolizer(cache_dir=str(tmp_path / "c"))
    sym.add_process(run.pid, run.maps)
    raw = [
        RawStack(run.pid, run.addrs[1:], False, 3, comm="prog", leaf="cuLaunchKernel"),
        RawStack(run.pid, (), False, 1, comm="prog", user_error="lost"),
    ]
    prof = sym.symbolize(raw, "calls")
    assert prof.stacks[("prog", "[user stack lost]")] == 1
    launch = next(s for s in prof.stacks if s[-1] == "cuLaunchKernel")
    assert launch[-3:] == ("main", "hot", "cuLaunchKernel")
    assert any("no user stack" in n for n in prof.notes)


def test_gone_process_captures_nothing() -> None:
    p = subprocess.Popen(["true"])
    p.wait()
    assert capture(p.pid) is None


PY_PERF_SCRIPT = r"""
import os, sys
def hot_python_function(n):
    return sum(i * i for i in range(n))
hot_python_function(1000)
print(os.getpid(), flush=True)
sys.stdin.readline()
"""


def _python_with_perf_maps() -> str | None:
    """A Python 3.12+ that writes perf maps (-X perf), if this machine has one."""
    found = [shutil.which(f"python3.{minor}") for minor in range(12, 20)]
    found += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python3")))
    for exe in filter(None, found):
        r = subprocess.run([exe, "-X", "perf", "-c", "pass"], capture_output=True, timeout=60)
        if r.returncode == 0:
            return exe
    return None


def test_python_perf_map_names_python_functions(tmp_path) -> None:
    exe = _python_with_perf_maps()
    if exe is None:
        pytest.skip("no Python 3.12+ here (the kernel test covers -X perf end to end)")
    script = tmp_path / "app.py"
    script.write_text(PY_PERF_SCRIPT)
    p = subprocess.Popen(
        [exe, "-X", "perf", str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None
    pid = int(p.stdout.readline())
    try:
        maps = capture(pid)
    finally:
        p.communicate("\n", timeout=30)
        perf_map = f"/tmp/perf-{pid}.map"
        if os.path.exists(perf_map):
            os.unlink(perf_map)  # Python leaves it behind
    assert maps is not None and maps.perf_map_path == f"/tmp/perf-{pid}.map"
    entry = next(e for e in maps.perf_map if "hot_python_function" in e.name)
    assert entry.name == f"py::hot_python_function:{script}"
    where = maps.find(entry.start)
    assert where is None or not where.is_file, "trampolines live in anonymous memory"
    sym = Symbolizer(cache_dir=str(tmp_path / "c"))
    sym.add_process(pid, maps)
    raw = [RawStack(pid, (entry.start + 1,), False, 1)]
    assert _one(sym.symbolize(raw, "samples"))[-1] == entry.name


def test_library_replaced_on_disk_is_not_trusted(tmp_path, run_prog) -> None:
    b = _gcc(tmp_path / "upg", FP)
    run = run_prog(b)
    new = b.folder / "libfoo.so.new"
    shutil.copy(b.lib, new)
    os.replace(new, b.lib)  # an upgrade: same path, another inode
    prof, _ = _symbolize(run, tmp_path / "cache")
    stack = _one(prof)
    assert stack[-1].startswith("[libfoo.so+0x"), stack
    assert stack[-3:-1] == ("main", "hot")
    assert f"frames in {b.lib} are named by file offset only: it was replaced on disk" in (
        " ".join(prof.notes)
    )


def test_debug_file_installed_after_a_profile_is_used_by_the_next(tmp_path, run_prog) -> None:
    b = _gcc(tmp_path / "late", FP)
    root = tmp_path / "debugroot"
    bid = read_info(str(b.prog)).build_id
    keep = tmp_path / "prog.debug"
    subprocess.run(["objcopy", "--only-keep-debug", b.prog, keep], check=True)
    subprocess.run(["objcopy", "--strip-all", b.prog], check=True)
    run = run_prog(b)
    before, _ = _symbolize(run, tmp_path / "cache", debug_root=str(root))
    assert _one(before)[-2].startswith("[prog+0x")
    target = root / ".build-id" / bid[:2] / f"{bid[2:]}.debug"
    target.parent.mkdir(parents=True)
    shutil.copy(keep, target)
    after, sym = _symbolize(run, tmp_path / "cache", debug_root=str(root))
    assert _one(after)[-3:] == ("main", "hot", "foo_walk")
    assert sym.parsed == 1, "only prog is parsed again (now with its debug file)"


VDSO_PROG_C = r"""
#include <stdio.h>
#include <time.h>
int main(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    printf("ready\n");
    fflush(stdout);
    getchar();
    return 0;
}
"""


def test_vdso_frames_are_named(tmp_path) -> None:
    (tmp_path / "v.c").write_text(VDSO_PROG_C)
    subprocess.run(["gcc", "-O2", "-o", tmp_path / "v", tmp_path / "v.c"], check=True)
    p = subprocess.Popen([tmp_path / "v"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        maps = capture(p.pid)
    finally:
        p.communicate(b"\n", timeout=10)
    assert maps is not None
    vdso = next(m for m in maps.mappings if m.path == "[vdso]")
    own = vdso_module.own_vdso_table()
    assert own is not None
    start = own.starts[[own.name(i) for i in range(len(own.ends))].index("clock_gettime")]
    sym = Symbolizer(cache_dir=str(tmp_path / "c"))
    sym.add_process(p.pid, maps)
    raw = [RawStack(p.pid, (vdso.start + start + 3, vdso.end - 1), False, 1)]
    assert _one(sym.symbolize(raw, "samples"))[1:] == ("[vdso]", "clock_gettime")


def test_perf_map_older_than_the_process_is_ignored(fp_build, run_prog, tmp_path) -> None:
    """Python leaves /tmp/perf-PID.map behind; a later process with the same pid
    must not get its names."""
    run = run_prog(fp_build)
    path = tmp_path / f"perf-{run.pid}.map"
    path.write_text("7a0000000000 40 py::stale:/old.py\n")
    assert capture(run.pid, str(tmp_path)).perf_map != []
    old = time.time() - 3600
    os.utime(path, (old, old))
    maps = capture(run.pid, str(tmp_path))
    assert maps is not None and maps.perf_map == [] and maps.perf_map_path is None
