"""Floods by an ordinary user (issue #16, findings 4 and 5), against the broker as deployed.

The broker runs from the unit's ExecStart as user gfxbpf with CAP_BPF +
CAP_PERFMON (tests/kernel/brokerenv.py); gfxtest-mallory floods it, and
gfxtest-alice / gfxtest-bob must not notice:

- a connect flood (thousands of connections that never send Hello, all
  held): alice's Hello round trip stays under 1 s at p99 (not starved), the broker's
  threads stay bounded and its threads and fds return to their baseline;
- a session that sends nothing is closed after hello_timeout_seconds, and
  connections over sessions_per_user / sessions_total are answered with
  the reason;
- an audit-log flood (garbage datagrams and denied attaches): mallory's
  lines stay within audit_lines_per_second (plus one second of burst),
  and a summary line accounts for every line suppressed, even though the
  flood stopped before it was due.
"""

from __future__ import annotations

import collections
import contextlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.kernel.brokerenv import (
    ALICE,
    BOB,
    MALLORY,
    VENV_PYTHON,
    BrokerProcess,
    Client,
    policy_for,
    run_as,
    uid_of,
    wait_until,
)

# The connect flood: mallory opens connections as fast as she can for this
# long and holds every one of them.
FLOOD_SECONDS = 5.0
HELLO_SAMPLES = 300
# What the test catches is a starved session: its Hello waits for the flood's
# connections to time out (hello_timeout_seconds = 2 here). The bound is far
# from a busy machine's scheduling delays: 50x the p99 of alice's Hellos under
# the flood on an idle 2-CPU VM (under 20 ms), 8x the 127 ms measured with a
# CPU burner on both CPUs and other work beside it. The bench judges latency.
HELLO_P99_MS = 1000.0
# broker/unix/refusals.py: refused connections waiting for their first request, per user.
REFUSE_PENDING_PER_USER = 4

# Shared by the scripts below: connect, send, receive one message.
_COMMON = """
import json, os, resource, socket, sys, time
from gfxbpf.proto import framing
from gfxbpf.proto import gfxbpf_pb2 as pb

def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)  # blocking, as gfxbpf.client does: waits while the backlog is full
    s.settimeout(10)
    return s

def hello(s, rid):
    framing.send_message(s, pb.Request(id=rid, hello=pb.HelloRequest(protocol=1)))
    resp, fds = framing.recv_message(s, pb.Response)
    for fd in fds:
        os.close(fd)
    return resp
"""

# Mallory: connect, never send anything, hold the connection; until stdin closes.
FLOOD_CONNECT = (
    _COMMON
    + """
path, seconds = sys.argv[1], float(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held, made, failed = [], 0, {}
print(json.dumps({"started": True}), flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(path)
    except OSError as e:
        s.close()
        failed[type(e).__name__] = failed.get(type(e).__name__, 0) + 1
        continue
    made += 1
    held.append(s)
    if len(held) > hard - 64:  # out of fds: let the oldest go
        for old in held[: len(held) // 2]:
            old.close()
        del held[: len(held) // 2]
print(json.dumps({"connects": made, "held": len(held), "failed": failed}), flush=True)
sys.stdin.read()
"""
)

# Alice: one session, HELLO_SAMPLES Hellos 10 ms apart, each round trip timed.
HELLO_TIMER = (
    _COMMON
    + """
path, n = sys.argv[1], int(sys.argv[2])
s = connect(path)
hello(s, 1)
print(json.dumps({"connected": True}), flush=True)
sys.stdin.readline()  # go
rtts = []
for i in range(n):
    t0 = time.perf_counter()
    resp = hello(s, i + 2)
    rtts.append((time.perf_counter() - t0) * 1000)
    assert resp.WhichOneof("body") == "hello", resp
    time.sleep(0.01)
# A fresh connection during the flood, too (informational), after the
# first is closed: alice holds one session at a time, as the fd bound counts.
s.close()
t0 = time.perf_counter()
s2 = connect(path)
hello(s2, 1)
fresh = (time.perf_counter() - t0) * 1000
print(json.dumps({"rtts": rtts, "fresh_ms": fresh}), flush=True)
"""
)

# One session per connection given in argv; each sends Hello (or nothing) and reports.
SESSIONS = (
    _COMMON
    + """
path, plan = sys.argv[1], json.loads(sys.argv[2])
out, socks = [], []
for step in plan:
    if step == "connect":
        socks.append(connect(path))
        out.append({"connected": len(socks)})
        continue
    if step.startswith("sleep "):
        time.sleep(float(step.split()[1]))
        out.append({"slept": True})
        continue
    s = socks[int(step.split()[1])]
    try:
        if step.startswith("hello"):
            resp = hello(s, 7)
        else:  # "wait N": send nothing, read what the broker says
            resp, _ = framing.recv_message(s, pb.Response)
        body = resp.WhichOneof("body")
        r = {"body": body, "id": resp.id}
        if body == "error":
            r.update(code=pb.ErrorCode.Name(resp.error.code), message=resp.error.message,
                     rule=resp.error.rule)
    except (framing.FramingError, OSError) as e:
        r = {"body": None, "exception": f"{type(e).__name__}: {e}"}
    out.append(r)
print(json.dumps(out), flush=True)
"""
)

# Mallory: bad requests (garbage datagrams, denied attaches), one at a time, for N s.
FLOOD_AUDIT = (
    _COMMON
    + """
path, seconds, least = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
s = connect(path)
sent = {"garbage": 0, "attach": 0}
began = time.monotonic()
end = began + seconds
i = 0
# A busy machine answers slower: go on to `least`, for at most 10x as long.
while (time.monotonic() < end or i < least) and time.monotonic() < end + 9 * seconds:
    i += 1
    if i % 2:
        s.send(b"\\xff\\xfe not a protobuf")
        sent["garbage"] += 1
    else:
        framing.send_message(s, pb.Request(id=i, attach=pb.AttachRequest(name="syscount")))
        sent["attach"] += 1
    resp, fds = framing.recv_message(s, pb.Response)
    for fd in fds:
        os.close(fd)
    assert resp.WhichOneof("body") == "error", resp
s.close()
print(json.dumps({**sent, "elapsed": time.monotonic() - began}), flush=True)
"""
)


# One session sending detaches of attachments that do not exist, as fast as
# answers come, for N s (issue #26, finding 5: the flood that hid an attach).
FLOOD_DETACH = (
    _COMMON
    + """
path, seconds, least = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
s = connect(path)
hello(s, 1)
print(json.dumps({"flooding": True}), flush=True)
began = time.monotonic()
sent, i, end = 0, 1, began + seconds
while (time.monotonic() < end or sent < least) and time.monotonic() < end + 9 * seconds:
    i += 1
    framing.send_message(s, pb.Request(id=i, detach=pb.DetachRequest(attachment_id=10**6 + i)))
    resp, _ = framing.recv_message(s, pb.Response)
    assert resp.WhichOneof("body") == "error", resp
    sent += 1
print(json.dumps({"detach": sent, "elapsed": time.monotonic() - began}), flush=True)
"""
)


def _script(broker: BrokerProcess, name: str, text: str) -> str:
    path = Path(broker.directory) / name
    path.write_text(text)
    path.chmod(0o644)
    return str(path)


def _flood(
    broker: BrokerProcess, user: str, text: str, seconds: float, least: int
) -> subprocess.Popen[str]:
    """A flood script running as user, its stdout piped: argv the socket, how
    long, and how many requests at least (longer if a busy machine is slow)."""
    script = _script(broker, f"flood-{abs(hash(text))}.py", text)
    return run_as(  # type: ignore[no-any-return]
        user,
        [VENV_PYTHON, script, broker.socket, str(seconds), str(least)],
        background=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _policy(**limits: int) -> str:
    return policy_for({"syscount": {"users": [ALICE, BOB], "scope": ["self"]}}, limits=limits)


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _json_line(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"client died: {proc.stderr.read() if proc.stderr else ''}"
    return json.loads(line)


# long: one attack scenario: the flood, the victim's timings, then the broker's state.
def test_connect_flood_does_not_slow_down_another_user() -> None:
    """Finding 4: mallory's connect flood; alice's Hello p99 < 1 s; threads bounded."""
    with BrokerProcess.start(_policy(hello_timeout_seconds=2), grpc=False) as broker:
        flood = _script(broker, "flood_connect.py", FLOOD_CONNECT)
        timer = _script(broker, "hello_timer.py", HELLO_TIMER)
        time.sleep(0.3)  # let start-up settle
        base_threads, base_fds = broker.thread_count(), broker.fd_count()

        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        alice = run_as(
            ALICE,
            [VENV_PYTHON, timer, broker.socket, str(HELLO_SAMPLES)],
            background=True,
            text=True,
            **pipes,
        )
        mallory = None
        try:
            assert _json_line(alice).get("connected")
            mallory = run_as(
                MALLORY,
                [VENV_PYTHON, flood, broker.socket, str(FLOOD_SECONDS)],
                background=True,
                text=True,
                **pipes,
            )
            assert _json_line(mallory).get("started")
            time.sleep(0.5)  # the flood is under way
            assert alice.stdin is not None
            alice.stdin.write("go\n")
            alice.stdin.flush()
            # While alice measures, watch the broker's threads.
            peak_threads = peak_fds = 0
            while alice.poll() is None:
                with contextlib.suppress(OSError):  # a fd may close while listed
                    peak_fds = max(peak_fds, broker.fd_count())
                peak_threads = max(peak_threads, broker.thread_count())
                time.sleep(0.05)
            measured = _json_line(alice)
            flooded = _json_line(mallory)
        finally:
            for p in (alice, mallory):
                if p is not None:
                    if p.poll() is None and p.stdin is not None:
                        p.stdin.close()
                    try:
                        p.wait(30)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait(10)

        rtts = measured["rtts"]
        p99 = _p99(rtts)
        summary = (
            f"mallory: {flooded}; alice: p50 {sorted(rtts)[len(rtts) // 2]:.2f} "
            f"p99 {p99:.2f} max {max(rtts):.2f} ms over {len(rtts)} Hellos, fresh "
            f"connect+Hello {measured['fresh_ms']:.1f} ms; broker threads {base_threads} -> "
            f"peak {peak_threads}, fds {base_fds} -> peak {peak_fds}"
        )
        print(summary)
        assert flooded["connects"] >= 1000, summary  # it was a flood
        assert len(rtts) == HELLO_SAMPLES
        assert p99 < HELLO_P99_MS, summary
        # One user holds at most sessions_per_user (8) session threads.
        assert peak_threads <= base_threads + 8 + 2 + 2, summary
        # ...and fds: those sessions, the refused ones waiting for their first request
        # (4 per user), alice's, one being accepted.
        assert peak_fds <= base_fds + 8 + REFUSE_PENDING_PER_USER + 1 + 2, summary
        # Refusals and hello timeouts are in the audit log (rate-limited: lines or summary).
        mallory_uid = uid_of(MALLORY)
        recs = [r for r in broker.audit_records() if r.get("uid") == mallory_uid]
        seen = collections.Counter(r["op"] for r in recs)
        counted = collections.Counter()
        for r in recs:
            if r["op"] == "audit_suppressed":
                counted.update({k.split()[0]: v for k, v in r["counts"].items()})
        assert seen["open_session"] or counted["open_session"], seen
        # Everything mallory held is gone once she is: back to the baseline.
        assert wait_until(
            lambda: broker.thread_count() <= base_threads and broker.fd_count() <= base_fds, 10
        ), (broker.thread_count(), base_threads, broker.fd_count(), base_fds)
        assert broker.alive()


def test_silent_sessions_time_out_and_refusals_say_why() -> None:
    """A session without a first request is closed (audited); over-limit connections
    are refused at accept with a readable reason."""
    policy = _policy(hello_timeout_seconds=1, sessions_per_user=2, sessions_total=3)
    with BrokerProcess.start(policy, grpc=False) as broker:
        script = _script(broker, "sessions.py", SESSIONS)
        plan = ["connect", "connect", "hello 0", "connect", "hello 2", "sleep 1.5", "hello 0"]
        plan += ["wait 1"]  # session 1 never sent anything: closed at 1 s
        r = run_as(ALICE, [VENV_PYTHON, script, broker.socket, json.dumps(plan)])
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        hello0, refused, hello0_later, silent = out[2], out[4], out[6], out[7]
        assert hello0["body"] == "hello", out
        # The third connection (over sessions_per_user = 2): the reason, as the
        # answer to its first request.
        assert refused["body"] == "error" and refused["code"] == "ERROR_RESOURCE_EXHAUSTED", out
        assert "sessions_per_user = 2" in refused["rule"], refused
        assert refused["id"] == 7, refused
        # A session that spoke in time lives on; the silent one was told and closed.
        assert hello0_later["body"] == "hello", out
        assert silent["body"] == "error" and "hello_timeout_seconds = 1" in silent["rule"], out
        alice = uid_of(ALICE)
        assert wait_until(
            lambda: any(
                rec.get("uid") == alice
                and rec.get("op") == "open_session"
                and "hello_timeout_seconds" in rec.get("rule", "")
                for rec in broker.audit_records()
            ),
            5,
        ), broker.stderr()

        # sessions_total: alice holds 2 (her limit), bob 1; bob's second is refused.
        plan_a = ["connect", "connect", "hello 0", "hello 1", "sleep 2"]
        held = run_as(
            ALICE,
            [VENV_PYTHON, script, broker.socket, json.dumps(plan_a)],
            background=True,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            time.sleep(0.8)
            plan_b = ["connect", "hello 0", "connect", "hello 1"]
            r = run_as(BOB, [VENV_PYTHON, script, broker.socket, json.dumps(plan_b)])
            out = json.loads(r.stdout)
            assert out[1]["body"] == "hello", out
            assert out[3]["body"] == "error", out
            assert "sessions_total = 3" in out[3]["rule"], out
        finally:
            held.wait(30)


def test_audit_flood_is_rate_limited_with_a_summary() -> None:
    """Finding 5: mallory's bad requests; her lines <= rate (+ burst) per second, and a
    summary line (after the flood stopped) counts exactly what was left out."""
    rate, seconds = 10, 2.0
    with BrokerProcess.start(_policy(audit_lines_per_second=rate), grpc=False) as broker:
        script = _script(broker, "flood_audit.py", FLOOD_AUDIT)
        least = int(10 * rate * seconds) + 1  # a flood: far over the rate
        r = run_as(MALLORY, [VENV_PYTHON, script, broker.socket, str(seconds), str(least)])
        assert r.returncode == 0, r.stderr
        sent = json.loads(r.stdout)
        assert sent["garbage"] + sent["attach"] >= least, sent

        # Alice, during the summary wait, is not limited by mallory's budget.
        alice = run_as(
            ALICE,
            [
                VENV_PYTHON,
                _script(broker, "s.py", SESSIONS),
                broker.socket,
                json.dumps(["connect", "hello 0"]),
            ],
        )
        assert json.loads(alice.stdout)[1]["body"] == "hello", alice.stdout

        mallory = uid_of(MALLORY)

        def summaries() -> list[dict[str, Any]]:
            return [
                rec
                for rec in broker.audit_records()
                if rec.get("op") == "audit_suppressed" and rec.get("uid") == mallory
            ]

        # The summary comes although the flood has stopped (SUMMARY_SECONDS = 5 after
        # the first suppressed line).
        assert wait_until(lambda: bool(summaries()), 10), broker.stderr()[-3000:]
        time.sleep(0.2)
        recs = broker.audit_records()
        lines = [r for r in recs if r.get("uid") == mallory and r["op"] != "audit_suppressed"]
        # Two kinds (protocol errors, attach denials of syscount), each limited on its own.
        per_second = collections.Counter((rec["op"], rec["time"][:19]) for rec in lines)
        per_kind = collections.Counter(rec["op"] for rec in lines)
        info = f"sent {sent}; written {dict(per_kind)}; per second {dict(per_second)}"
        assert max(per_second.values()) <= 2 * rate, info  # rate + one second of burst
        assert max(per_kind.values()) <= rate * (sent["elapsed"] + 1) + rate, info
        got = summaries()
        suppressed = sum(s["suppressed"] for s in got)
        assert len(got) <= 4, got  # one per kind, twice at most (5 s windows)
        # Every request was audited once: written or counted.
        ops = collections.Counter(rec["op"] for rec in lines)
        for s in got:
            for k, v in s["counts"].items():
                ops[k.split()[0]] += v
        assert len(lines) + suppressed == ops.total(), (info, got)
        assert ops["protocol"] == sent["garbage"], (ops, sent)
        assert ops["attach"] == sent["attach"], (ops, sent)
        assert got[0]["detail"].startswith(f"{got[0]['suppressed']} similar lines ("), got
        # alice's Hello was logged in full.
        assert any(rec.get("uid") == uid_of(ALICE) and rec["op"] == "hello" for rec in recs), info


def test_an_audit_flood_does_not_hide_an_attach() -> None:
    """Issue #26, finding 5: junk detaches on one session (far over the rate), an
    attach of clonecount in system scope on another: the attach line is written
    in full, and so are its detach and a policy denial; the junk is summarised."""
    rate, seconds = 10, 3.0
    policy = policy_for(
        {"clonecount": {"users": [ALICE], "scope": ["self", "system"]}},
        limits={"audit_lines_per_second": rate},
    )
    with BrokerProcess.start(policy, grpc=False) as broker:
        least = int(10 * rate * seconds) + 1  # a flood: far over the rate
        flood = _flood(broker, ALICE, FLOOD_DETACH, seconds, least)
        alice = Client(broker, ALICE)
        try:
            assert _json_line(flood) == {"flooding": True}
            time.sleep(seconds / 3)  # well into the flood: the user's old budget is spent
            att = alice.ok("attach", name="clonecount", scope="system")
            denied = alice("attach", name="syscount", scope="system")
            alice.ok("detach", id=att["id"])
            sent = _json_line(flood)
            me = uid_of(ALICE)
            # Audit lines follow the answers: wait for the detach's (a few seconds at most).
            wait_until(
                lambda: any(
                    r.get("uid") == me and r["op"] == "detach" and r["result"] == "ok"
                    for r in broker.audit_records()
                ),
                5,
            )
            mine = [r for r in broker.audit_records() if r.get("uid") == me]
        finally:
            flood.wait(30)
            alice.close()
        assert not denied["ok"], denied
        assert sent["detach"] >= least, sent
        _check_written_in_full(mine, att)
        # The junk is limited on its own (rate + burst per second) and summarised.
        junk = [r for r in mine if r["op"] == "detach" and r["result"] == "error"]
        assert len(junk) <= rate * (sent["elapsed"] + 2) + rate, (len(junk), sent)
        wait_until(lambda: any(r["op"] == "audit_suppressed" for r in broker.audit_records()), 10)
        summaries = [r for r in broker.audit_records() if r["op"] == "audit_suppressed"]
        assert summaries and all(
            r["counts"] == {"detach error": r["suppressed"]} for r in summaries
        )


def _check_written_in_full(mine: list[dict[str, Any]], att: dict[str, Any]) -> None:
    """The attach (program, scope, sha256, id), its detach and the denial are all there."""
    attach = [r for r in mine if r["op"] == "attach" and r["result"] == "ok"]
    assert len(attach) == 1, mine[-20:]
    line = attach[0]
    assert line["program"] == "clonecount" and line["scope"] == "system", line
    assert line["sha256"] == att["sha256"] and line["attachment_id"] == att["id"], line
    assert any(
        r["op"] == "detach" and r["result"] == "ok" and r["attachment_id"] == att["id"]
        for r in mine
    ), mine[-20:]
    assert any(
        r["op"] == "attach" and r["result"] == "denied" and r["program"] == "syscount" for r in mine
    ), mine[-20:]


# Mallory: sessions that open, say Hello and close, as fast as she can.
FLOOD_SESSIONS = (
    _COMMON
    + """
path, seconds, least = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
made = 0
print(json.dumps({"flooding": True}), flush=True)
end = time.monotonic() + seconds
while (time.monotonic() < end or made < least) and time.monotonic() < end + 9 * seconds:
    try:
        s = connect(path)
        hello(s, 1)
        s.close()
        made += 1
    except OSError:
        pass
print(json.dumps({"sessions": made}), flush=True)
"""
)


def test_a_session_flood_does_not_hide_an_implicit_detach() -> None:
    """Issue 35 item 8: a session closed by its socket detached its attachments
    with one rate-limited close_session line; mallory's flood of empty
    sessions suppressed it, and no line said what was detached. Now each
    implicit detach and the end of a session that held attachments are
    written whatever the flood."""
    rate, seconds = 5, 3.0
    policy = policy_for(
        {"clonecount": {"users": [MALLORY], "scope": ["self"]}},
        limits={"audit_lines_per_second": rate, "sessions_per_user": 8},
    )
    with BrokerProcess.start(policy, grpc=False) as broker:
        least = int(4 * rate * seconds) + 1  # a flood: far over the rate
        flood = _flood(broker, MALLORY, FLOOD_SESSIONS, seconds, least)
        real = Client(broker, MALLORY)
        try:
            assert _json_line(flood) == {"flooding": True}
            att = real.ok("attach", name="clonecount", scope="self")
            time.sleep(seconds / 3)  # well into the flood: her close_session budget is spent
            real.proc.kill()  # the socket closes: the broker detaches implicitly
            real.proc.wait(10)
            sent = _json_line(flood)
        finally:
            flood.wait(30)
            real.opened = False
            real.close()
        me = uid_of(MALLORY)

        def detach_lines() -> list[dict[str, Any]]:
            return [
                r
                for r in broker.audit_records()
                if r.get("uid") == me
                and r["op"] == "detach"
                and r.get("attachment_id") == att["id"]
            ]

        assert sent["sessions"] >= least, sent
        assert wait_until(lambda: bool(detach_lines()), 10), "the implicit detach left no line"
        (line,) = detach_lines()
        assert line["result"] == "ok" and line["detail"].startswith("implicit"), line
        assert line["program"] == "clonecount", line
        closes = [
            r
            for r in broker.audit_records()
            if r["op"] == "close_session" and r.get("pid") == real.pid
        ]
        assert closes and closes[0]["detail"].startswith("detached 1 attachments"), closes
        wait_until(lambda: any(r["op"] == "audit_suppressed" for r in broker.audit_records()), 10)
        assert any(r["op"] == "audit_suppressed" for r in broker.audit_records())
