"""`gfxclient profile --locks` (issue 40's acceptance, kernel half).

The broker runs as the unit runs it (user gfxbpf, CAP_BPF + CAP_PERFMON
only); gfxclient runs as gfxtest-alice over the Unix socket. The workload is
built -O2 without frame pointers: four threads, two per global mutex. Each
round, a holder (hold_a, hold_b) locks its mutex, lets its waiter (wait_a,
wait_b) block on it, waits until the mutex says a waiter is queued, holds it
40 ms more, and releases it; lock_a is handed over 3x as many times as lock_b,
so it sees 3x the waiting time (the scheduling delays of a loaded machine
weigh on both alike). `--locks` must name both by their symbols, give 3:1
within 10%, and show hold_a and hold_b as the holders that released them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
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
from tests.kernel.profiling import held, profile, release_on_attach, stacks_of

pytestmark = pytest.mark.kernel

ROUNDS = 10
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
    long hold_ms;
    int rounds;
    int go, done;  /* the round the holder began, the round the waiter ended */
};
static struct pair a = {&lock_a, 40}, b = {&lock_b, 40};

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


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    d = shared_dir(prefix="gfxbpf-locks-")
    os.chown(d, *ensure_user(ALICE))  # alice writes the profiles here
    gcc = shutil.which("gcc")
    if gcc is None:
        skip_or_fail("gcc is not installed (apt-get install gcc)")
        raise AssertionError  # unreachable
    src, prog = d / "twolocks.c", d / "twolocks"
    src.write_text(LOCKS_C)
    cmd = [gcc, "-O2", "-fomit-frame-pointer", str(src), "-o", str(prog), "-pthread"]
    subprocess.run(cmd, check=True, capture_output=True)
    prog.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def broker_policy(request: pytest.FixtureRequest) -> str:
    return policy_for(
        {"locks": {"users": [ALICE, BOB], "scope": "self"}},
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
