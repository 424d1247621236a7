"""The Unix control socket: SOCK_SEQPACKET, one thread per session.

A connection is a session (unix_session.Session): its peer is who
SO_PEERCRED says, everything it attaches belongs to one Owner, and when it
ends the broker detaches it all. Nothing a client sends can stop the others
being served.

Floods (issue #16): the accept loop reads SO_PEERCRED and refuses a
connection over the policy's sessions_per_user (per uid) or sessions_total
(all users) before any thread is spent on it; the refused connection waits
in the accept loop's own poll set to be told why (unix_refusals). A session
whose first request does not arrive within hello_timeout_seconds is told so
and closed (audited). So one user holds at most sessions_per_user threads,
and the broker at most sessions_total.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
from collections.abc import Callable

from gfxbpf.broker.access.peruser import PerUser
from gfxbpf.broker.listening import ACCEPT_BATCH, hung_up
from gfxbpf.broker.service import Service
from gfxbpf.broker.unix.refusals import (
    REFUSE_PENDING_PER_USER,
    REFUSE_PENDING_TOTAL,
    Refusals,
    over_limit,
)
from gfxbpf.broker.unix.session import REFUSE_WAIT_SECONDS, Session
from gfxbpf.proto import framing
from gfxbpf.proto import gfxbpf_pb2 as pb

ACCEPT_POLL_SECONDS = 0.5


class UnixServer:
    """Accepts sessions on a listening SOCK_SEQPACKET socket until shutdown()."""

    def __init__(
        self,
        service: Service,
        listener: socket.socket,
        *,
        on_error: Callable[[str], object] | None = None,
    ) -> None:
        self.service = service
        self.listener = listener
        self._on_error = on_error
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sessions: set[Session] = set()
        self._per_uid = PerUser()  # open sessions by SO_PEERCRED uid
        self._poller = select.poll()  # the accept loop's: listener, wake pipe, refusals
        self._refusals = Refusals(self._poller)
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)

    @property
    def session_count(self) -> int:
        with self._lock:
            return len(self._sessions)

    def sessions_of(self, uid: int) -> int:
        with self._lock:
            return self._per_uid.count(uid)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve, name="gfxbpf-unix-accept", daemon=True)
        self._thread.start()

    def serve(self) -> None:
        self.listener.setblocking(False)
        listener_fd = self.listener.fileno()
        self._poller.register(listener_fd, select.POLLIN)
        self._poller.register(self._wake_r, select.POLLIN)
        try:
            while not self._stop.is_set():
                timeout = self._refusals.timeout(ACCEPT_POLL_SECONDS)
                try:
                    events = self._poller.poll(timeout * 1000)
                except InterruptedError:
                    continue
                if self._stop.is_set():
                    break
                for fd, _ in events:
                    if fd in self._refusals:
                        self._refusals.answer(fd)
                self._refusals.expire()
                if any(fd == listener_fd for fd, _ in events):
                    self._accept_some()
        finally:
            self._refusals.end_all()

    def _accept_some(self, batch: int = ACCEPT_BATCH) -> None:
        """Accept up to batch waiting connections (then poll again: refusals waiting
        too), each decided at once (broker/listening.py)."""
        for _ in range(batch):
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE and friends: report, back off, go on
                if self._on_error:
                    self._on_error(f"accept failed: {e}")
                self._stop.wait(0.1)
                return
            self._admit(conn)

    def _admit(self, conn: socket.socket) -> None:
        """Start a session for conn, or refuse it without spending a thread; one
        whose client already hung up is only closed."""
        if hung_up(conn):
            with contextlib.suppress(OSError):
                conn.close()
            return
        try:
            creds = framing.peer_credentials(conn)
        except OSError:
            with contextlib.suppress(OSError):
                conn.close()
            return
        with self._lock:
            limits = self.service.policy.limits
            have = self._per_uid.count(creds.uid)
            why = over_limit(limits, creds.uid, have, len(self._sessions))
            if why is None:
                session = Session(self.service, conn, creds.uid, on_end=self._forget)
                self._sessions.add(session)
                self._per_uid.take(creds.uid, limits.sessions_per_user)  # room: checked above
        if why is not None:
            message, rule = why
            self.service.audit.record(
                op="open_session",
                result="denied",
                uid=creds.uid,
                pid=creds.pid,
                transport="unix",
                code="ERROR_RESOURCE_EXHAUSTED",
                detail=message,
                rule=rule,
            )
            error = pb.Error(code=pb.ERROR_RESOURCE_EXHAUSTED, message=message, rule=rule)
            self._refusals.refuse(conn, creds.uid, error)
            return
        conn.setblocking(True)
        t = threading.Thread(target=session.run, name="gfxbpf-session", daemon=True)
        try:
            t.start()
        except RuntimeError as e:  # cannot start a thread: refuse this client only
            self._forget(session)
            with contextlib.suppress(OSError):
                conn.close()
            if self._on_error:
                self._on_error(f"cannot start a session thread: {e}")

    # ------------------------------------------------------------ lifetime

    def _forget(self, session: Session) -> None:
        with self._lock:
            if session in self._sessions:
                self._sessions.discard(session)
                self._per_uid.give_back(session.uid)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop accepting, end every session (their owners close), wait a little."""
        self._stop.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout)
        with contextlib.suppress(OSError):
            self.listener.close()
        with self._lock:
            sessions = list(self._sessions)
        for s in sessions:
            with contextlib.suppress(OSError):
                s.conn.shutdown(socket.SHUT_RDWR)
        deadline = threading.Event()
        for _ in range(int(timeout * 20)):
            if not self.session_count:
                break
            deadline.wait(0.05)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


__all__ = [
    "ACCEPT_POLL_SECONDS",
    "REFUSE_PENDING_PER_USER",
    "REFUSE_PENDING_TOTAL",
    "REFUSE_WAIT_SECONDS",
    "Session",
    "UnixServer",
]
