"""`gfxclient profile --locks` and `--off-cpu --wakers` (issue 40's
acceptance, kernel half).

The broker runs as the unit runs it (user gfxbpf, CAP_BPF + CAP_PERFMON
only); gfxclient runs as gfxtest-alice over the Unix socket. The workload is
built -O2 without frame pointers: four threads, two per global mutex. Each
round, a holder (hold_a, hold_b) locks its mutex, lets its waiter (wait_a,
wait_b) block on it, waits until the mutex says a waiter is queued, holds it
40 ms more, and releases it; lock_a is handed over 3x as many times as lock_b,
so it sees 3x the waiting time. lock_b's holder rests 80 ms between rounds,
so both pairs run over the same second and the scheduling delays of a
loaded machine weigh on both alike. `--locks` must name both by their symbols, give 3:1
within 10%, and show hold_a and hold_b as the holders that released them.

`--off-cpu --wakers`: thread A waits on a condition variable that thread B
signals in signal_a every 50 ms; B's signal_a is A's waker for >= 95% of
A's waiting time. A wait ended by another user's process (a FIFO bob writes
to) or by the kernel (a timer) shows one marker frame, never their stacks.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import skip_or_fail
from tests.kernel.brokerenv import (
    ALICE,
    BOB,
    BrokerProcess,
    ensure_user,
    policy_for,
    run_as,
    shared_dir,
)
from tests.kernel.profiling import build_o2, held, profile, release_on_attach, stacks_of

pytestmark = pytest.mark.kernel

ROUNDS = 20
TOLERANCE = 0.10

# argv[1]: rounds. lock_b's pair hands it over that many times, lock_a's 3x as many.
LOCKS_C = r"""
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

pthread_mutex_t lock_a = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t lock_b = PTHREAD_MUTEX_INITIALIZER;
volatile unsigned long sink;

struct pair {
    pthread_mutex_t *m;
    long hold_ms, rest_ms;  /* held per round; between rounds, not held */
    int rounds;
    int go, done;  /* the round the holder began, the round the waiter ended */
};
static struct pair a = {&lock_a, 40, 0}, b = {&lock_b, 40, 80};

static void nap_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts)) sink++;
}
/* The holder's side: lock, let the waiter queue, hold, release. */
static void hold(struct pair *p, int r)
{
    pthread_mutex_lock(p->m);
    __atomic_store_n(&p->go, r, __ATOMIC_SEQ_CST);
    /* glibc marks the mutex 2 (contended) as a waiter goes to sleep on it */
    while (__atomic_load_n(&p->m->__data.__lock, __ATOMIC_SEQ_CST) != 2)
        nap_us(50);
    nap_us(p->hold_ms * 1000);
    pthread_mutex_unlock(p->m);
    sink++;
}
__attribute__((noinline)) void hold_a(int r) { hold(&a, r); sink++; }
__attribute__((noinline)) void hold_b(int r) { hold(&b, r); sink++; }
static void wait_turn(struct pair *p, int r)
{
    while (__atomic_load_n(&p->go, __ATOMIC_SEQ_CST) != r)
        nap_us(50);
    pthread_mutex_lock(p->m);
    pthread_mutex_unlock(p->m);
    __atomic_store_n(&p->done, r, __ATOMIC_SEQ_CST);
}
__attribute__((noinline)) void wait_a(int r) { wait_turn(&a, r); sink++; }
__attribute__((noinline)) void wait_b(int r) { wait_turn(&b, r); sink++; }

static void *holder(void *arg)
{
    struct pair *p = arg;
    for (int r = 1; r <= p->rounds; r++) {
        if (p == &a) hold_a(r); else hold_b(r);
        while (__atomic_load_n(&p->done, __ATOMIC_SEQ_CST) != r)
            nap_us(50);
        nap_us(p->rest_ms * 1000);
    }
    return 0;
}
static void *waiter(void *arg)
{
    struct pair *p = arg;
    for (int r = 1; r <= p->rounds; r++) {
        if (p == &a) wait_a(r); else wait_b(r);
    }
    return 0;
}
int main(int argc, char **argv)
{
    pthread_t t[4];
    b.rounds = argc > 1 ? atoi(argv[1]) : 10;
    a.rounds = 3 * b.rounds;
    pthread_create(&t[0], 0, holder, &a);
    pthread_create(&t[1], 0, waiter, &a);
    pthread_create(&t[2], 0, holder, &b);
    pthread_create(&t[3], 0, waiter, &b);
    for (int i = 0; i < 4; i++) pthread_join(t[i], 0);
    return 0;
}
"""


# Thread A (wait_for_signal) waits for each of argv[1] rounds, which thread B
# (signal_a) signals after 50 ms.
COND_C = r"""
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int ready, rounds;
volatile unsigned long sink;

__attribute__((noinline)) void wait_for_signal(int r)
{
    pthread_mutex_lock(&m);
    while (ready < r)
        pthread_cond_wait(&cv, &m);
    pthread_mutex_unlock(&m);
    sink++;
}
__attribute__((noinline)) void signal_a(int r)
{
    pthread_mutex_lock(&m);
    ready = r;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&m);
    sink++;
}
static void *thread_a(void *arg)
{
    for (int r = 1; r <= rounds; r++) wait_for_signal(r);
    return arg;
}
static void *thread_b(void *arg)
{
    struct timespec ts = {0, 50 * 1000000L};
    for (int r = 1; r <= rounds; r++) {
        nanosleep(&ts, 0);
        signal_a(r);
    }
    return arg;
}
int main(int argc, char **argv)
{
    pthread_t a, b;
    rounds = argc > 1 ? atoi(argv[1]) : 20;
    pthread_create(&a, 0, thread_a, 0);
    pthread_create(&b, 0, thread_b, 0);
    pthread_join(a, 0);
    pthread_join(b, 0);
    return 0;
}
"""

# Naps 300 ms (a timer wakes it), then reads the FIFO argv[1] to its end.
FIFO_C = r"""
#include <fcntl.h>
#include <time.h>
#include <unistd.h>
volatile unsigned long sink;
__attribute__((noinline)) void nap(void)
{
    struct timespec ts = {0, 300 * 1000000L};
    while (nanosleep(&ts, &ts)) sink++;
    sink++;
}
__attribute__((noinline)) void read_fifo(const char *path)
{
    char buf[64];
    int fd = open(path, O_RDONLY);
    while (read(fd, buf, sizeof buf) > 0) sink++;
    close(fd);
    sink++;
}
int main(int argc, char **argv)
{
    nap();
    read_fifo(argv[1]);
    return 0;
}
"""


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    d = shared_dir(prefix="gfxbpf-locks-")
    os.chown(d, *ensure_user(ALICE))  # alice writes the profiles here
    gcc = shutil.which("gcc")
    if gcc is None:
        skip_or_fail("gcc is not installed (apt-get install gcc)")
        raise AssertionError  # unreachable
    build_o2(gcc, LOCKS_C, d / "twolocks", "-pthread")
    build_o2(gcc, COND_C, d / "condwait", "-pthread")
    build_o2(gcc, FIFO_C, d / "fifowait", "-pthread")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def broker_policy(request: pytest.FixtureRequest) -> str:
    return policy_for(
        {
            "locks": {"users": [ALICE, BOB], "scope": "self"},
            "offwake": {"users": [ALICE, BOB], "scope": "self"},
        },
        limits={"map_bytes_per_user": 1 << 30},
    )


def _lock(summary: dict, name: str) -> dict:
    rows = [row for row in summary["locks"] if row["lock"] == name]
    assert len(rows) == 1, summary["locks"]
    return rows[0]


def test_locks_names_both_mutexes_with_their_waiting_time_and_holders(
    broker: BrokerProcess, work: Path
) -> None:
    out = work / "locks.folded"
    summary = profile(broker, out, "--locks", "--", str(work / "twolocks"), str(ROUNDS))
    assert summary["mode"] == "locks" and summary["exit_status"] == 0, summary
    a, b = _lock(summary, "lock_a"), _lock(summary, "lock_b")
    assert a["waits"] == 3 * ROUNDS and b["waits"] == ROUNDS, summary["locks"]
    ratio = a["wait_ns"] / b["wait_ns"]
    assert abs(ratio - 3.0) <= 3.0 * TOLERANCE, (ratio, summary["locks"])
    # Each wait ended by its holder's release: the holders carry that time.
    assert a["released_ns"] >= 0.95 * a["wait_ns"], a
    stacks = stacks_of(out)
    for lock, holder, waiter in (("lock_a", "hold_a", "wait_a"), ("lock_b", "hold_b", "wait_b")):
        mine = [(s, n) for s, n in stacks if s[1] == f"[lock {lock}]"]
        waited = sum(n for s, n in mine if s[2] == "[waiters]" and waiter in s)
        released = sum(n for s, n in mine if s[2] == "[holders, at release]" and holder in s)
        total = _lock(summary, lock)["wait_ns"]
        assert waited >= 0.95 * total, (lock, waited, total, mine)
        assert released >= 0.95 * total, (lock, released, total, mine)
        assert all(s[-1] in ("[wait: futex]", "[wake: futex]") for s, _ in mine), mine


def test_text_report_and_other_formats(broker: BrokerProcess, work: Path) -> None:
    """The report names the locks and their holders; pprof and svg are written."""
    from tests.kernel.brokerenv import VENV_PYTHON

    argv = [VENV_PYTHON, "-m", "gfxbpf.client", "--socket", broker.socket, "profile", "--locks"]
    svg = work / "locks.svg"
    r = run_as(ALICE, [*argv, "-o", str(svg), "--", str(work / "twolocks"), "5"])
    assert r.returncode == 0, r.stderr
    released = [line for line in r.stdout.splitlines() if "released by:" in line]
    assert "lock_a (pid" in r.stdout and any("<- hold_a" in x for x in released), r.stdout
    assert "[lock lock_b]" in svg.read_text()
    pb = work / "locks.pb.gz"
    r = run_as(ALICE, [*argv, "-o", str(pb), "--", str(work / "twolocks"), "5"])
    assert r.returncode == 0 and pb.stat().st_size > 0, r.stderr


def test_another_users_locks_never_appear(broker: BrokerProcess, work: Path) -> None:
    """All of alice's processes: her twolocks shows; bob's, contending at the
    same time, never does, neither as waiter nor as holder."""
    bob = run_as(BOB, [str(work / "twolocks"), "200"], background=True)
    try:
        with held(ALICE, [str(work / "twolocks"), "10"]) as alice:
            out = work / "all.folded"
            go = release_on_attach(broker, "locks", alice)
            summary = profile(broker, out, "--locks", "--duration", "3")
            go.join()
        assert alice.pid in summary["processes"], summary
        assert bob.pid not in summary["processes"], summary
        assert alice.pid in {row["pid"] for row in summary["locks"]}, summary["locks"]
        assert bob.pid not in {row["pid"] for row in summary["locks"]}, summary["locks"]
        assert bob.poll() is None  # it was contending all along
    finally:
        bob.kill()
        bob.wait()


def _waker(frames: list[str]) -> list[str]:
    """The waker's frames of a --wakers stack (after `--`), innermost first."""
    return frames[frames.index("--") + 1 :] if "--" in frames else []


def test_wakers_name_the_signalling_function(broker: BrokerProcess, work: Path) -> None:
    out = work / "wakers.folded"
    summary = profile(
        broker, out, "--off-cpu", "--wakers", "--", str(work / "condwait"), str(ROUNDS)
    )
    assert summary["program"] == "offwake" and summary["exit_status"] == 0, summary
    stacks = stacks_of(out)
    waited = [(s, n) for s, n in stacks if "wait_for_signal" in s]
    total = sum(n for _, n in waited)
    by_b = sum(n for s, n in waited if "signal_a" in _waker(s) and "thread_b" in _waker(s))
    assert total >= ROUNDS * 40e6, (total, stacks)  # ~50 ms a round
    assert by_b >= 0.95 * total, (by_b, total, waited)


def test_wakers_outside_your_scope_are_one_marker_frame(broker: BrokerProcess, work: Path) -> None:
    """alice's fifowait naps (the kernel's timer wakes it), then reads a FIFO
    that bob writes to after 0.5 s: bob's process is a marker, never a stack."""
    fifo = work / "fifo"
    os.mkfifo(fifo)
    fifo.chmod(0o666)
    # bob opens the FIFO (waiting for alice's reader), waits 0.5 s, then writes.
    writer = f"exec 3>{fifo}; sleep 0.5; echo hello >&3"
    bob = run_as(BOB, ["sh", "-c", writer], background=True)
    try:
        out = work / "fifo.folded"
        summary = profile(
            broker, out, "--off-cpu", "--wakers", "--", str(work / "fifowait"), str(fifo)
        )
        assert summary["exit_status"] == 0, summary
    finally:
        bob.kill()
        bob.wait()
    stacks = stacks_of(out)
    read = [(s, n) for s, n in stacks if "read_fifo" in s and s[-1] != "[preempted]"]
    by_bob = sum(n for s, n in read if _waker(s) == ["[woken by another user's process]"])
    assert by_bob >= 0.4e9 and by_bob >= 0.9 * sum(n for _, n in read), read
    napped = [(s, n) for s, n in stacks if "nap" in s and s[-1] != "[preempted]"]
    by_kernel = sum(n for s, n in napped if _waker(s) == ["[woken by the kernel]"])
    assert by_kernel >= 0.9 * sum(n for _, n in napped) and by_kernel >= 0.25e9, out.read_text()
    # Nothing of bob's: no process of his, no frame of sh or sleep.
    assert bob.pid not in summary["processes"], summary
    for frames, _ in stacks:
        waker = _waker(frames)
        assert len(waker) <= 1 or frames[0] == waker[-1] == "fifowait", frames
