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


def test_burst_then_rate_per_key_and_exact_summary() -> None:
    log, buf, clock = _log(5)
    written = [log.denied("attach", uid=7, transport="unix") for _ in range(20)]
    assert sum(1 for w in written if w) == 5  # the burst: one second's worth
    assert written[5] == ""  # a suppressed record returns no line
    for _ in range(3):  # another kind of line of the same user: its own budget
        log.error("protocol", uid=7)
    clock.now += 1.0  # one second refills five
    for _ in range(10):
        log.denied("attach", uid=7)
    lines = _lines(buf)
    assert len(lines) == 5 + 3 + 5
    # Nothing is due yet; then the summary counts every suppressed line of the key.
    assert log.flush_suppressed(due_only=True) == 0
    clock.now += SUMMARY_SECONDS
    assert log.flush_suppressed(due_only=True) == 1
    summary = _lines(buf)[-1]
    assert summary["op"] == "audit_suppressed" and summary["uid"] == 7
    assert summary["suppressed"] == 15 + 5
    assert summary["counts"] == {"attach denied": 20}
    assert summary["detail"].startswith(
        "20 similar lines (attach denied) suppressed for uid 7 in the last 6 s"
    )
    assert "audit_lines_per_second" in summary["detail"]
    # Counted once: a later flush writes nothing more.
    assert log.flush_suppressed() == 0


def test_security_relevant_lines_survive_a_flood_of_the_same_user() -> None:
    log, buf, _ = _log(2)
    for i in range(1000):  # junk detaches: the review's flood
        log.error("detach", uid=7, transport="unix", attachment_id=i)
    for _ in range(50):  # denials of one program
        log.denied("attach", uid=7, program="syscount", rule="no entry")
    kept = [
        log.ok("attach", uid=7, program="clonecount", scope="system", sha256="ab", attachment_id=3),
        log.ok("detach", uid=7, program="clonecount", attachment_id=3),
        log.ok("issue_token", uid=7, ttl_seconds=60),
        log.denied("attach", uid=7, program="execsnoop", rule="no entry"),
    ]
    assert all(kept)
    lines = _lines(buf)
    assert [r["op"] for r in lines[-4:]] == ["attach", "detach", "issue_token", "attach"]
    assert lines[-4]["attachment_id"] == 3 and lines[-4]["scope"] == "system"
    # Successes are never suppressed, however many.
    assert all(log.ok("attach", uid=7, program="syscount") for _ in range(100))
    log.flush_suppressed()
    counts = {
        (r["program"], tuple(r["counts"])): r["suppressed"]
        for r in _lines(buf)
        if r["op"] == "audit_suppressed"
    }
    assert counts == {(None, ("detach error",)): 998, ("syscount", ("attach denied",)): 48}


def test_invented_program_names_share_one_key() -> None:
    log, buf, _ = _log(2)
    log.set_programs(lambda name: name in ("syscount", "execsnoop"))
    for i in range(100):
        log.denied("attach", uid=7, program=f"junk{i}")
    log.denied("attach", uid=7, program="syscount")
    lines = _lines(buf)
    assert len(lines) == 3
    assert lines[-1]["program"] == "syscount"
    assert [r["program"] for r in lines[:2]] == ["junk0", "junk1"]  # written as sent
    log.flush_suppressed()
    summary = _lines(buf)[-1]
    assert summary["program"] == "(other)" and summary["suppressed"] == 98


def test_keys_are_independent_and_unauthenticated_grpc_is_keyed_per_peer() -> None:
    log, buf, _ = _log(2)
    for _ in range(10):
        log.denied("attach", uid=1)
    log.ok("hello", uid=2)  # another user is not affected
    for _ in range(10):  # one unauthenticated peer floods...
        log.denied("grpc_auth", transport="grpc", peer="uid:1001")
    for _ in range(2):  # ...another peer keeps its own budget
        log.denied("grpc_auth", transport="grpc", peer="uid:1002")
    lines = _lines(buf)
    assert [r.get("peer") for r in lines if r["op"] == "grpc_auth"] == [
        "uid:1001",
        "uid:1001",
        "uid:1002",
        "uid:1002",
    ]
    assert any(r["uid"] == 2 for r in lines)
    log.flush_suppressed()
    summaries = {
        (r.get("uid"), r.get("peer")): r["suppressed"]
        for r in _lines(buf)
        if r["op"] == "audit_suppressed"
    }
    assert summaries == {(1, None): 8, (None, "grpc uid:1001"): 8}


def test_administrative_records_are_never_suppressed_accept_errors_are() -> None:
    log, buf, _ = _log(1)
    for _ in range(5):
        log.ok("start", uid=999, pid=1)  # the broker's own uid
        log.ok("reload", detail="x")
        log.error("reload", detail="x")
        log.error("accept", detail="accept failed: EMFILE")  # no uid, no transport
    log.ok("listen")
    log.ok("stop")
    lines = _lines(buf)
    assert len(lines) == 15 + 1 + 2
    assert [r["op"] for r in lines].count("accept") == 1
    log.flush_suppressed()
    summary = _lines(buf)[-1]
    assert summary["suppressed"] == 4 and "for the broker" in summary["detail"]


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


def test_record_always_is_never_held_back() -> None:
    """Issue 35 item 8: a session's implicit detaches and its end, whatever
    a flood of the same user's empty sessions spent."""
    log, buf, _ = _log(2)
    for _ in range(50):
        log.ok("close_session", uid=7, transport="unix", detail="detached 0 attachments")
    flood = len(_lines(buf))
    assert flood == 2
    log.record_always(op="detach", result="ok", uid=7, attachment_id=3, detail="implicit")
    log.record_always(op="close_session", result="ok", uid=7, detail="detached 1 attachments")
    last = _lines(buf)[flood:]
    assert [(r["op"], r["detail"]) for r in last] == [
        ("detach", "implicit"),
        ("close_session", "detached 1 attachments"),
    ]
