"""The broker's audit log: one JSON object per line, one line per request.

Written to stderr by default, where journald picks it up. Fields, in order:
time (RFC 3339, UTC, milliseconds), uid, pid, op, program, sha256, scope,
result ("ok", "denied" or "error"), detail, then any extra keys (e.g. rule,
attachment_id, transport).

Logging must never take the broker down: odd values (bytes, objects whose
str() raises, lone surrogates, huge strings) are coerced or truncated, and a
failing stream is ignored.
"""

from __future__ import annotations

import datetime as _dt
import enum
import json
import sys
import threading
from collections.abc import Callable
from typing import Any, TextIO

RESULTS = ("ok", "denied", "error")
# A client controls some of these strings (program names, paths): keep lines bounded.
MAX_FIELD_CHARS = 1024
_BASE_FIELDS = ("time", "uid", "pid", "op", "program", "sha256", "scope", "result", "detail")


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


class AuditLog:
    """Thread-safe writer of audit lines.

    stream=None writes to whatever sys.stderr is at the time of each write.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        clock: Callable[[], _dt.datetime] = _utc_now,
    ) -> None:
        self._stream = stream
        self._clock = clock
        self._lock = threading.Lock()

    def record(self, *, op: Any, result: Any, **fields: Any) -> str:
        """Write one line for a request; return it. Never raises."""
        try:
            now = self._clock()
        except Exception:
            now = _utc_now()
        if "time" in fields:  # the clock owns "time"; keep the caller's value aside
            fields["extra_time"] = fields.pop("time")
        try:
            line = format_record(op=op, result=result, time=now, **fields)
        except Exception:  # defensive: format_record is written not to raise
            line = format_record(op="audit", result="error", detail="unloggable record")
        stream = self._stream if self._stream is not None else sys.stderr
        try:
            with self._lock:
                stream.write(line + "\n")
                stream.flush()
        except Exception:
            pass  # a closed or broken stderr must not stop the broker serving
        return line

    def ok(self, op: Any, **fields: Any) -> str:
        return self.record(op=op, result="ok", **fields)

    def denied(self, op: Any, **fields: Any) -> str:
        return self.record(op=op, result="denied", **fields)

    def error(self, op: Any, **fields: Any) -> str:
        return self.record(op=op, result="error", **fields)
