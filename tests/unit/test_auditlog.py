"""The audit log writes one parseable JSON line per request and never raises."""

from __future__ import annotations

import datetime as dt
import enum
import io
import json
import threading

from gfxbpf.broker import auditlog
from gfxbpf.broker.auditlog import AuditLog

FIXED = dt.datetime(2025, 3, 4, 5, 6, 7, 891234, tzinfo=dt.UTC)


def _log(buf: io.StringIO) -> AuditLog:
    return AuditLog(buf, clock=lambda: FIXED)


def test_one_line_with_fields_in_order():
    buf = io.StringIO()
    line = _log(buf).record(
        op="attach",
        result="ok",
        uid=1001,
        pid=4242,
        program="syscount",
        sha256="ab" * 32,
        scope="self",
        detail="attachment 3",
        rule='policy.toml [[program]] #1 "syscount": users = ["alice"]',
    )
    out = buf.getvalue()
    assert out == line + "\n"
    assert out.count("\n") == 1
    rec = json.loads(out)
    assert list(rec)[:9] == [
        "time",
        "uid",
        "pid",
        "op",
        "program",
        "sha256",
        "scope",
        "result",
        "detail",
    ]
    assert rec["time"] == "2025-03-04T05:06:07.891Z"
    assert rec["uid"] == 1001 and rec["pid"] == 4242
    assert rec["op"] == "attach" and rec["result"] == "ok"
    assert rec["sha256"] == "ab" * 32
    assert rec["rule"].startswith("policy.toml [[program]] #1")


def test_rfc3339_converts_to_utc():
    cet = dt.timezone(dt.timedelta(hours=1))
    assert auditlog.rfc3339(dt.datetime(2025, 1, 1, 1, 0, 0, tzinfo=cet)) == (
        "2025-01-01T00:00:00.000Z"
    )
    assert auditlog.rfc3339(dt.datetime(2025, 1, 1)) == "2025-01-01T00:00:00.000Z"


def test_default_clock_is_utc_now():
    buf = io.StringIO()
    AuditLog(buf).ok("hello", uid=0)
    stamp = json.loads(buf.getvalue())["time"]
    parsed = dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
    assert abs((dt.datetime.now(dt.UTC) - parsed).total_seconds()) < 60


def test_helpers_set_result():
    buf = io.StringIO()
    log = _log(buf)
    log.ok("hello")
    log.denied("attach", program="foo")
    log.error("read_map", detail="EPERM")
    results = [json.loads(x)["result"] for x in buf.getvalue().splitlines()]
    assert results == ["ok", "denied", "error"]


class _Evil:
    def __str__(self) -> str:
        raise RuntimeError("boom")


class _Color(enum.Enum):
    RED = 1


def test_odd_values_never_raise():
    buf = io.StringIO()
    log = _log(buf)
    log.record(
        op=_Evil(),
        result="weird",
        uid="\udcff\x00\n",  # lone surrogate, NUL, newline
        pid=float("nan"),
        program=b"\x00\xff",
        sha256=None,
        scope=_Color.RED,
        detail="x" * 100_000,
        nested={"a": [1, _Evil(), b"z"], 3: {1, 2}},
        time="not an override",  # the clock owns "time"; this lands in extra_time
    )
    lines = buf.getvalue().splitlines()
    assert len(lines) == 1  # the newline inside a value was escaped
    rec = json.loads(lines[0])
    assert rec["op"] == "<unprintable _Evil>"
    assert rec["result"].startswith("error(unknown result")
    assert "\\udcff" in rec["uid"]
    assert rec["pid"] == "nan"
    assert rec["program"] == "00ff"
    assert rec["scope"] == "RED"
    assert len(rec["detail"]) < 1200 and rec["detail"].endswith("chars)")
    assert rec["nested"]["a"][1] == "<unprintable _Evil>"
    assert sorted(rec["nested"]["3"]) == [1, 2]
    assert rec["time"] == "2025-03-04T05:06:07.891Z"
    assert rec["extra_time"] == "not an override"
    assert lines[0].isascii()


def test_broken_stream_is_ignored():
    class Broken(io.StringIO):
        def write(self, s: str) -> int:
            raise BrokenPipeError("stderr gone")

    line = AuditLog(Broken(), clock=lambda: FIXED).ok("hello", uid=1)
    assert json.loads(line)["op"] == "hello"


def test_failing_clock_is_ignored():
    def clock() -> dt.datetime:
        raise OSError("no clock")

    buf = io.StringIO()
    AuditLog(buf, clock=clock).ok("hello")
    assert json.loads(buf.getvalue())["time"].endswith("Z")


def test_default_stream_is_stderr(capsys):
    AuditLog().denied("attach", uid=5, program="foo")
    err = capsys.readouterr().err
    assert json.loads(err)["program"] == "foo"


def test_threads_do_not_interleave():
    buf = io.StringIO()
    log = _log(buf)

    def worker(n: int) -> None:
        for i in range(200):
            log.ok("stats", uid=n, detail="y" * (i % 50))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = buf.getvalue().splitlines()
    assert len(lines) == 800
    assert all(json.loads(x)["op"] == "stats" for x in lines)
