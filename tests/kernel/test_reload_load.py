"""A policy reload under load decides every request by the policy in force
(issue #26, acceptance).

The broker runs as deployed (user gfxbpf, CAP_BPF + CAP_PERFMON). Three
sessions of ordinary users loop over attach (syscount, system scope),
ReadMap, Stats and detach, while the administrator swaps the policy back
and forth between one that lets alice and bob run syscount and one that
lets bob only, with SIGHUP, a dozen times. Each request is timed from the
test (the raw client answers synchronously), and so is each reload: from
the signal to its "reload" audit record. A request that ran entirely while
one policy was in force must have been decided by it:

- alice's attach, ReadMap and Stats while she is removed: refused;
- alice's attach while she is allowed: admitted;
- bob's requests: always admitted, reloads or not.

Requests that overlap a reload may go either way. The broker must stay up
and write no internal error.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from tests.kernel.brokerenv import ALICE, BOB, BrokerProcess, Client, policy_for

RELOADS = 12
# Every audit line kept (no rate limit): the test reads them all.
LIMITS = {"sessions_per_user": 4, "attachments_per_user": 8, "audit_lines_per_second": 100000}
BOTH = policy_for({"syscount": {"users": [ALICE, BOB], "scope": ["system"]}}, limits=LIMITS)
BOB_ONLY = policy_for({"syscount": {"users": [BOB], "scope": ["system"]}}, limits=LIMITS)


@dataclass
class Op:
    user: str
    op: str
    start: float
    end: float
    ok: bool
    code: str = ""


@dataclass
class Window:
    """A policy in force from `start` (its reload record seen) to `end` (the next SIGHUP)."""

    alice_allowed: bool
    start: float
    end: float


def _loop(client: Client, user: str, stop: threading.Event, out: list[Op]) -> None:
    def timed(op: str, **kw: Any) -> dict[str, Any]:
        t0 = time.monotonic()
        r = client(op, **kw)
        out.append(Op(user, op, t0, time.monotonic(), r["ok"], r.get("code", "")))
        return r

    while not stop.is_set():
        a = timed("attach", name="syscount", scope="system")
        if not a["ok"]:
            time.sleep(0.02)
            continue
        timed("read_rpc", id=a["id"], map="counts")
        timed("stats", id=a["id"])
        client("detach", id=a["id"])  # may be gone already (revoked): not judged


def _windows(broker: BrokerProcess, stop: threading.Event) -> list[Window]:
    """Reload RELOADS times, alternating policies; the stable windows between."""
    windows = []
    allowed = True
    start = time.monotonic()
    for _ in range(RELOADS):
        time.sleep(0.8)
        sent = time.monotonic()
        windows.append(Window(allowed, start, sent))
        allowed = not allowed
        rec = broker.reload(BOTH if allowed else BOB_ONLY)
        assert rec["result"] == "ok", rec
        start = time.monotonic()
    time.sleep(0.8)
    windows.append(Window(allowed, start, time.monotonic()))
    stop.set()
    return windows


def _in(op: Op, windows: list[Window]) -> Window | None:
    return next((w for w in windows if w.start <= op.start and op.end <= w.end), None)


def test_every_decision_follows_the_policy_in_force_across_reloads() -> None:
    with BrokerProcess.start(BOTH, grpc=False) as broker:
        clients = [(Client(broker, u), u) for u in (ALICE, ALICE, BOB)]
        stop = threading.Event()
        ops: list[list[Op]] = [[] for _ in clients]
        threads = [
            threading.Thread(target=_loop, args=(c, u, stop, out))
            for (c, u), out in zip(clients, ops, strict=True)
        ]
        try:
            for t in threads:
                t.start()
            windows = _windows(broker, stop)
        finally:
            stop.set()
            for t in threads:
                t.join(30)
            for c, _ in clients:
                c.close()
        assert broker.alive()
        judged = {"alice refused": 0, "alice admitted": 0, "bob": 0}
        for op in (o for out in ops for o in out):
            if op.user == BOB:
                assert op.ok, op  # never touched by a reload
                judged["bob"] += 1
                continue
            w = _in(op, windows)
            if w is None:
                continue  # overlaps a reload: either answer is right
            if not w.alice_allowed:
                assert not op.ok and op.code == "ERROR_PERMISSION_DENIED", (op, w)
                judged["alice refused"] += 1
            elif op.op == "attach":
                assert op.ok, (op, w)
                judged["alice admitted"] += 1
        # The test judged requests of every kind, not just overlaps.
        assert min(judged.values()) >= 3, judged
        errors = [r for r in broker.audit_records() if r["result"] == "error"]
        assert not errors, errors[:5]
        revoked = [r for r in broker.audit_records() if r["op"] == "revoke"]
        assert revoked, "no reload found an attachment of alice's to revoke"
        assert broker.stop() == 0, broker.stderr()
