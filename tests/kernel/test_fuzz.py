"""Fuzzing the broker through both transports as an ordinary user.

tests/kernel/fuzzclient.py, run as gfxtest-mallory, sends seeded mutants of
every request kind over the Unix socket (one datagram each, sometimes with
fds) and over gRPC (raw bodies, with real, missing and mangled tokens).
Meanwhile gfxtest-alice times Hello round trips on both transports. Then:
the broker is alive, answered every datagram, reported no internal error,
served alice throughout, and its fds and threads are back to baseline.

A few seconds in CI; the long mode, by hand:

    GFXBPF_FUZZ_SECONDS=600 GFXBPF_FUZZ_SEED=7 tools/test.sh tests/kernel/test_fuzz.py
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.kernel.brokerenv import (
    ALICE,
    MALLORY,
    VENV_PYTHON,
    BrokerProcess,
    policy_for,
    run_as,
    wait_until,
)

FUZZ_SECONDS = float(os.environ.get("GFXBPF_FUZZ_SECONDS", "4"))
FUZZ_SEED = int(os.environ.get("GFXBPF_FUZZ_SEED", "20261123"))
FUZZCLIENT = Path(__file__).with_name("fuzzclient.py")
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
# Growth the fuzz run may leave for a little while: none, once it ends.
SETTLE_SECONDS = 15.0


def fuzz_policy() -> str:
    both = [ALICE, MALLORY]
    return policy_for(
        {
            "syscount": {"users": both, "scope": ["self"]},
            "execsnoop": {"users": both, "scope": ["self"]},
            "clonecount": {"users": both, "scope": ["self", "system"]},
            "ucalls": {
                "users": both,
                "scope": ["self"],
                "libraries": [LIBC],
                "functions": ["getpid", "getppid"],
            },
        },
        # Short leases: what a mutant attached over gRPC and never detached
        # is reaped soon, so the broker can be seen back at its baseline.
        # Mutants issue tokens too: room for them, so each round learns one.
        limits={
            "lease_seconds": 2,
            "sessions_per_user": 16,
            "attachments_per_user": 32,
            "tokens_per_user": 1000,
        },
    )


BROKER_INSTALL = (FUZZCLIENT,)


def broker_policy(request: pytest.FixtureRequest) -> str:
    return fuzz_policy()


def _start(broker: BrokerProcess, user: str, *args: str) -> subprocess.Popen[str]:
    assert broker.grpc is not None
    return run_as(
        user,
        [VENV_PYTHON, str(broker.directory / FUZZCLIENT.name), broker.socket, broker.grpc, *args],
        background=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result_and_err(proc: subprocess.Popen[str], timeout: float) -> tuple[dict[str, Any], str]:
    """The program's JSON result line, and its stderr (where it names what it found)."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"no result line: {out!r} {err!r}"
    return json.loads(lines[-1]), err


def _result(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    return _result_and_err(proc, timeout)[0]


# The broker's gRPC pools: 64 unary and 256 stream threads at most
# (broker/grpc/server.py), kept once grown.
POOLS = ("gfxbpf-grpc", "gfxbpf-grpcstrm")
POOL_BOUND = 64 + 256


def _unpooled(names: list[str]) -> int:
    return sum(1 for n in names if not n.startswith(POOLS))


def _thread_names(broker: BrokerProcess) -> list[str]:
    names = []
    for tid in os.listdir(f"/proc/{broker.pid}/task"):
        try:
            with open(f"/proc/{broker.pid}/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:
            continue  # the thread ended between the listing and the read: not there
    return sorted(names)


def _tracebacks(broker: BrokerProcess) -> list[str]:
    return [line for line in broker.stderr_lines() if "Traceback" in line]


def _round(broker: BrokerProcess, seconds: float, seed: int) -> tuple[dict, str, dict]:
    """mallory fuzzes while alice times Hellos: (mallory's counts, her stderr, alice's view)."""
    fuzzer = _start(broker, MALLORY, "--seconds", str(seconds), "--seed", str(seed))
    victim = _start(broker, ALICE, "--seconds", str(seconds), "--victim")
    seen = _result(victim, seconds + 120)
    counts, err = _result_and_err(fuzzer, seconds + 120)
    return counts, err, seen


def test_fuzzed_requests_leave_the_broker_serving_others(broker: BrokerProcess) -> None:
    # Warm up the same way with another seed: thread pools and caches grow
    # lazily, to what two users' concurrent calls need, once.
    warm, _, _ = _round(broker, 1.0, FUZZ_SEED + 1)
    assert warm.get("unix_sent", 0) > 0, warm
    fds0 = _settled_fds(broker)
    names0 = _thread_names(broker)

    counts, fuzz_err, seen = _round(broker, FUZZ_SECONDS, FUZZ_SEED)

    assert broker.alive(), broker.stderr()[-4000:]
    # Enough mutants to mean something, on both transports; a real token, so
    # most gRPC mutants get past authentication.
    assert counts.get("learned_token") == 1, counts
    assert counts.get("unix_sent", 0) >= 50 * FUZZ_SECONDS, counts
    assert counts.get("grpc_sent", 0) >= 20 * FUZZ_SECONDS, counts
    # Every datagram is answered (an error reply is an answer), except that
    # an empty one reads as the client hanging up; nothing is left hanging.
    assert counts.get("unix_unanswered", 0) == 0, json.dumps(counts)
    assert counts.get("unix_closed_by_broker", 0) <= counts.get("unix_empty", 0), counts
    assert (
        counts.get("unix_answered", 0) + counts.get("unix_closed_by_broker", 0)
        == (counts["unix_sent"])
    ), counts
    # No mutant found a broker bug.
    assert counts.get("internal", 0) == 0, (json.dumps(counts), fuzz_err)
    assert not _tracebacks(broker), _tracebacks(broker)[:5]
    # The other user was served on both transports all along.
    assert seen["nfailures"] == 0, seen
    assert seen["unix"]["n"] >= 10 and seen["grpc"]["n"] >= 10, seen

    # Back to baseline: every session, lease and fd the fuzzer caused is gone.
    assert wait_until(lambda: broker.fd_count() <= fds0, SETTLE_SECONDS), (
        broker.fd_count(),
        fds0,
        counts,
    )
    # The gRPC pools grow on demand up to their bound and keep their threads
    # (broker/threadnames.py names them); every other thread must be gone.
    assert wait_until(
        lambda: _unpooled(_thread_names(broker)) <= _unpooled(names0), SETTLE_SECONDS
    ), f"threads before: {Counter(names0)}; after: {Counter(_thread_names(broker))}"
    assert sum(1 for n in _thread_names(broker) if n.startswith(POOLS)) <= POOL_BOUND


def _settled_fds(broker: BrokerProcess) -> int:
    """The fd count once it stopped changing for a second (the warm-up's leases ended)."""
    last = broker.fd_count()
    stable_since = time.monotonic()
    deadline = stable_since + SETTLE_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = broker.fd_count()
        if now != last:
            last, stable_since = now, time.monotonic()
        elif time.monotonic() - stable_since >= 1.0:
            break
    return last
