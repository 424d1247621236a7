"""`gfxclient profile --memory` / `--memory-live` (program memstacks) as an
ordinary user, against a broker with CAP_BPF + CAP_PERFMON only: bytes per
allocating stack of a C program built -O2 without frame pointers, of a
Python program by its lines, and of CUDA device memory through the libcuda
stand-in, each compared with what the program allocated."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import cuda_standin as cs
from tests.conftest import skip_or_fail
from tests.kernel.brokerenv import (
    ALICE,
    BOB,
    VENV_PYTHON,
    BrokerProcess,
    policy_for,
    run_as,
    shared_dir,
    wait_until,
)
from tests.kernel.profiling import attaches, held, release_on_attach, stacks_of

pytestmark = pytest.mark.kernel
PYTHON = "/usr/bin/python3"
SIZE = 100_000
KEPT, FREED = 1000, 3000

# keep_them's blocks live to the exit; free_them frees each at once. The
# pauses let the profiler read the maps of the process before and after.
ALLOCS_C = r"""
#include <stdlib.h>
#include <unistd.h>
static void *kept[1000];
__attribute__((noinline)) void keep_them(int n)
{
    for (int i = 0; i < n; i++) {
        kept[i] = malloc(100000);
        __asm__ volatile("" :: "r"(kept[i]) : "memory");
    }
}
__attribute__((noinline)) void free_them(int n)
{
    for (int i = 0; i < n; i++) {
        char *p = malloc(100000);
        __asm__ volatile("" :: "r"(p) : "memory");
        free(p);
    }
}
int main(void)
{
    usleep(200000);
    keep_them(1000);
    free_them(3000);
    usleep(300000);
    return kept[999] == 0;
}
"""

# Two paths through one allocating function, -O2: alloc_inner is the only
# caller of malloc (as c10::alloc_cpu is for every PyTorch tensor), called
# 1000 times from path_alpha and 3000 times from path_beta.
SHARED_C = r"""
#include <stdlib.h>
#include <unistd.h>
volatile unsigned long sink;
__attribute__((noinline)) void *alloc_inner(unsigned long n)
{
    void *p = malloc(n);
    __asm__ volatile("" :: "r"(p) : "memory");
    sink++;
    return p;
}
__attribute__((noinline)) void path_alpha(int n)
{
    for (int i = 0; i < n; i++) free(alloc_inner(100000));
    sink++;
}
__attribute__((noinline)) void path_beta(int n)
{
    for (int i = 0; i < n; i++) free(alloc_inner(100000));
    sink += 2;
}
int main(void)
{
    usleep(200000);
    path_alpha(1000);
    path_beta(3000);
    usleep(300000);
    return 0;
}
"""

# 400 blocks of 100000 bytes from hold_them (line 4).
HOLD_PY = """\
import time
def hold_them(n):
    out = []
    for _ in range(n): out.append(bytearray(100000))
    return out
time.sleep(0.2)
held = hold_them(400)
time.sleep(0.3)
"""

# Device memory from two Python functions through ctypes, after a go on stdin.
CUDA_PY = """\
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
size, flags = ctypes.c_size_t, ctypes.c_ulonglong(0)
def grow(handles):
    for h in handles: lib.cuMemAlloc_v2(ctypes.byref(h), size(2 << 20))
def segments(handles):
    for h in handles: lib.cuMemCreate(ctypes.byref(h), size(20 << 20), None, flags)
a = [ctypes.c_uint64() for _ in range(8)]
b = [ctypes.c_uint64() for _ in range(3)]
print("ready", flush=True)
sys.stdin.readline()
grow(a)
segments(b)
for h in a[:5]: lib.cuMemFree_v2(h)
lib.cuMemRelease(b[0])
print("done", flush=True)
sys.stdin.readline()
"""


def _libc() -> str:
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split(None, 5)[5].strip() if len(line.split(None, 5)) == 6 else ""
            if os.path.basename(path) == "libc.so.6":
                return os.path.realpath(path)
    raise AssertionError("this Python maps no libc.so.6")


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    gcc = shutil.which("gcc")
    if gcc is None:
        skip_or_fail("gcc is not installed (apt-get install gcc)")
    d = shared_dir(prefix="gfxbpf-memory-")
    (d / "allocs.c").write_text(ALLOCS_C)
    # -O2 as distributions build: no frame pointers
    subprocess.run([gcc or "gcc", "-O2", "-g", "-o", str(d / "allocs"), str(d / "allocs.c")],
                   check=True, capture_output=True)  # fmt: skip
    (d / "shared.c").write_text(SHARED_C)
    subprocess.run([gcc or "gcc", "-O2", "-g", "-o", str(d / "shared"), str(d / "shared.c")],
                   check=True, capture_output=True)  # fmt: skip
    (d / "hold.py").write_text(HOLD_PY)
    (d / "device.py").write_text(CUDA_PY)
    cs.build_library(d / "lib")
    subprocess.run(["chmod", "-R", "a+rwX", str(d)], check=True)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def broker_policy(request: pytest.FixtureRequest) -> str:
    work: Path = request.getfixturevalue("work")
    libs = [_libc(), str(work / "lib" / cs.LIBNAME)]
    return policy_for(
        {"memstacks": {"users": [ALICE], "scope": "self", "libraries": libs}},
        limits={"map_bytes_per_user": 1 << 30},
    )


def _client(broker: BrokerProcess, *args: str) -> list[str]:
    return [VENV_PYTHON, "-m", "gfxbpf.client", "--socket", broker.socket, "--json", *args]


def _by_leaf_caller(path: Path) -> dict[str, int]:
    """Bytes per (caller;allocator) pair of frames, from the folded file."""
    out: dict[str, int] = {}
    for frames, n in stacks_of(path):
        key = ";".join(frames[-2:])
        out[key] = out.get(key, 0) + n
    return out


def _python_function(frames: list[str]) -> str:
    """The script's function a stack passes through (grow, segments), else the stack."""
    for x in frames:
        if x.startswith(("grow (", "segments (")):
            return x.split(" ")[0]
    return ";".join(frames)


@pytest.mark.parametrize("live", [False, True])
def test_c_program_bytes_per_stack(broker: BrokerProcess, work: Path, live: bool) -> None:
    """-O2, no frame pointers: 1000 x 100000 bytes kept, 3000 x 100000 freed."""
    out = work / f"c-{live}.folded"
    flag = "--memory-live" if live else "--memory"
    with held(ALICE, [str(work / "allocs")]) as target:
        go = release_on_attach(broker, "memstacks", target)
        r = run_as(ALICE, _client(broker, "profile", flag, "--pid", str(target.pid),
                                  "--duration", "60", "--format", "folded", "-o", str(out)),
                   timeout=120)  # fmt: skip
        go.join()
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    summary = json.loads(r.stdout)
    assert summary["unit"] == "bytes" and summary["program"] == "memstacks", summary
    got = _by_leaf_caller(out)
    kept, freed = got.get("keep_them;malloc", 0), got.get("free_them;malloc", 0)
    assert abs(kept - KEPT * SIZE) <= 0.05 * KEPT * SIZE, got
    if live:
        assert freed < 0.01 * KEPT * SIZE, got
    else:
        assert abs(freed - FREED * SIZE) <= 0.05 * FREED * SIZE, got
    assert all("main" in ";".join(f) for f, _ in stacks_of(out) if "keep_them" in f)


def test_another_users_allocations_are_never_counted(broker: BrokerProcess, work: Path) -> None:
    """Bob allocates in a loop through the same libc (probed in every process that
    maps it, following children): the kernel drops his calls at the uid test."""
    loop = "import time\nend = time.time() + 60\nwhile time.time() < end: bytearray(100000)"
    bob = run_as(BOB, [PYTHON, "-c", loop], background=True)  # setpriv execs: bob's own pid
    try:
        out = work / "c-bob.folded"
        with held(ALICE, [str(work / "allocs")]) as target:
            go = release_on_attach(broker, "memstacks", target)
            argv = ["profile", "--memory", "--pid", str(target.pid)]
            r = run_as(ALICE, _client(broker, *argv, "--format", "folded", "-o", str(out)))
            go.join()
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        summary = json.loads(r.stdout)
        assert summary["processes"] == [target.pid], summary["processes"]
        assert _by_leaf_caller(out).get("keep_them;malloc") == KEPT * SIZE  # alice's alone
    finally:
        bob.kill()
        bob.wait()


def test_paths_through_one_allocating_caller_count_apart(broker: BrokerProcess, work: Path) -> None:
    """alloc_inner calls malloc for path_alpha (1000 x 100000 bytes) and
    path_beta (3000 x): the rows hold the path above the caller, so each path
    has its own bytes. Keyed by the caller alone, the row's copies disagreed
    and its bytes showed under a [several call paths] frame (half of a
    PyTorch training script's, through c10::alloc_cpu)."""
    out = work / "c-shared.folded"
    with held(ALICE, [str(work / "shared")]) as target:
        go = release_on_attach(broker, "memstacks", target)
        argv = ["profile", "--memory", "--pid", str(target.pid), "--duration", "60"]
        r = run_as(ALICE, _client(broker, *argv, "--format", "folded", "-o", str(out)),
                   timeout=120)  # fmt: skip
        go.join()
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    got: dict[str, int] = {}
    for frames, n in stacks_of(out):
        key = ";".join(frames[-3:])
        got[key] = got.get(key, 0) + n
    alpha = got.get("path_alpha;alloc_inner;malloc", 0)
    beta = got.get("path_beta;alloc_inner;malloc", 0)
    assert abs(alpha - 1000 * SIZE) <= 0.05 * 1000 * SIZE, got
    assert abs(beta - 3000 * SIZE) <= 0.05 * 3000 * SIZE, got
    assert not any("[several call paths]" in f for f, _ in stacks_of(out)), got


def test_sampled_c_program_bytes_per_stack(broker: BrokerProcess, work: Path) -> None:
    """--sample-bytes 65536: ~1500 and ~4600 allocations recorded, each weighed by
    the bytes it stands for: the sums within 15% of the truth."""
    out = work / "c-sampled.folded"
    with held(ALICE, [str(work / "allocs")]) as target:
        go = release_on_attach(broker, "memstacks", target)
        argv = ["profile", "--memory", "--sample-bytes", "65536", "--pid", str(target.pid)]
        r = run_as(ALICE, _client(broker, *argv, "--format", "folded", "-o", str(out)))
        go.join()
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert any("sampled" in n for n in json.loads(r.stdout)["notes"])
    got = _by_leaf_caller(out)
    kept, freed = got.get("keep_them;malloc", 0), got.get("free_them;malloc", 0)
    assert abs(kept - KEPT * SIZE) <= 0.15 * KEPT * SIZE, got
    assert abs(freed - FREED * SIZE) <= 0.15 * FREED * SIZE, got


def test_python_allocations_show_under_their_lines(broker: BrokerProcess, work: Path) -> None:
    if not os.access(PYTHON, os.X_OK):
        skip_or_fail(f"{PYTHON} is not installed")
    out = work / "py.folded"
    # --memory: at the exit the interpreter's finalization frees what hold_them kept.
    argv = ["profile", "--memory", "--format", "folded", "-o", str(out)]
    r = run_as(ALICE, _client(broker, *argv, "--", PYTHON, str(work / "hold.py")), timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    under = sum(n for f, n in stacks_of(out) if any(x.startswith("hold_them (") for x in f))
    lines = {x for f, _ in stacks_of(out) for x in f if x.startswith("hold_them (")}
    top = sorted(stacks_of(out), key=lambda t: -t[1])[:5]
    assert abs(under - 400 * SIZE) <= 0.05 * 400 * SIZE, (under, lines, top, r.stdout[-3000:])
    assert any(x.endswith("hold.py:4)") for x in lines), lines


def _device_profile(broker: BrokerProcess, work: Path, flag: str) -> dict[tuple[str, str], int]:
    """device.py profiled with flag --cuda: bytes per (Python function, allocator)."""
    lib = str(work / "lib" / cs.LIBNAME)
    target = run_as(ALICE, [PYTHON, str(work / "device.py"), lib], background=True,
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert target.stdout is not None and target.stdin is not None
        assert target.stdout.readline().strip() == b"ready"
        before = attaches(broker, "memstacks")
        out = work / f"dev{flag}.folded"
        argv = ["profile", flag, "--cuda", "--pid", str(target.pid), "--duration", "60"]
        prof = run_as(ALICE, _client(broker, *argv, "--format", "folded", "-o", str(out)),
                      background=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        assert wait_until(lambda: attaches(broker, "memstacks") > before, 60, step=0.01)
        target.stdin.write(b"\n")  # the attach is live: allocate
        target.stdin.flush()
        assert target.stdout.readline().strip() == b"done"
        time.sleep(0.5)  # a live target: its copies are read while it runs
        target.stdin.write(b"\n")
        target.stdin.flush()
        target.wait(30)
        stdout, stderr = prof.communicate(timeout=120)
        assert prof.returncode == 0 and b"Traceback" not in stderr, stderr
        notes = json.loads(stdout)["notes"]
        assert any("caching allocator" in n for n in notes), notes
        return {(_python_function(f), f[-1]): n for f, n in stacks_of(out)}
    finally:
        target.kill()
        target.wait()


def test_device_memory_through_the_libcuda_standin(broker: BrokerProcess, work: Path) -> None:
    """Exact bytes per stack, and live bytes at the end, as the stand-in allocated them."""
    results = {flag: _device_profile(broker, work, flag) for flag in ("--memory", "--memory-live")}
    mib = 1 << 20
    assert results["--memory"] == {
        ("grow", "cuMemAlloc_v2"): 8 * 2 * mib,
        ("segments", "cuMemCreate"): 3 * 20 * mib,
    }, results
    assert results["--memory-live"] == {
        ("grow", "cuMemAlloc_v2"): 3 * 2 * mib,
        ("segments", "cuMemCreate"): 2 * 20 * mib,
    }, results
