"""Counts per uid under a limit: the one "count up, or refuse; count down, or
forget the uid" used for sessions, attachments and gRPC calls in flight."""

from __future__ import annotations

import threading


class PerUser:
    """A count per uid under a limit (open sessions, attachments, gRPC calls)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[int, int] = {}

    def take(self, uid: int, limit: int) -> int | None:
        """Count one more for uid: None when counted, else how many uid holds
        already (its limit or more)."""
        with self._lock:
            have = self._counts.get(uid, 0)
            if have >= limit:
                return have
            self._counts[uid] = have + 1
            return None

    def give_back(self, uid: int) -> None:
        """One fewer for uid; a uid at zero leaves the table."""
        with self._lock:
            n = self._counts.get(uid, 0) - 1
            if n > 0:
                self._counts[uid] = n
            else:
                self._counts.pop(uid, None)

    def count(self, uid: int | None = None) -> int:
        """What uid holds (all uids together when None)."""
        with self._lock:
            if uid is None:
                return sum(self._counts.values())
            return self._counts.get(uid, 0)
