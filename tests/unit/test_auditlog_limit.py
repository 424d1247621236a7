"""The audit log's per-key rate limit and its summaries (issue #16, finding 5)."""

from __future__ import annotations

import datetime as dt
import io
import json
import time

from gfxbpf.broker import auditlog
from gfxbpf.broker.auditlog import SUMMARY_SECONDS, AuditLog

FIXED = dt.datetime(2025, 1, 31, 12, 0, 0, tzinfo=dt.UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _log(rate: int | None = 5) -> tuple[AuditLog, io.StringIO, Clock]:
    buf, clock = io.StringIO(), Clock()
    log = AuditLog(buf, clock=lambda: FIXED, monotonic=clock, timer=False)
    log.set_rate(rate)
    return log, buf, clock


def _lines(buf: io.StringIO) -> list[dict]:
    return [json.loads(x) for x in buf.getvalue().splitlines()]


def test_no_limit_until_set() -> None:
    log, buf, _ = _log(None)
    for _ in range(100):
        log.denied("attach", uid=7)
    assert len(_lines(buf)) == 100


def test_burst_then_rate_per_uid_and_exact_summary() -> None:
    log, buf, clock = _log(5)
    written = [log.denied("attach", uid=7, transport="unix") for _ in range(20)]
    assert sum(1 for w in written if w) == 5  # the burst: one second's worth
    assert written[5] == ""  # a suppressed record returns no line
    for _ in range(3):
        log.error("protocol", uid=7)
    clock.now += 1.0  # one second refills five
    for _ in range(10):
        log.denied("attach", uid=7)
    lines = _lines(buf)
    assert len(lines) == 10
    # Nothing is due yet; then the summary counts every suppressed line, by op/result.
    assert log.flush_suppressed(due_only=True) == 0
    clock.now += SUMMARY_SECONDS
    assert log.flush_suppressed(due_only=True) == 1
    summary = _lines(buf)[-1]
    assert summary["op"] == "audit_suppressed" and summary["uid"] == 7
    assert summary["suppressed"] == 15 + 3 + 5
    assert summary["counts"] == {"attach denied": 20, "protocol error": 3}
    assert summary["detail"].startswith("23 similar lines suppressed for uid 7 in the last 6 s")
    assert "audit_lines_per_second" in summary["detail"]
    # Counted once: a later flush writes nothing more.
    assert log.flush_suppressed() == 0


def test_keys_are_independent_and_unauthenticated_grpc_is_one_key() -> None:
    log, buf, _ = _log(2)
    for _ in range(10):
        log.denied("attach", uid=1)
    log.ok("hello", uid=2)  # another user is not affected
    for port in range(10):  # every peer of the unauthenticated flood: one key
        log.denied("grpc_auth", transport="grpc", peer=f"ipv4:10.0.0.1:{port}")
    lines = _lines(buf)
    assert [r["op"] for r in lines].count("grpc_auth") == 2
    assert any(r["uid"] == 2 for r in lines)
    log.flush_suppressed()
    summaries = {
        (r.get("uid"), r.get("transport")): r["suppressed"]
        for r in _lines(buf)
        if r["op"] == "audit_suppressed"
    }
    assert summaries == {(1, None): 8, (None, "grpc"): 8}


def test_administrative_records_are_never_suppressed() -> None:
    log, buf, _ = _log(1)
    for _ in range(5):
        log.ok("start", uid=999, pid=1)  # the broker's own uid
        log.ok("reload", detail="x")
        log.error("reload", detail="x")
        log.error("accept", detail="EMFILE")  # no uid, no transport
    log.ok("listen")
    log.ok("stop")
    assert len(_lines(buf)) == 22


def test_summary_comes_from_the_timer_after_the_flood_stops(monkeypatch) -> None:
    monkeypatch.setattr(auditlog, "SUMMARY_SECONDS", 0.2)
    buf = io.StringIO()
    log = AuditLog(buf)
    log.set_rate(1)
    for _ in range(4):
        log.denied("attach", uid=3)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and "audit_suppressed" not in buf.getvalue():
        time.sleep(0.02)
    summary = [json.loads(x) for x in buf.getvalue().splitlines()][-1]
    assert summary["op"] == "audit_suppressed" and summary["suppressed"] == 3
    log.close()


def test_close_flushes_pending_summaries() -> None:
    log, buf, _ = _log(1)
    log.denied("attach", uid=3)
    log.denied("attach", uid=3)
    log.close()
    assert _lines(buf)[-1]["suppressed"] == 1


def test_idle_keys_are_forgotten() -> None:
    log, _, clock = _log(2)
    for uid in range(100):
        log.ok("hello", uid=uid)
    clock.now += 10
    log.flush_suppressed()
    assert not log._buckets


def test_set_rate_refuses_nonsense() -> None:
    log, _, _ = _log()
    for bad in (0, -1):
        try:
            log.set_rate(bad)
        except ValueError:
            continue
        raise AssertionError(f"set_rate({bad}) accepted")
