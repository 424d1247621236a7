"""Issue 35 item 1: one user cannot shut others out through a listen backlog.

gfxtest-mallory, an ordinary user, runs 4 processes of 64 threads that each
connect to one of the broker's sockets (blocking, as a plain client does)
and close at once, as fast as they can. With a 128-entry backlog and an
accept loop that took one connection per event-loop turn, her 256 waiting
connects kept the gRPC socket's backlog full: gfxtest-bob's connects (grpc
connects non-blocking) failed EAGAIN 191 times of 200, and over the fd
socket his attach took 5x longer.

Now gfxbpf's clients connect blocking, so they wait their turn in the
backlog (the kernel serves blocked connects in order; for gRPC through
client/grpc_queued.py), and both accept loops drain the short backlog in
batches, closing a connection whose peer already hung up without spending
anything on it (broker/listening.py). Under each flood, bob connects anew
for each sample, attaches syscount and reads it once, over gRPC and over
the fd socket: no sample fails, their median stays within a generous bound
of its time on the idle broker and none comes near a timeout
(bench/results/issue-35-listen-flood.md has the figures: 1-1.5x).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import textwrap
import time
from typing import Any

import pytest

from tests.kernel.brokerenv import (
    BOB,
    MALLORY,
    RAWCLIENT,
    VENV_PYTHON,
    BrokerProcess,
    policy_for,
    run_as,
)

PROCESSES, THREADS = 4, 64
SAMPLES = 10
# A generous bound for the median sample under the flood: this many times the
# idle median, plus a margin for a loaded test machine (the goal, 2x, is the
# bench's). The median, not the slowest: on a 2-CPU machine with a CPU burner
# on each CPU and her 256 threads, one sample in ten took 1.3 s against a
# 45 ms idle median while the other nine took 40-500 ms (Debian 13 leg,
# 2026-11-28): a tail on a saturated machine, not a user shut out.
TIMES_IDLE, MARGIN_S = 10, 0.5
# ... and every sample completes, none near the clients' own timeouts.
CEILING_S = 15.0

# Mallory: argv kind ("stream" or "seqpacket"), path, threads. Threads of blocking
# connect + close until stdin closes; then prints how many connects succeeded
# and failed.
FLOOD = textwrap.dedent(
    """
    import json, socket, sys, threading
    kind, path, nthreads = sys.argv[1], sys.argv[2], int(sys.argv[3])
    stype = socket.SOCK_STREAM if kind == "stream" else socket.SOCK_SEQPACKET
    stop = threading.Event()
    made, failed = [0], [0]

    def flood():
        while not stop.is_set():
            s = socket.socket(socket.AF_UNIX, stype)
            try:
                s.connect(path)
                made[0] += 1
            except OSError:
                failed[0] += 1
            finally:
                s.close()

    threads = [threading.Thread(target=flood) for _ in range(nthreads)]
    for t in threads:
        t.start()
    print(json.dumps({"started": True}), flush=True)
    sys.stdin.read()
    stop.set()
    for t in threads:
        t.join()
    print(json.dumps({"made": made[0], "failed": failed[0]}), flush=True)
    """
)

# Bob: argv control socket, grpc address, rawclient dir, samples. Each sample
# connects anew, attaches syscount, reads it once, detaches, closes: over
# gRPC, then over the fd socket. Prints the seconds of each, and errors.
SAMPLER = textwrap.dedent(
    """
    import json, socket, sys, time
    from gfxbpf.client.grpc_transport import GrpcTransport
    from gfxbpf.proto import gfxbpf_pb2 as pb
    control, addr, rawdir, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    sys.path.insert(0, rawdir)
    from rawclient import RawClient

    def token():
        c = RawClient(control)
        c.call(hello=pb.HelloRequest(protocol=1))
        resp, _ = c.call(issue_token=pb.IssueTokenRequest(ttl_seconds=600))
        c.sock.close()
        return resp.issue_token.token

    tok = token()

    def over_grpc():  # as gfxclient --via grpc connects
        t = GrpcTransport(addr, tok)
        try:
            a, _ = t.attach(pb.AttachRequest(name="syscount", scope=pb.SCOPE_SELF))
            t.read_map(pb.ReadMapRequest(attachment_id=a.attachment_id, map="counts"))
            t.detach(a.attachment_id)
        finally:
            t.close()

    def over_fds():
        c = RawClient(control)
        try:
            c.call(hello=pb.HelloRequest(protocol=1))
            a = c.attach(name="syscount", scope=pb.SCOPE_SELF)
            c.read_fd(a.attachment_id, "counts")
            c.detach(a.attachment_id)
        finally:
            c.sock.close()

    out = {}
    for name, sample in (("grpc", over_grpc), ("fd", over_fds)):
        times, errors = [], []
        for _ in range(n):
            t0 = time.monotonic()
            try:
                sample()
                times.append(time.monotonic() - t0)
            except Exception as e:
                errors.append(f"{type(e).__name__}: {str(e)[:200]}")
        out[name] = {"times": times, "errors": errors}
    print(json.dumps(out), flush=True)
    """
)


def _script(broker: BrokerProcess, name: str, text: str) -> str:
    path = broker.directory / name
    path.write_text(text)
    path.chmod(0o644)
    return str(path)


def _sample(broker: BrokerProcess) -> dict[str, Any]:
    assert broker.grpc is not None
    script = _script(broker, "sampler.py", SAMPLER)
    rawdir = str(broker.install(RAWCLIENT).parent)
    argv = [VENV_PYTHON, script, broker.socket, broker.grpc, rawdir, str(SAMPLES)]
    r = run_as(BOB, argv, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _flood(broker: BrokerProcess, kind: str, path: str) -> list[Any]:
    script = _script(broker, "flood.py", FLOOD)
    procs = []
    for _ in range(PROCESSES):
        p = run_as(
            MALLORY,
            [VENV_PYTHON, script, kind, path, str(THREADS)],
            background=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(p)
    for p in procs:
        line = p.stdout.readline()
        assert json.loads(line or "{}").get("started"), p.stderr.read()[-2000:]
    return procs


def _stop_flood(procs: list[Any]) -> dict[str, int]:
    """End the flood; how many connects it made and how many failed."""
    total = {"made": 0, "failed": 0}
    for p in procs:
        p.stdin.close()
    for p in procs:
        out = p.stdout.read()
        p.wait(60)
        if p.returncode == 0 and out.strip():
            r = json.loads(out.strip().splitlines()[-1])
            for k in total:
                total[k] += r[k]
    return total


@pytest.mark.parametrize("target", ["grpc", "control"])
def test_a_connect_flood_does_not_shut_another_user_out(target: str) -> None:
    policy = policy_for({"syscount": {"users": [BOB], "scope": ["self"]}})
    with BrokerProcess.start(policy) as broker:
        assert broker.grpc is not None
        idle = _sample(broker)
        for how in ("grpc", "fd"):
            assert not idle[how]["errors"], idle
        if target == "grpc":
            kind, path = "stream", broker.grpc.removeprefix("unix:")
        else:
            kind, path = "seqpacket", broker.socket
        procs = _flood(broker, kind, path)
        try:
            time.sleep(1.0)  # the backlog as full as she can keep it
            loaded = _sample(broker)
        finally:
            flood = _stop_flood(procs)
        assert broker.alive()
    print(json.dumps({"target": target, "idle": idle, "loaded": loaded, "flood": flood}))
    assert flood["made"] > 1000, flood  # the flood ran
    for how in ("grpc", "fd"):
        assert not loaded[how]["errors"], (how, loaded[how], flood)
        bound = TIMES_IDLE * statistics.median(idle[how]["times"]) + MARGIN_S
        times = loaded[how]["times"]
        assert statistics.median(times) <= bound, (how, loaded[how], idle[how], flood)
        assert max(times) <= CEILING_S, (how, loaded[how], flood)
