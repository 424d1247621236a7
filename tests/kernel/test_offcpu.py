"""Off-CPU and wall-clock profiles (issue 27's acceptance, kernel half).

The broker runs as the unit runs it (user gfxbpf, CAP_BPF + CAP_PERFMON
only); gfxclient runs as gfxtest-alice over the Unix socket. The workload
is built -O2 without frame pointers: one thread sleeps 1.0 s in nanosleep
under stack A, waits 2.0 s on a futex under stack B (another thread wakes
it), then computes 1.0 s of wall-clock time under stack C. `--off-cpu`
must give A and B their time within 5% and C no wait (it may be preempted
on a busy host: that is CPU contention, not a wait, and has its own frame);
`--wall` must give A, B and C 1:2:1 within 5%.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gfxbpf.proto import pprof_pb2
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
    wait_until,
)
from tests.kernel.profiling import (
    attach_records,
    build_o2,
    held,
    last_attach_ms,
    profile,
    release_on_attach,
    stacks_of,
)
from tests.shared_python import build_shared_python

pytestmark = pytest.mark.kernel

HZ = 999
TOLERANCE = 0.05

# The workloads' clock (CLOCK_MONOTONIC, in seconds).
NOW_C = r"""
#include <time.h>
static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
"""

ABC_C = (
    r"""
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

static uint32_t word;
volatile unsigned long sink;
static double took_a, took_b, took_c;  /* each wait's and the spin's wall time, printed */
"""
    + NOW_C
    + r"""
__attribute__((noinline)) void sleep_in_a(void)
{
    struct timespec ts = {1, 0};
    double t0 = now();
    while (nanosleep(&ts, &ts)) sink++;
    took_a = now() - t0;
    sink++;
}
__attribute__((noinline)) void stack_a(void) { sleep_in_a(); sink++; }
static void *waker(void *arg)
{
    struct timespec ts = {2, 0};
    while (nanosleep(&ts, &ts)) sink++;
    __atomic_store_n(&word, 1, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, &word, FUTEX_WAKE_PRIVATE, 1, 0, 0, 0);
    return arg;
}
__attribute__((noinline)) void wait_in_b(void)
{
    double t0 = now();
    while (!__atomic_load_n(&word, __ATOMIC_SEQ_CST))
        syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 0, 0, 0, 0);
    took_b = now() - t0;
    sink++;
}
__attribute__((noinline)) void stack_b(void)
{
    pthread_t t;
    pthread_create(&t, 0, waker, 0);
    wait_in_b();
    pthread_join(t, 0);
    sink++;
}
__attribute__((noinline)) void spin_in_c(void)
{
    double t0 = now(), end = t0 + 1.0;
    while (now() < end)
        for (int i = 0; i < 1000; i++) sink += i;
    took_c = now() - t0;
}
__attribute__((noinline)) void stack_c(void) { spin_in_c(); sink++; }
int main(void)
{
    stack_a();
    stack_b();
    stack_c();
    fprintf(stderr, "ABC %.6f %.6f %.6f\n", took_a, took_b, took_c);
    return 0;
}
"""
)

# Sleeps argv[1] ms in nap(); then, given argv[2], execs it (with no
# argument: it then sleeps 1.5 s). As a setuid-root copy it is root's process.
NAP_EXEC_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
volatile unsigned long sink;
static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
__attribute__((noinline)) void nap(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    double t0 = now();
    while (nanosleep(&ts, &ts)) sink++;
    fprintf(stderr, "NAP %.6f\n", now() - t0);  /* longer than asked on a busy machine */
    sink++;
}
int main(int argc, char **argv)
{
    nap(argc > 1 ? atol(argv[1]) : 1500);
    if (argc > 2) execl(argv[2], argv[2], (char *)0);
    return 0;
}
"""

# THREADS threads that each wait ~1.1 ms at a time, for SECONDS: at the
# defaults (waits of 1 ms or more kept, 8 KiB copies) ~7,000 records a
# second; twice that overran the 1 MiB ring and a client that unwound each
# copy from scratch (issue 33).
NAPS_C = (
    r"""
#include <pthread.h>
#include <stdlib.h>
static double secs;
"""
    + NOW_C
    + r"""
__attribute__((noinline)) void nap(void)
{
    struct timespec ts = {0, 1100000};
    nanosleep(&ts, 0);
}
static void *napper(void *arg)
{
    double end = now() + secs;
    while (now() < end) nap();
    return arg;
}
int main(int argc, char **argv)
{
    int n = atoi(argv[1]);
    pthread_t t[64];
    secs = atof(argv[2]);
    for (int i = 0; i < n && i < 64; i++) pthread_create(&t[i], 0, napper, 0);
    for (int i = 0; i < n && i < 64; i++) pthread_join(t[i], 0);
    return 0;
}
"""
)
NAP_THREADS, NAP_SECONDS = 8, 2.0

# A Python program blocked 1.0 s in time.sleep under a known function.
PY_SLEEP = """\
import sys, time
def nap_here():
    t0 = time.monotonic()
    time.sleep(1.0)
    print(f"NAP {time.monotonic() - t0:.6f}", file=sys.stderr)
def caller():
    nap_here()
caller()
"""
PYTHON = "/usr/bin/python3"

# A: 1.0 s, B: 2.0 s, C: 1.0 s, each found by its innermost own function.
STACKS = {"A": "sleep_in_a", "B": "wait_in_b", "C": "spin_in_c"}


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    d = shared_dir(prefix="gfxbpf-offcpu-")
    os.chown(d, *ensure_user(ALICE))  # alice writes the profiles here
    gcc = shutil.which("gcc")
    if gcc is None:
        skip_or_fail("gcc is not installed (apt-get install gcc)")
        raise AssertionError  # unreachable
    build_o2(gcc, ABC_C, d / "abc", "-pthread")
    (d / "sleep.py").write_text(PY_SLEEP)
    (d / "sleep.py").chmod(0o644)
    build_o2(gcc, NAP_EXEC_C, d / "napexec")
    build_o2(gcc, NAPS_C, d / "naps", "-pthread")
    suid = build_o2(gcc, NAP_EXEC_C, d / "suidnap")
    os.chown(suid, 0, 0)  # a setuid-root program the user may run
    suid.chmod(0o4755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def broker_policy(request: pytest.FixtureRequest) -> str:
    return policy_for(
        {
            "offcpu": {"users": [ALICE, BOB], "scope": "self"},
            "stackcopy": {"users": [ALICE, BOB], "scope": "self", "max_frequency": HZ},
        },
        limits={"map_bytes_per_user": 1 << 30},
    )


def profile_of(
    broker: BrokerProcess, out: Path, *args: str, stderr: list[str] | None = None
) -> dict:
    return profile(broker, out, *args, env={"GFXBPF_DEBUG": "1"}, stderr=stderr)


def abc_took(stderr: list[str]) -> tuple[float, float, float]:
    """abc's own wall time (s) in A's nap, B's futex wait and C's spin: on a
    busy machine a wait lasts longer than asked (its wake-up waits for a CPU),
    and the profile must show what the waits took, not what they asked for."""
    line = next(x for x in stderr if x.startswith("ABC "))
    a, b, c = (float(v) for v in line.split()[1:])
    return a, b, c


def napped_for(stderr: list[str]) -> list[float]:
    """What each nap the programs print (NAP seconds) lasted, in order."""
    return [float(x.split()[1]) for x in stderr if x.startswith("NAP ")]


def seconds_under(stacks: list[tuple[list[str], int]], function: str, waits: bool) -> float:
    """Time (s) of the stacks through function; waits: only those ending in a
    [wait: ...] frame (not [preempted], not on the CPU)."""
    ns = sum(n for s, n in stacks if function in s and (not waits or s[-1].startswith("[wait:")))
    return ns / 1e9


def test_off_cpu_gives_each_wait_its_time_and_names_it(broker: BrokerProcess, work: Path) -> None:
    out = work / "abc-off.folded"
    err: list[str] = []
    summary = profile_of(broker, out, "--off-cpu", "--", str(work / "abc"), stderr=err)
    assert summary["mode"] == "off-cpu" and summary["unit"] == "nanoseconds", summary
    assert summary["exit_status"] == 0, summary
    stacks = stacks_of(out)
    a = seconds_under(stacks, STACKS["A"], waits=True)
    b = seconds_under(stacks, STACKS["B"], waits=True)
    c = seconds_under(stacks, STACKS["C"], waits=True)
    took_a, took_b, _ = abc_took(err)
    print(f"off-cpu: A {a:.4f} of {took_a:.4f} s, B {b:.4f} of {took_b:.4f} s, C {c:.4f} s")
    assert abs(a - took_a) <= took_a * TOLERANCE, (a, took_a, stacks)
    assert abs(b - took_b) <= took_b * TOLERANCE, (b, took_b, stacks)
    assert c <= 0.01, (c, stacks)  # computing: no wait (preemption is shown apart)
    # The waits are named by their system calls, below complete stacks.
    for frames, _ in stacks:
        if STACKS["A"] in frames:
            assert frames[-1] == "[wait: clock_nanosleep]", frames
        if STACKS["B"] in frames:
            assert frames[-1] == "[wait: futex]", frames
        if frames[-1].startswith("[wait:") and "abc" in frames[0]:
            assert "main" in frames or "start_thread" in frames, frames
    assert summary["off_cpu_ns"]["sleeping"] >= (took_a + took_b) * 1e9 * (1 - TOLERANCE), summary
    # COMMAND began after the attach: the held child's wait for the go (the
    # profiler's own Python, before the exec) counts nowhere, not in the
    # summary's times nor as a wait begun before the profile.
    assert sum(summary["off_cpu_ns"].values()) == summary["total"], summary
    assert summary["waits_begun_before"] == 0, summary
    assert not any("under way" in n for n in summary["notes"]), summary["notes"]


def test_thousands_of_short_waits_a_second_lose_no_copy_at_the_defaults(
    broker: BrokerProcess, work: Path
) -> None:
    out = work / "naps.folded"
    argv = (str(work / "naps"), str(NAP_THREADS), str(NAP_SECONDS))
    summary = profile_of(broker, out, "--off-cpu", "--", *argv)
    assert summary["exit_status"] == 0, summary
    # At most 1% of the ~14,500 waits lost on a loaded 2-CPU host (none on
    # an idle one). With 16 threads, 1 MiB and walks from scratch lost
    # 0.25-13% here; the fix 0-0.6% (12% at a load average of 35).
    waits = NAP_THREADS * NAP_SECONDS / 0.0011
    assert summary["lost"] <= 0.01 * waits, summary["notes"]
    # Every nap is there: the threads slept nearly all of their time, under nap().
    napped = seconds_under(stacks_of(out), "nap", waits=True)
    assert napped >= NAP_THREADS * NAP_SECONDS * 0.8, (napped, summary)


def test_wall_shows_a_b_c_as_long_as_they_lasted(broker: BrokerProcess, work: Path) -> None:
    out = work / "abc-wall.folded"
    err: list[str] = []
    argv = ["--wall", "--frequency", str(HZ), "--", str(work / "abc")]
    summary = profile_of(broker, out, *argv, stderr=err)
    assert summary["mode"] == "wall" and summary["time"] == "wall", summary
    stacks = stacks_of(out)
    a, b, c = (seconds_under(stacks, STACKS[k], waits=False) for k in "ABC")
    took = abc_took(err)  # about 1 : 2 : 1, longer on a busy machine
    print(f"wall: A {a:.4f}, B {b:.4f}, C {c:.4f} s of {took}")
    for shown, lasted in zip((a, b, c), took, strict=True):
        assert abs(shown - lasted) <= lasted * TOLERANCE, (a, b, c, took)
    # One [thread TID] frame under the process: the waker thread is apart from main's.
    threads = {s[1] for s, _ in stacks if s[0] == "abc"}
    assert len(threads) == 2 and all(t.startswith("[thread ") for t in threads), threads


@pytest.mark.parametrize("which", ["broker", "slow_broker"])
def test_another_users_waits_never_appear(
    request: pytest.FixtureRequest, work: Path, which: str
) -> None:
    """All of alice's processes: abc, held until the attachment is live (its
    waits begin after it), shows; bob's napping process never does. The slow
    broker takes 1 s longer to load, as on a loaded machine."""
    broker: BrokerProcess = request.getfixturevalue(which)
    bob = run_as(BOB, [str(work / "napexec"), "100000"], background=True)
    try:
        with held(ALICE, [str(work / "abc")]) as alice:
            out = work / "all.folded"
            go = release_on_attach(broker, "offcpu", alice)
            summary = profile_of(broker, out, "--off-cpu", "--duration", "4")
            go.join()
        if which == "slow_broker":
            assert last_attach_ms(broker, "offcpu") >= 1000
        assert alice.pid in summary["processes"], summary
        assert bob.pid not in summary["processes"], summary
        assert "napexec" not in out.read_text(), out.read_text()
    finally:
        bob.kill()
        bob.wait()


@pytest.mark.parametrize("which", ["broker", "slow_broker"])
def test_a_setuid_program_is_never_recorded(
    request: pytest.FixtureRequest, work: Path, which: str
) -> None:
    """napexec (the user's) naps 1 s, then execs the setuid-root suidnap,
    which naps 1.5 s under the same pid: the user's nap shows, root's never.
    The whole nap shows with a broker that loads 1 s slower too: -- COMMAND
    starts only once the attachment is live."""
    broker: BrokerProcess = request.getfixturevalue(which)
    assert os.stat(work / "suidnap").st_mode & 0o4000, "the test binary must be setuid"
    out = work / "suid.folded"
    err: list[str] = []
    summary = profile_of(
        broker,
        out,
        *("--off-cpu", "--", str(work / "napexec"), "1000", str(work / "suidnap")),
        stderr=err,
    )
    assert summary["exit_status"] == 0 and summary["duration_s"] >= 2.5, summary
    stacks = stacks_of(out)
    text = out.read_text()
    assert "suidnap" not in text, text
    own = sum(n for s, n in stacks if s[0] == "napexec" and "nap" in s) / 1e9
    (took,) = napped_for(err)[:1]  # the user's own nap; root's is not to be seen
    print(f"setuid: the user's own nap {own:.4f} s of {took:.4f} s")
    if abs(own - took) > took * TOLERANCE:  # shown in full under "Captured stdout"
        # What the profile said (lost records, notes) and the broker's last
        # audit records (attach, detach): where the wait went.
        audit = broker.audit_records()[-12:]
        print(json.dumps({"summary": summary, "stderr": err, "audit": audit}, indent=1))
    assert abs(own - took) <= took * TOLERANCE, (own, took, text)


def test_other_formats_carry_the_time(broker: BrokerProcess, work: Path) -> None:
    """pprof: an off_cpu sample type in nanoseconds; svg: wait frames in blue."""
    pb = work / "abc.pb.gz"
    argv = [VENV_PYTHON, "-m", "gfxbpf.client", "--socket", broker.socket, "profile"]
    r = run_as(ALICE, [*argv, "--off-cpu", "-o", str(pb), "--", str(work / "napexec"), "200"])
    assert r.returncode == 0, r.stderr
    # The total in time as people read it (ms or s), not a count of ns.
    total = re.search(r"^\d+\.\d{3} m?s off the CPU in \d+ stacks", r.stdout, re.M)
    assert total and "[wait: clock_nanosleep]" in r.stdout, r.stdout
    msg = pprof_pb2.Profile.FromString(gzip.decompress(pb.read_bytes()))
    types = [(msg.string_table[t.type], msg.string_table[t.unit]) for t in msg.sample_type]
    assert types == [("off_cpu", "nanoseconds")], types
    (took,) = napped_for(r.stderr.splitlines())
    waited = sum(s.value[0] for s in msg.sample) / 1e9
    assert abs(waited - took) <= took * TOLERANCE, (waited, took, msg.sample)
    svg = work / "abc.svg"
    r = run_as(ALICE, [*argv, "--off-cpu", "-o", str(svg), "--", str(work / "napexec"), "200"])
    assert r.returncode == 0, r.stderr
    assert 'fill="#5a96e6"' in svg.read_text()  # a wait's blue (flamegraph.py)


@pytest.mark.parametrize("build", ["static", "shared"])
def test_a_python_program_blocked_in_time_sleep_shows_its_function(
    broker: BrokerProcess, work: Path, build: str
) -> None:
    """The Python frames are walked at the wait's system call exit (gfx_python.h):
    the wait's stack has caller -> nap_here above [wait: clock_nanosleep].
    Debian's python3 has libpython linked in; a shared build's process is
    found by a return address into libpython's code on its stack."""
    if not os.access(PYTHON, os.X_OK):
        skip_or_fail(f"{PYTHON} is not installed")
    python = PYTHON
    if build == "shared":
        built = build_shared_python(work)
        if built is None:
            skip_or_fail("gcc or /usr/bin/python3-config is missing (apt-get install python3-dev)")
            return
        python = str(built)
    out = work / f"py-off-{build}.folded"
    err: list[str] = []
    summary = profile_of(broker, out, "--off-cpu", "--", python, str(work / "sleep.py"), stderr=err)
    (took,) = napped_for(err)
    stacks = stacks_of(out)

    def named(frames: list[str], name: str) -> int:
        return next((i for i, f in enumerate(frames) if f.split(" ", 1)[0] == name), -1)

    napped = sum(
        n
        for s, n in stacks
        if 0 <= named(s, "caller") < named(s, "nap_here") and s[-1] == "[wait: clock_nanosleep]"
    )
    print(f"python ({build}): time.sleep(1.0) {napped / 1e9:.4f} s of {took:.4f} s")
    assert abs(napped / 1e9 - took) <= took * TOLERANCE, (napped, took, stacks, summary)


def _in_syscall(pid: int, nr: int) -> bool:
    """Whether pid's thread is in system call nr now (/proc/PID/syscall, root)."""
    try:
        return Path(f"/proc/{pid}/syscall").read_text().split()[0] == str(nr)
    except (OSError, IndexError):
        return False


def test_a_wait_under_way_when_the_profile_begins_is_shown_at_its_end(
    broker: BrokerProcess, work: Path
) -> None:
    """napexec sleeps 5 s, begun before the profile: the wait is recorded at its
    end, from the attach on, marked as begun before, and counted in the summary."""
    began = time.time()  # the nap begins after this, and ends 5 s after it began
    napper = run_as(ALICE, [str(work / "napexec"), "5000"], background=True)
    try:
        assert wait_until(lambda: _in_syscall(napper.pid, 230), 10)  # clock_nanosleep
        out = work / "before.folded"
        summary = profile_of(broker, out, "--off-cpu", "--pid", str(napper.pid), "--duration", "20")
    finally:
        napper.kill()
        napper.wait()
    assert summary["waits_begun_before"] == 1, summary
    assert any("under way when the profile began" in n for n in summary["notes"]), summary
    stacks = stacks_of(out)
    marked = [
        (s, n) for s, n in stacks if s[-1] == "[wait: clock_nanosleep, began before the profile]"
    ]
    assert len(marked) == 1, stacks
    frames, ns = marked[0]
    assert "nap" in frames and "main" in frames, frames
    # From the attach (audited once live) to the wake-up, never more than the 5 s.
    live = attach_records(broker, "offcpu")[-1]["time"]
    attached = dt.datetime.fromisoformat(live.replace("Z", "+00:00")).timestamp()
    at_least = (began + 5.0 - attached - 0.05) * 1e9  # the audit time is to the ms
    assert at_least <= ns <= 5.0e9, (ns, at_least)
