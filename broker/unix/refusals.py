"""Connections the Unix accept loop refused, waiting for their first request.

A connection over the policy's sessions_per_user or sessions_total is
refused before any thread is spent on it. It waits, in the accept loop's own
poll set, for its first request, which is answered with the refusal (so the
client reads why), then closed: answering a request rather than writing
first and closing matters, because closing a socket with an unread request
resets it and the client would lose the reply. At most
REFUSE_PENDING_PER_USER / REFUSE_PENDING_TOTAL wait at once; the rest get
the error at once and are closed. Used by the accept loop's thread only.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gfxbpf.broker.access.peruser import PerUser
from gfxbpf.broker.owners import too_many_sessions
from gfxbpf.broker.unix.session import REFUSE_WAIT_SECONDS
from gfxbpf.proto import framing
from gfxbpf.proto import gfxbpf_pb2 as pb

if TYPE_CHECKING:
    from gfxbpf.broker.policy.rules import Limits

# Refused connections waiting for their first request, per uid and in all;
# beyond these the error is sent at once and the connection closed.
REFUSE_PENDING_PER_USER = 4
REFUSE_PENDING_TOTAL = 64


@dataclass
class Refusal:
    """A connection refused at accept, waiting (in the accept loop) for its first request."""

    conn: socket.socket
    uid: int
    deadline: float
    error: pb.Error


def over_limit(limits: Limits, uid: int, have: int, total: int) -> tuple[str, str] | None:
    """(message, rule) when uid, with have sessions of total, may open no other."""
    per_user, all_users = limits.sessions_per_user, limits.sessions_total
    if have >= per_user:
        return too_many_sessions(uid, have), f"[limits] sessions_per_user = {per_user}"
    if total >= all_users:
        return (
            f"the broker already serves {total} sessions, the policy's limit for all "
            "users together (try again later)",
            f"[limits] sessions_total = {all_users}",
        )
    return None


def send_error(conn: socket.socket, req_id: int, error: pb.Error) -> None:
    """Send error without waiting (the peer's queue is never full here)."""
    with contextlib.suppress(framing.FramingError, OSError):
        conn.setblocking(False)
        framing.send_message(conn, pb.Response(id=req_id, error=error))


class Refusals:
    """The refused connections waiting in poller, by fd."""

    def __init__(self, poller: select.poll) -> None:
        self._poller = poller
        self._waiting: dict[int, Refusal] = {}
        self._per_uid = PerUser()  # waiting refusals by uid

    def __contains__(self, fd: int) -> bool:
        return fd in self._waiting

    def timeout(self, longest: float) -> float:
        """Seconds the poll may wait: longest, or less when a refusal expires sooner."""
        if not self._waiting:
            return longest
        soonest = min(r.deadline for r in self._waiting.values())
        return min(longest, max(0.0, soonest - time.monotonic()))

    def refuse(self, conn: socket.socket, uid: int, error: pb.Error) -> None:
        """Answer conn's first request with error, then close it; or now, when too many wait."""
        if (
            len(self._waiting) >= REFUSE_PENDING_TOTAL
            or self._per_uid.take(uid, REFUSE_PENDING_PER_USER) is not None
        ):
            send_error(conn, 0, error)
            with contextlib.suppress(OSError):
                conn.close()
            return
        fd = conn.fileno()
        self._waiting[fd] = Refusal(conn, uid, time.monotonic() + REFUSE_WAIT_SECONDS, error)
        self._poller.register(fd, select.POLLIN)

    def answer(self, fd: int) -> None:
        """fd is readable: answer its request (id echoed when readable) and close it."""
        r = self._waiting.get(fd)
        if r is None:
            return
        req_id = 0
        with contextlib.suppress(framing.FramingError, OSError):
            r.conn.setblocking(False)
            req, fds = framing.recv_message(r.conn, pb.Request)
            for f in fds:
                with contextlib.suppress(OSError):
                    os.close(f)
            req_id = req.id
        send_error(r.conn, req_id, r.error)
        self.end(fd)

    def expire(self) -> None:
        """Send the error to, and close, every refusal past its deadline."""
        now = time.monotonic()
        for fd, r in list(self._waiting.items()):
            if r.deadline <= now:
                send_error(r.conn, 0, r.error)
                self.end(fd)

    def end(self, fd: int) -> None:
        r = self._waiting.pop(fd, None)
        if r is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._poller.unregister(fd)
        self._per_uid.give_back(r.uid)
        with contextlib.suppress(OSError):
            r.conn.close()

    def end_all(self) -> None:
        for fd in list(self._waiting):
            self.end(fd)


__all__ = [
    "REFUSE_PENDING_PER_USER",
    "REFUSE_PENDING_TOTAL",
    "Refusal",
    "Refusals",
    "over_limit",
    "send_error",
]
