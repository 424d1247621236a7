"""The broker's audit log: one JSON object per line, one line per request.

Written to stderr by default, where journald picks it up. Fields, in order:
time (RFC 3339, UTC, milliseconds), uid, pid, op, program, sha256, scope,
result ("ok", "denied" or "error"), detail, then any extra keys (e.g. rule,
attachment_id, transport).

Logging must never take the broker down: odd values (bytes, objects whose
str() raises, lone surrogates, huge strings) are coerced or truncated, and a
failing stream is ignored.

Rate limit (AuditLog.set_rate, from the policy's [limits]
audit_lines_per_second): a user must not be able to flood the log, nor hide
their own security-relevant lines behind a flood (issue #26).
- Never suppressed: the administrative ops in NEVER_SUPPRESSED (start,
  listen, reload, stop) and what ALWAYS_WRITTEN names: a successful attach,
  detach or token issue (each bounded by the broker's other limits); and
  what the broker writes with record_always(): every detach a session's or lease's end
  makes, failed or not, and the close of a session that held attachments
  (issue 35 item 8: these were one rate-limited close_session line, which
  a connect-and-close flood suppressed). Each is bounded by the attaches.
- Everything else is limited as repeats: its key is (who, op, result,
  program) and each key has a token bucket of `rate` lines per second
  holding at most `rate` (one second of burst). So a flood of junk detaches
  spends only the budget of "that user's failed detaches", and a policy
  denial of an attach is only ever suppressed by identical denials (same
  user, same program) over the rate. "who" is the uid when the record has
  one; else the peer of an unauthenticated gRPC caller (each peer its own
  key); else the transport; else the broker itself (accept errors). A
  program name that is neither in the catalog nor in the policy counts as
  "(other)" in the key (set_programs), so a client cannot make keys without
  end by inventing names.
A record over its budget is not written but counted; SUMMARY_SECONDS after
the first line a key suppressed, a timer writes one summary line for the
key (op "audit_suppressed", with the key's who, program and counts), even
if the flood has stopped. flush_suppressed() writes every pending summary
at once (the broker calls it before its "stop" record).
"""

from __future__ import annotations

import datetime as _dt
import enum
import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TextIO

RESULTS = ("ok", "denied", "error")
# A client controls some of these strings (program names, paths): keep lines bounded.
MAX_FIELD_CHARS = 1024
_BASE_FIELDS = ("time", "uid", "pid", "op", "program", "sha256", "scope", "result", "detail")
# Administrative records: always written, whatever the rate limit.
NEVER_SUPPRESSED = frozenset({"start", "listen", "reload", "stop", "audit_suppressed"})
# Security-relevant successes: always written, whatever floods the log (issue #26).
ALWAYS_WRITTEN = frozenset({("attach", "ok"), ("detach", "ok"), ("issue_token", "ok")})
# The program of a key, when the name is neither in the catalog nor in the policy.
OTHER_PROGRAM = "(other)"
# A key's summary of suppressed lines comes this long after the first line it suppressed.
SUMMARY_SECONDS = 5.0
SUMMARY_OP = "audit_suppressed"
# Keys are uids (and transports): prune idle ones beyond this many.
MAX_KEYS = 4096


def _utc_now() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC)


def rfc3339(ts: _dt.datetime) -> str:
    """'2025-01-31T12:00:00.123Z' for an aware (or naive = UTC) datetime."""
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=_dt.UTC)
    ts = ts.astimezone(_dt.UTC)
    return ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z"


def _clean_str(s: str) -> str:
    # Lone surrogates (from undecodable file names) are not valid JSON text.
    s = s.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(s) > MAX_FIELD_CHARS:
        s = s[:MAX_FIELD_CHARS] + f"...(+{len(s) - MAX_FIELD_CHARS} chars)"
    return s


def _clean(value: Any) -> Any:
    """A JSON-safe version of value; never raises."""
    try:
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):
            return value
        if isinstance(value, float):
            return value if value == value and abs(value) != float("inf") else str(value)
        if isinstance(value, str):
            return _clean_str(value)
        if isinstance(value, bytes | bytearray | memoryview):
            raw = bytes(value)
            text = raw[: MAX_FIELD_CHARS // 2].hex()
            return text + ("..." if len(raw) > MAX_FIELD_CHARS // 2 else "")
        if isinstance(value, list | tuple | set | frozenset):
            items = list(value)[:64]
            return [_clean(v) for v in items]
        if isinstance(value, dict):
            return {_clean_str(str(k)): _clean(v) for k, v in list(value.items())[:64]}
        if isinstance(value, enum.Enum):
            return _clean_str(str(value.name))
        return _clean_str(str(value))
    except Exception:  # a hostile __str__ / __iter__ must not break logging
        try:
            return f"<unprintable {type(value).__name__}>"
        except Exception:
            return "<unprintable>"


def format_record(
    *,
    op: Any,
    result: Any,
    uid: Any = None,
    pid: Any = None,
    program: Any = None,
    sha256: Any = None,
    scope: Any = None,
    detail: Any = None,
    time: _dt.datetime | None = None,
    **extra: Any,
) -> str:
    """One audit line (without the newline). Never raises."""
    try:
        when = rfc3339(time if time is not None else _utc_now())
    except Exception:
        when = rfc3339(_utc_now())
    res = _clean(result)
    if res not in RESULTS:
        res = f"error(unknown result {res!r})"
    record: dict[str, Any] = {
        "time": when,
        "uid": _clean(uid),
        "pid": _clean(pid),
        "op": _clean(op),
        "program": _clean(program),
        "sha256": _clean(sha256),
        "scope": _clean(scope),
        "result": res,
        "detail": _clean(detail),
    }
    for key, value in extra.items():
        k = _clean_str(str(key))
        if k in _BASE_FIELDS:
            k = "extra_" + k
        record[k] = _clean(value)
    try:
        return json.dumps(record, ensure_ascii=True, separators=(",", ":"))
    except Exception:  # cannot happen after _clean, but logging must not raise
        return json.dumps({"time": when, "op": "audit", "result": "error", "detail": "unloggable"})


class _Bucket:
    """One key's token bucket, and what it suppressed since the last summary."""

    __slots__ = ("tokens", "last", "since", "suppressed", "by")

    def __init__(self, tokens: float, now: float) -> None:
        self.tokens = tokens
        self.last = now
        self.since: float | None = None  # first suppression of the current window
        self.suppressed = 0
        self.by: Counter[str] = Counter()  # "op result" -> lines


# (who kind, who, op, result, program): whose repeats a record is.
_Key = tuple[str, Any, str, str, Any]


def _who(fields: dict[str, Any]) -> tuple[str, Any]:
    uid = fields.get("uid")
    if uid is not None:
        return "uid", _clean(uid)
    transport = fields.get("transport")
    peer = fields.get("peer")
    if transport is not None and peer is not None:
        return "peer", f"{_clean(transport)} {_clean(peer)}"
    if transport is not None:
        return "transport", _clean(transport)
    return "source", "broker"


def _limit_key(
    op: Any, result: Any, fields: dict[str, Any], known: Callable[[str], bool] | None = None
) -> _Key | None:
    """Whose budget a record spends; None: never suppressed."""
    op_s, result_s = str(_clean(op)), str(_clean(result))
    if op_s in NEVER_SUPPRESSED or (op_s, result_s) in ALWAYS_WRITTEN:
        return None
    program = _clean(fields.get("program"))
    if program is not None and known is not None:
        try:
            program = program if known(str(program)) else OTHER_PROGRAM
        except Exception:
            program = OTHER_PROGRAM
    kind, who = _who(fields)
    return kind, who, op_s, result_s, program


class AuditLog:
    """Thread-safe writer of audit lines.

    stream=None writes to whatever sys.stderr is at the time of each write.
    No rate limit until set_rate(); monotonic is the limiter's clock (tests
    pass their own, with timer=False, and call flush_suppressed(due_only=True)).
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        clock: Callable[[], _dt.datetime] = _utc_now,
        monotonic: Callable[[], float] = time.monotonic,
        timer: bool = True,
    ) -> None:
        self._stream = stream
        self._clock = clock
        self._mono = monotonic
        self._lock = threading.Lock()  # one line at a time on the stream
        self._limit_lock = threading.Lock()  # buckets
        self._rate: int | None = None
        self._buckets: dict[_Key, _Bucket] = {}
        self._known: Callable[[str], bool] | None = None
        self._use_timer = timer
        self._wake = threading.Condition(self._limit_lock)
        self._timer: threading.Thread | None = None
        self._closed = False

    # ------------------------------------------------------------ rate limit

    @property
    def rate(self) -> int | None:
        return self._rate

    def set_rate(self, lines_per_second: int | None) -> None:
        """Limit each key to lines_per_second (burst: as many); None: no limit.

        Changing it (a policy reload) keeps the counts of what was suppressed.
        """
        if lines_per_second is not None and lines_per_second <= 0:
            raise ValueError("lines_per_second must be positive")
        with self._limit_lock:
            self._rate = lines_per_second
            if lines_per_second is not None:
                for b in self._buckets.values():
                    b.tokens = min(b.tokens, float(lines_per_second))

    def set_programs(self, known: Callable[[str], bool] | None) -> None:
        """Which program names key records by name (others: OTHER_PROGRAM)."""
        self._known = known

    def _admit(self, op: Any, result: Any, fields: dict[str, Any]) -> bool:
        """Whether to write this record (else it is counted for its key's summary)."""
        rate = self._rate
        if rate is None:
            return True
        key = _limit_key(op, result, fields, self._known)
        if key is None:
            return True
        try:
            now = self._mono()
        except Exception:
            now = time.monotonic()
        with self._limit_lock:
            b = self._buckets.get(key)
            if b is None:
                if len(self._buckets) >= MAX_KEYS:
                    self._forget_idle_locked(now)
                b = self._buckets[key] = _Bucket(float(rate), now)
            else:
                b.tokens = min(float(rate), b.tokens + (now - b.last) * rate)
                b.last = now
            if b.tokens >= 1.0:
                b.tokens -= 1.0
                return True
            b.suppressed += 1
            b.by[f"{_clean(op)} {_clean(result)}"] += 1
            if b.since is None:
                b.since = now
                self._start_timer_locked()
            return False

    def _start_timer_locked(self) -> None:
        if not self._use_timer or self._closed:
            return
        if self._timer is None or not self._timer.is_alive():
            self._timer = threading.Thread(
                target=self._timer_loop, name="gfxbpf-audit-summary", daemon=True
            )
            self._timer.start()
        else:
            self._wake.notify()

    def _timer_loop(self) -> None:
        """Write each key's summary when due; end when none is pending."""
        while True:
            with self._limit_lock:
                pending = [b.since for b in self._buckets.values() if b.since is not None]
                if self._closed or not pending:
                    self._timer = None
                    return
                wait = min(pending) + SUMMARY_SECONDS - self._mono()
                if wait > 0:
                    self._wake.wait(min(wait, SUMMARY_SECONDS))
                    continue
            self.flush_suppressed(due_only=True)

    def _take_summaries(self, due_only: bool) -> list[tuple[_Key, _Bucket, float]]:
        now = self._mono()
        out = []
        with self._limit_lock:
            for key, b in list(self._buckets.items()):
                if b.since is not None and (not due_only or now - b.since >= SUMMARY_SECONDS):
                    snap = _Bucket(b.tokens, b.last)
                    snap.since, snap.suppressed, snap.by = b.since, b.suppressed, b.by
                    out.append((key, snap, now))
                    b.since, b.suppressed, b.by = None, 0, Counter()
            self._forget_idle_locked(now)
        return out

    def _forget_idle_locked(self, now: float) -> None:
        """Drop the keys whose bucket is full again and that owe no summary."""
        rate = self._rate
        for key, b in list(self._buckets.items()):
            if b.since is None and (rate is None or b.tokens + (now - b.last) * rate >= rate):
                del self._buckets[key]

    def flush_suppressed(self, *, due_only: bool = False) -> int:
        """Write the summary line of every key that suppressed lines (due_only:
        only those whose SUMMARY_SECONDS have passed); return how many."""
        summaries = self._take_summaries(due_only)
        for key, b, now in summaries:
            self._write(self._summary_line(key, b, now))
        return len(summaries)

    def _summary_line(self, key: _Key, b: _Bucket, now: float) -> str:
        kind, who, op, result, program = key
        seconds = round(max(now - (b.since or now), 0.0), 3)
        fields: dict[str, Any] = {kind: who} if kind in ("uid", "peer") else {}
        if kind == "peer":
            fields["transport"] = str(who).partition(" ")[0]
        elif kind == "transport":
            fields["transport"] = who
        whom = f"{kind} {who}" if kind != "source" else "the broker"
        what = f"{op} {result}" + (f" of {program}" if program is not None else "")
        return format_record(
            op=SUMMARY_OP,
            result="ok",
            time=self._now(),
            program=program,
            detail=f"{b.suppressed} similar lines ({what}) suppressed for {whom} in the "
            f"last {seconds:g} s (more than {self._rate} lines/s of the same kind: [limits] "
            "audit_lines_per_second)",
            suppressed=b.suppressed,
            seconds=seconds,
            counts=dict(b.by.most_common(32)),
            **fields,
        )

    def close(self) -> None:
        """Write pending summaries and stop the summary timer."""
        self.flush_suppressed()
        with self._limit_lock:
            self._closed = True
            self._wake.notify_all()

    # ------------------------------------------------------------ writing

    def _now(self) -> _dt.datetime:
        try:
            return self._clock()
        except Exception:
            return _utc_now()

    def _write(self, line: str) -> None:
        stream = self._stream if self._stream is not None else sys.stderr
        try:
            with self._lock:
                stream.write(line + "\n")
                stream.flush()
        except Exception:
            pass  # a closed or broken stderr must not stop the broker serving

    def record(self, *, op: Any, result: Any, **fields: Any) -> str:
        """Write one line for a request; return it ("" when the rate limit
        suppressed it). Never raises."""
        return self._emit(op, result, fields, False)

    def record_always(self, *, op: Any, result: Any, **fields: Any) -> str:
        """record(), never held back by the rate limit: the end of what an
        attach began (implicit detaches), ALWAYS_WRITTEN's kin."""
        return self._emit(op, result, fields, True)

    def _emit(self, op: Any, result: Any, fields: dict[str, Any], always: bool) -> str:
        try:
            if not always and not self._admit(op, result, fields):
                return ""
        except Exception:
            pass  # the limiter must not lose a line by failing
        now = self._now()
        if "time" in fields:  # the clock owns "time"; keep the caller's value aside
            fields["extra_time"] = fields.pop("time")
        try:
            line = format_record(op=op, result=result, time=now, **fields)
        except Exception:  # defensive: format_record is written not to raise
            line = format_record(op="audit", result="error", detail="unloggable record")
        self._write(line)
        return line

    def ok(self, op: Any, **fields: Any) -> str:
        return self.record(op=op, result="ok", **fields)

    def denied(self, op: Any, **fields: Any) -> str:
        return self.record(op=op, result="denied", **fields)

    def error(self, op: Any, **fields: Any) -> str:
        return self.record(op=op, result="error", **fields)
