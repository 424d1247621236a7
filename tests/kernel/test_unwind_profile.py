"""Complete stacks without frame pointers (issue 22's acceptance, kernel half).

The broker runs as the unit runs it (user gfxbpf, CAP_BPF + CAP_PERFMON
only); gfxclient runs as gfxtest-alice over the Unix socket. The workloads
are built the way distributions build (-O2, no frame pointers) or are
Debian's own binaries (xz, python3): `gfxclient profile` takes stack copies
(program stackcopy) and unwinds them with the files' call-frame information.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.unwind_profile import CHAIN_C  # main -> chain_a -> ... -> chain_leaf, -O2
from gfxbpf.catalog.stack_copies import MAX_STACK_BYTES
from tests.c_programs import SIGNAL_C
from tests.conftest import skip_or_fail
from tests.kernel.brokerenv import (
    ALICE,
    BOB,
    VENV_PYTHON,
    BrokerProcess,
    ensure_user,
    policy_for,
    run_as,
    shared_dir,
)
from tests.kernel.profiling import (
    attach_records,
    build_o2,
    profile,
    release_on_attach,
    share,
    stacks_of,
)
from tests.kernel.rawclient import kernel_looking_text

pytestmark = pytest.mark.kernel

MAX_HZ = 999
CHAIN = ("main", "chain_a", "chain_b", "chain_c", "chain_d", "chain_leaf")


# A shared-library function called from two code paths, -O2 both sides.
LIB_C = r"""
volatile unsigned long lib_sink;
__attribute__((noinline)) void fake_launch(unsigned long x) { lib_sink += x; }
"""
# With a third argument: the calls again for each line of stdin, "done" after.
CALLER_C = r"""
#include <stdio.h>
#include <stdlib.h>
void fake_launch(unsigned long x);
volatile unsigned long sink;
__attribute__((noinline)) void do_a(unsigned long i) { fake_launch(i); sink++; }
__attribute__((noinline)) void run_a(unsigned long i) { do_a(i); sink++; }
__attribute__((noinline)) void do_b(unsigned long i) { fake_launch(i * 3); sink++; }
__attribute__((noinline)) void run_b(unsigned long i) { do_b(i); sink++; }
int main(int argc, char **argv)
{
    unsigned long na = strtoul(argv[1], 0, 10), nb = strtoul(argv[2], 0, 10);
    char line[16];
    while (argc < 4 || fgets(line, sizeof(line), stdin)) {
        for (unsigned long i = 0; i < na; i++) run_a(i);
        for (unsigned long i = 0; i < nb; i++) run_b(i);
        if (argc < 4)
            return 0;
        puts("done");
        fflush(stdout);
    }
    return 0;
}
"""
# Two paths through one shared caller, -O2: path_alpha and path_beta both
# call launch_inner, the only caller of fake_launch (the GPU launch case:
# every launch passes through cudaLaunchKernel).
SHARED_C = r"""
#include <stdlib.h>
void fake_launch(unsigned long x);
volatile unsigned long sink;
__attribute__((noinline)) void launch_inner(unsigned long n)
{
    for (unsigned long i = 0; i < n; i++) fake_launch(i);
    sink++;
}
__attribute__((noinline)) void path_alpha(unsigned long n) { launch_inner(n); sink++; }
__attribute__((noinline)) void path_beta(unsigned long n) { launch_inner(n); sink += 2; }
int main(int argc, char **argv)
{
    path_alpha(strtoul(argv[1], 0, 10));
    path_beta(strtoul(argv[2], 0, 10));
    return 0;
}
"""

# Twelve frames of 1 KiB each between main and the spinning leaf: a sample's
# stack is ~12.5 KiB deep, past an 8 KiB copy and within a 16 KiB one.
DEEP_C = r"""
#include <stdlib.h>
#include <time.h>
volatile unsigned long sink;
static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
__attribute__((noinline)) void spin(double seconds)
{
    double end = now() + seconds;
    while (now() < end)
        for (int i = 0; i < 10000; i++) sink += i;
}
__attribute__((noinline)) void deep(int level, double seconds)
{
    volatile char pad[1024];
    pad[0] = level;
    pad[1023] = level;
    if (level)
        deep(level - 1, seconds);
    else
        spin(seconds);
    sink += pad[0] + pad[1023];
}
int main(int argc, char **argv) { deep(11, atof(argv[1])); return 0; }
"""

PY_LOOP = (
    "import time\n"
    "def inner(n):\n"
    "    s = 0\n"
    "    for i in range(n):\n"
    "        s += i * i\n"
    "    return s\n"
    "def outer():\n"
    "    end = time.process_time() + 2.0\n"
    "    while time.process_time() < end:\n"
    "        inner(20000)\n"
    "outer()\n"
)


def _need(path: str) -> str:
    if not os.access(path, os.X_OK):
        skip_or_fail(f"{path} is not installed")
    return path


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    d = shared_dir(prefix="gfxbpf-unwind-")
    os.chown(d, *ensure_user(ALICE))  # alice writes the profiles here
    gcc = shutil.which("gcc")
    if gcc is None:
        skip_or_fail("gcc is not installed (apt-get install gcc)")
        raise AssertionError  # unreachable
    build_o2(gcc, CHAIN_C, d / "chain")
    build_o2(gcc, SIGNAL_C, d / "signal")
    build_o2(gcc, DEEP_C, d / "deep")
    build_o2(gcc, LIB_C, d / "liblaunch.so", "-shared", "-fPIC")
    build_o2(gcc, CALLER_C, d / "caller", f"-L{d}", "-llaunch", "-Wl,-rpath,$ORIGIN")
    build_o2(gcc, SHARED_C, d / "shared", f"-L{d}", "-llaunch", "-Wl,-rpath,$ORIGIN")
    (d / "random.bin").write_bytes(os.urandom(8 << 20))
    os.chown(d / "random.bin", *ensure_user(ALICE))  # xz gives its output the input's owner
    (d / "loop.py").write_text(PY_LOOP)
    (d / "loop.py").chmod(0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def broker_policy(request: pytest.FixtureRequest) -> str:
    work: Path = request.getfixturevalue("work")
    lib = {"users": [ALICE], "scope": "self", "libraries": [str(work / "liblaunch.so")]}
    return policy_for(
        {
            "profile": {"users": [ALICE, BOB], "scope": "self", "max_frequency": MAX_HZ},
            "stackcopy": {"users": [ALICE, BOB], "scope": "self", "max_frequency": MAX_HZ},
            "ustacks": lib,
            "ustackcopy": lib,
        },
        limits={"map_bytes_per_user": 1 << 30},
    )


def profile_of(broker: BrokerProcess, out: Path, *command: str, hz: int = 499) -> dict:
    summary = profile(
        broker, out, "--frequency", str(hz), "--", *command, env={"GFXBPF_DEBUG": "1"}
    )
    assert summary["program"] == "stackcopy" and summary["exit_status"] == 0, summary
    return summary


def _holds_in_order(frames: list[str], chain: tuple[str, ...]) -> bool:
    """chain appears as consecutive frames, root first."""
    n = len(chain)
    return any(tuple(frames[i : i + n]) == chain for i in range(len(frames) - n + 1))


def test_o2_program_without_frame_pointers_has_its_whole_chain(
    broker: BrokerProcess, work: Path
) -> None:
    out = work / "chain.folded"
    profile_of(broker, out, str(work / "chain"), "1500")
    stacks = stacks_of(out)
    assert share(stacks, lambda s: _holds_in_order(s, CHAIN)) >= 0.95, stacks


def test_debian_xz_reaches_libc_start_main(broker: BrokerProcess, work: Path) -> None:
    xz = _need("/usr/bin/xz")
    out = work / "xz.folded"
    profile_of(broker, out, xz, "-9", "-k", "-f", "-T1", str(work / "random.bin"))
    stacks = stacks_of(out)
    user = [(s, n) for s, n in stacks if s[-1] != "[kernel]" or len(s) > 2]
    reached = share(user, lambda s: any(f.startswith("__libc_start_main") for f in s))
    assert reached >= 0.95, stacks


def test_debian_python_reaches_py_bytes_main_without_garbage_towers(
    broker: BrokerProcess, work: Path
) -> None:
    python = _need("/usr/bin/python3")
    out = work / "py.folded"
    profile_of(broker, out, python, str(work / "loop.py"))
    stacks = stacks_of(out)
    assert share(stacks, lambda s: "Py_BytesMain" in s) >= 0.95, stacks

    def tower(frames: list[str]) -> bool:
        return any(len(set(frames[i : i + 8])) == 1 for i in range(len(frames) - 7))

    assert share(stacks, tower) < 0.01, [s for s in stacks if tower(s[0])][:5]


def _calls_by_path(broker: BrokerProcess, work: Path, name: str, na: int, nb: int) -> dict:
    """--stacks-at fake_launch on `work/name na nb`: calls per path from main."""
    out = work / f"{name}.folded"
    argv = [VENV_PYTHON, "-m", "gfxbpf.client", "--socket", broker.socket, "--json", "profile"]
    argv += ["--stacks-at", f"{work / 'liblaunch.so'}:fake_launch", "--format", "folded"]
    argv += ["-o", str(out), "--", str(work / name), str(na), str(nb)]
    r = run_as(ALICE, argv, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["total"] == na + nb, r.stdout
    rooted = _rooted(out)
    # ... and below main, the start code: the whole stack was unwound.
    assert all("__libc_start_main" in ";".join(f) for f, _ in stacks_of(out)), out.read_text()
    assert kernel_looking_text(r.stdout + r.stderr + out.read_text()) == []
    return rooted


def _rooted(out: Path) -> dict[str, int]:
    """The folded stacks from main on, summed."""
    rooted: dict[str, int] = {}
    for frames, n in stacks_of(out):
        assert "main" in frames, frames
        key = ";".join(frames[frames.index("main") :])
        rooted[key] = rooted.get(key, 0) + n
    return rooted


# caller: two paths with callers of their own; shared: two paths through one
# shared caller (launch_inner calls fake_launch from one return address for
# both, so the rows the kernel counts must still tell them apart).
@pytest.mark.parametrize(
    ("program", "path_a", "path_b"),
    [
        ("caller", "run_a;do_a", "run_b;do_b"),
        ("shared", "path_alpha;launch_inner", "path_beta;launch_inner"),
    ],
    ids=["own-callers", "shared-caller"],
)
def test_stacks_at_counts_each_whole_path_exactly(
    broker: BrokerProcess, work: Path, program: str, path_a: str, path_b: str
) -> None:
    na, nb = 1000, 3000
    assert _calls_by_path(broker, work, program, na, nb) == {
        f"main;{path_a};fake_launch": na,
        f"main;{path_b};fake_launch": nb,
    }


def test_the_next_stacks_at_profile_of_the_same_process_counts_exactly(
    broker: BrokerProcess, work: Path
) -> None:
    """ustackcopy is kept warm too. Its calls table is frozen, so the rows of a
    profile hold its own start (`since`): a second --stacks-at profile of the
    same process, on the instance the first left parked, counts exactly its
    own calls (the first one's are not counted again) and unwinds each row
    (a row's copies start again at its first call)."""
    na, nb = 1000, 3000
    pipe = subprocess.PIPE
    argv = [str(work / "caller"), str(na), str(nb), "rounds"]
    target = run_as(ALICE, argv, background=True, stdin=pipe, stdout=pipe)
    try:
        before = len(attach_records(broker, "ustackcopy"))
        for i in range(2):
            out = work / f"calls-again-{i}.folded"
            argv = [VENV_PYTHON, "-m", "gfxbpf.client", "--socket", broker.socket, "--json"]
            argv += ["profile", "--stacks-at", f"{work / 'liblaunch.so'}:fake_launch"]
            argv += ["--pid", str(target.pid), "--duration", "2", "--format", "folded"]
            go = release_on_attach(broker, "ustackcopy", target)
            r = run_as(ALICE, argv + ["-o", str(out)], timeout=300)
            go.join()
            assert r.returncode == 0, r.stderr
            assert target.stdout.readline() == b"done\n"
            assert json.loads(r.stdout)["total"] == na + nb, r.stdout
            assert _rooted(out) == {
                "main;run_a;do_a;fake_launch": na,
                "main;run_b;do_b;fake_launch": nb,
            }, out.read_text()
    finally:
        target.kill()
        target.wait()
    second = attach_records(broker, "ustackcopy")[before:][-1]
    assert second["warm"] is True, second


def test_samples_in_a_signal_handler_reach_main(broker: BrokerProcess, work: Path) -> None:
    out = work / "signal.folded"
    profile_of(broker, out, str(work / "signal"), "1500000000")
    in_handler = [(s, n) for s, n in stacks_of(out) if "handler_spin" in s]
    chain = ("main", "outer")
    reached = share(in_handler, lambda s: _holds_in_order([f for f in s if f in chain], chain)
                    and s[-2:] == ["on_signal", "handler_spin"])  # fmt: skip
    assert reached >= 0.95, in_handler


def test_another_users_process_never_appears(broker: BrokerProcess, work: Path) -> None:
    bob = run_as(BOB, [str(work / "chain"), "100000"], background=True)
    try:
        out = work / "all.folded"
        argv = [VENV_PYTHON, "-m", "gfxbpf.client", "--socket", broker.socket, "--json"]
        argv += ["profile", "--duration", "2", "--frequency", "499", "-o", str(out)]
        alice = run_as(ALICE, [str(work / "chain"), "100000"], background=True)
        try:
            r = run_as(ALICE, argv, timeout=120)
        finally:
            alice.kill()
            alice.wait()
        assert r.returncode == 0, r.stderr
        summary = json.loads(r.stdout)
        assert alice.pid in summary["processes"] and bob.pid not in summary["processes"]
        assert kernel_looking_text(r.stdout + r.stderr + out.read_text()) == []
    finally:
        bob.kill()
        bob.wait()


def test_the_policy_caps_the_stack_copy_size(work: Path) -> None:
    """max_stack_bytes = 1024: no record carries more stack than that; a client
    may ask for less (params.stack_bytes), and asking for more is refused."""
    text = policy_for(
        {"stackcopy": {"users": [ALICE], "scope": "self", "max_stack_bytes": 1024}},
        limits={"map_bytes_per_user": 1 << 30},
    )
    script = work / "sizes.py"
    script.write_text(
        "import os, struct, subprocess, sys\n"
        "from gfxbpf.client.broker import Broker\n"
        "b = Broker.connect(socket=os.environ['SOCK'], via='fd')\n"
        "p = subprocess.Popen([sys.argv[1], '3'])\n"
        "a = b.attach('stackcopy', pid=p.pid, frequency=499, stack_bytes=int(sys.argv[2]))\n"
        "ring = a.open_events('stack_copies')\n"
        "sizes = []\n"
        "while p.poll() is None:\n"
        "    sizes += [struct.unpack_from('<4I', r)[3] for r in ring.poll_raw(0.1)]\n"
        "print(len(sizes), max(sizes), min(sizes))\n"
    )
    script.chmod(0o644)
    with BrokerProcess.start(text) as b:
        sizes = {}
        for asked in (0, 512):  # 0: the policy's cap
            # `deep`, not `chain`: a copy ends at the first page it cannot read,
            # and above chain's few frames may lie an untouched page of ASLR's
            # gap below exec's strings (CI saw 856 and 792 bytes). deep spins
            # under 12 KiB of written frames.
            r = run_as(ALICE, [VENV_PYTHON, str(script), str(work / "deep"), str(asked)],
                       env={"SOCK": b.socket})  # fmt: skip
            assert r.returncode == 0, r.stderr
            n, sizes[asked], _smallest = map(int, r.stdout.split())
            assert n > 20, r.stdout
        argv = [VENV_PYTHON, "-m", "gfxbpf.client", "--socket", b.socket, "profile"]
        argv += ["--stack-bytes", "2048", "--", str(work / "chain"), "10"]
        over = run_as(ALICE, argv, timeout=120)
    assert sizes == {0: 1024, 512: 512}, sizes
    assert over.returncode != 0 and "max_stack_bytes" in over.stderr + over.stdout, over.stderr


def test_a_deeper_copy_reaches_main_where_the_policy_allows_it(work: Path) -> None:
    """max_stack_bytes = 16384: --stack-bytes 16384 copies a 12.5 KiB deep stack
    whole, where the default 8 KiB copy ends short (and the summary says how
    to copy more); without the policy's key the larger copy is refused."""
    entry = {"users": [ALICE], "scope": "self", "max_frequency": MAX_HZ}
    limits = {"map_bytes_per_user": 1 << 30}
    reached: dict[str, float] = {}
    notes: dict[str, list[str]] = {}
    with BrokerProcess.start(
        policy_for({"stackcopy": {**entry, "max_stack_bytes": 16384}}, limits=limits)
    ) as b:
        for size in ("8192", "16384"):
            out = work / f"deep-{size}.folded"
            summary = profile(b, out, "--frequency", "499", "--stack-bytes", size,
                              "--", str(work / "deep"), "1.5")  # fmt: skip
            reached[size] = share(stacks_of(out), lambda s: "main" in s)
            notes[size] = summary["notes"]
    assert reached["8192"] < 0.05 and reached["16384"] >= 0.95, reached
    assert any(f"--stack-bytes {MAX_STACK_BYTES}" in n for n in notes["8192"]), notes
    assert not any("stack copy too short" in n for n in notes["16384"]), notes
    with BrokerProcess.start(policy_for({"stackcopy": entry}, limits=limits)) as b:
        argv = [VENV_PYTHON, "-m", "gfxbpf.client", "--socket", b.socket, "profile"]
        argv += ["--stack-bytes", "16384", "--", str(work / "deep"), "0.2"]
        refused = run_as(ALICE, argv, timeout=120)
    assert refused.returncode == 3, refused.stderr  # denied by the policy
    assert "max_stack_bytes" in refused.stderr and "Traceback" not in refused.stderr
