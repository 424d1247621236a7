"""The Unix control socket: SOCK_SEQPACKET, one thread per session.

A connection is a session: the peer is who SO_PEERCRED says (plus
SO_PEERGROUPS), everything it attaches belongs to one Owner, and when the
connection ends (EOF, reset, kill -9 of the client) close_owner() detaches
it all. One datagram is one Request; the Response echoes its id and carries
map fds as SCM_RIGHTS (gfxbpf.proto.framing).

A garbage, truncated or oversized datagram gets an ERROR_PROTOCOL reply
(id 0, since its id cannot be read) and the session goes on. The only fd
a client sends is an Attach's library (AttachParams.library_fd_index);
every fd a request carries is closed once it is answered. Nothing a client
sends can stop the others being served.

Floods (issue #16): the accept loop reads SO_PEERCRED and refuses a
connection over the policy's sessions_per_user (per uid) or sessions_total
(all users) before any thread is spent on it. A refused connection waits,
in the accept loop's own poll set, for its first request, which is answered
with the RESOURCE_EXHAUSTED error (so the client reads why), then closed;
at most REFUSE_PENDING_PER_USER / REFUSE_PENDING_TOTAL wait at once, the
rest get the error at once and are closed. A session whose first request
does not arrive within hello_timeout_seconds is told so and closed
(audited). So one user holds at most sessions_per_user threads, and the
broker at most sessions_total.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gfxbpf.broker.service import BrokerError, Caller, Owner, Service
from gfxbpf.proto import framing
from gfxbpf.proto import gfxbpf_pb2 as pb

ACCEPT_POLL_SECONDS = 0.5
# A refused session (sessions_per_user) waits this long for its first request.
REFUSE_WAIT_SECONDS = 2.0
# Refused connections waiting for their first request, per uid and in all;
# beyond these the error is sent at once and the connection closed.
REFUSE_PENDING_PER_USER = 4
REFUSE_PENDING_TOTAL = 64


@dataclass
class _Refusal:
    """A connection refused at accept, waiting (in the accept loop) for its first request."""

    conn: socket.socket
    uid: int
    deadline: float
    error: pb.Error


class Session:
    def __init__(self, server: UnixServer, conn: socket.socket, uid: int = -1) -> None:
        self.server = server
        self.conn = conn
        self.uid = uid  # SO_PEERCRED at accept: what the server counts it under
        self.send_lock = threading.Lock()
        self.caller: Caller | None = None
        self.owner: Owner | None = None

    def send(self, resp: pb.Response, fds: list[int] | None = None) -> None:
        with self.send_lock:
            framing.send_message(self.conn, resp, fds or ())

    def error(self, req_id: int, code: int, message: str, rule: str = "") -> None:
        self.send(pb.Response(id=req_id, error=pb.Error(code=code, message=message, rule=rule)))

    def run(self) -> None:
        service = self.server.service
        try:
            creds = framing.peer_credentials(self.conn)
            try:
                groups = framing.peer_groups(self.conn)
            except OSError:
                groups = []
            gids = tuple(sorted({creds.gid, *groups}))
            self.caller = Caller(creds.uid, creds.gid, gids, creds.pid, "unix")
            try:
                self.owner = service.open_owner(self.caller)
            except BrokerError as e:
                self._refuse(e)
                return
            self._loop()
        except (framing.FramingError, OSError):
            pass  # the peer went away mid-reply: the session is over
        finally:
            if self.owner is not None:
                service.close_owner(self.owner)
            with contextlib.suppress(OSError):
                self.conn.close()
            self.server._forget(self)

    def _refuse(self, err: BrokerError) -> None:
        """Answer the session's first request with err, then close.

        Answering a request (rather than writing first and closing) matters:
        closing a socket with an unread request resets it, and the client
        would lose the reply that says why.
        """
        req_id = 0
        with contextlib.suppress(framing.FramingError, OSError):
            self.conn.settimeout(REFUSE_WAIT_SECONDS)
            try:
                req, fds = framing.recv_message(self.conn, pb.Request)
                for fd in fds:
                    os.close(fd)
                req_id = req.id
            except TimeoutError:
                pass
            self.error(req_id, err.code, err.message, err.rule)

    def _loop(self) -> None:
        service = self.server.service
        timeout = service.policy.limits.hello_timeout_seconds
        self.conn.settimeout(timeout)  # for the first request only
        first = True
        while True:
            try:
                req, fds = framing.recv_message(self.conn, pb.Request)
            except framing.PeerClosed:
                return
            except TimeoutError:
                if not first:
                    raise
                self._hello_timeout(timeout)
                return
            except framing.FramingError as e:
                if first:
                    first = False
                    self.conn.settimeout(None)
                self._audit_protocol(str(e))
                self.error(0, pb.ERROR_PROTOCOL, str(e))
                continue
            if first:
                first = False
                self.conn.settimeout(None)
            try:
                self.handle(req, fds)
            finally:  # the service duplicated what it keeps (an Attach's library fd)
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)

    def _hello_timeout(self, timeout: int) -> None:
        """No first request within hello_timeout_seconds: say so, audit, end the session."""
        assert self.caller is not None
        rule = f"[limits] hello_timeout_seconds = {timeout}"
        message = (
            f"no request within {timeout} s of connecting: the session is closed (send Hello first)"
        )
        self._audit(
            "open_session", "denied", code="ERROR_RESOURCE_EXHAUSTED", detail=message, rule=rule
        )
        with contextlib.suppress(framing.FramingError, OSError):
            self.conn.settimeout(1.0)
            self.error(0, pb.ERROR_RESOURCE_EXHAUSTED, message, rule)

    def _audit(self, op: str, result: str, **fields: object) -> None:
        """One audit line about this session's caller."""
        assert self.caller is not None
        self.server.service.audit.record(
            op=op,
            result=result,
            uid=self.caller.uid,
            pid=self.caller.pid,
            transport="unix",
            **fields,
        )

    def _audit_protocol(self, detail: str) -> None:
        self._audit("protocol", "error", detail=detail)

    def handle(self, req: pb.Request, fds: list[int] | None = None) -> None:
        service = self.server.service
        caller, owner = self.caller, self.owner
        assert caller is not None and owner is not None
        body = req.WhichOneof("body")
        try:
            if body == "hello":
                self.send(pb.Response(id=req.id, hello=service.hello(caller, req.hello)))
            elif body == "list_programs":
                reply = service.list_programs(caller, req.list_programs)
                self.send(pb.Response(id=req.id, list_programs=reply))
            elif body == "attach":
                areply, map_fds = service.attach(caller, owner, req.attach, fds or ())
                try:
                    self.send(pb.Response(id=req.id, attach=areply), map_fds)
                except framing.MessageTooLarge as e:
                    self.error(req.id, pb.ERROR_INTERNAL, f"attach reply too large: {e}")
            elif body == "detach":
                self.send(pb.Response(id=req.id, detach=service.detach(caller, owner, req.detach)))
            elif body == "read_map":
                reply = service.read_map(caller, owner, req.read_map)
                self.send(pb.Response(id=req.id, read_map=reply))
            elif body == "stream_events":
                # Raises INVALID_ARGUMENT over Unix: the client holds the ring's fd.
                for batch in service.stream_events(
                    caller, owner, req.stream_events, lambda: owner.closed
                ):
                    self.send(pb.Response(id=req.id, events=batch))
            elif body == "stats":
                self.send(pb.Response(id=req.id, stats=service.stats(caller, owner, req.stats)))
            elif body == "issue_token":
                reply = service.issue_token(caller, owner, req.issue_token)
                self.send(pb.Response(id=req.id, issue_token=reply))
            else:
                self._audit_protocol(f"request {req.id} has no body")
                self.error(
                    req.id,
                    pb.ERROR_PROTOCOL,
                    "request has no body (or one this broker does not know): set one of "
                    "hello, list_programs, attach, detach, read_map, stream_events, stats, "
                    "issue_token",
                )
        except BrokerError as e:
            self.error(req.id, e.code, e.message, e.rule)
        except (framing.FramingError, OSError):
            raise
        except Exception as e:  # a broker bug: answer, log, keep serving
            self._audit(
                body or "unknown", "error", detail=f"internal error: {type(e).__name__}: {e}"
            )
            self.error(req.id, pb.ERROR_INTERNAL, f"internal error: {type(e).__name__}: {e}")


class UnixServer:
    """Accepts sessions on a listening SOCK_SEQPACKET socket until shutdown()."""

    def __init__(
        self,
        service: Service,
        listener: socket.socket,
        *,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.service = service
        self.listener = listener
        self._on_error = on_error
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sessions: set[Session] = set()
        self._per_uid: dict[int, int] = {}  # open sessions by SO_PEERCRED uid
        self._refusals: dict[int, _Refusal] = {}  # fd -> waiting refused connection
        self._refusals_per_uid: dict[int, int] = {}
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)

    @property
    def session_count(self) -> int:
        with self._lock:
            return len(self._sessions)

    def sessions_of(self, uid: int) -> int:
        with self._lock:
            return self._per_uid.get(uid, 0)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve, name="gfxbpf-unix-accept", daemon=True)
        self._thread.start()

    def serve(self) -> None:
        self.listener.setblocking(False)
        poller = select.poll()
        poller.register(self.listener.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        self._poller = poller
        try:
            while not self._stop.is_set():
                timeout = ACCEPT_POLL_SECONDS
                if self._refusals:
                    soonest = min(r.deadline for r in self._refusals.values())
                    timeout = min(timeout, max(0.0, soonest - time.monotonic()))
                try:
                    events = poller.poll(timeout * 1000)
                except InterruptedError:
                    continue
                if self._stop.is_set():
                    break
                for fd, _ in events:
                    if fd in self._refusals:
                        self._answer_refusal(fd)
                self._expire_refusals()
                if any(fd == self.listener.fileno() for fd, _ in events):
                    self._accept_some()
        finally:
            for fd in list(self._refusals):
                self._end_refusal(fd)

    def _accept_some(self, batch: int = 64) -> None:
        """Accept up to batch waiting connections (then poll again: refusals waiting too)."""
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
        """Start a session for conn, or refuse it without spending a thread."""
        try:
            creds = framing.peer_credentials(conn)
        except OSError:
            with contextlib.suppress(OSError):
                conn.close()
            return
        limits = self.service.policy.limits
        with self._lock:
            have = self._per_uid.get(creds.uid, 0)
            total = len(self._sessions)
            if have >= limits.sessions_per_user:
                why = (
                    f"uid {creds.uid} already has {have} open sessions, the policy's limit "
                    "(close one, or ask the administrator to raise it)",
                    f"[limits] sessions_per_user = {limits.sessions_per_user}",
                )
            elif total >= limits.sessions_total:
                why = (
                    f"the broker already serves {total} sessions, the policy's limit for all "
                    "users together (try again later)",
                    f"[limits] sessions_total = {limits.sessions_total}",
                )
            else:
                why = None
                session = Session(self, conn, creds.uid)
                self._sessions.add(session)
                self._per_uid[creds.uid] = have + 1
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
            self._refuse(
                conn,
                creds.uid,
                pb.Error(code=pb.ERROR_RESOURCE_EXHAUSTED, message=message, rule=rule),
            )
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

    # ------------------------------------------------------------ refusals

    def _refuse(self, conn: socket.socket, uid: int, error: pb.Error) -> None:
        """Answer conn's first request with error, then close it (see Session._refuse).

        It waits in the accept loop's poll set; when too many wait already,
        the error is sent now and the connection closed at once.
        """
        if (
            len(self._refusals) >= REFUSE_PENDING_TOTAL
            or self._refusals_per_uid.get(uid, 0) >= REFUSE_PENDING_PER_USER
        ):
            self._send_error(conn, 0, error)
            with contextlib.suppress(OSError):
                conn.close()
            return
        fd = conn.fileno()
        self._refusals[fd] = _Refusal(conn, uid, time.monotonic() + REFUSE_WAIT_SECONDS, error)
        self._refusals_per_uid[uid] = self._refusals_per_uid.get(uid, 0) + 1
        self._poller.register(fd, select.POLLIN)

    @staticmethod
    def _send_error(conn: socket.socket, req_id: int, error: pb.Error) -> None:
        with contextlib.suppress(framing.FramingError, OSError):
            conn.setblocking(False)  # the peer's queue is never full here; never wait
            framing.send_message(conn, pb.Response(id=req_id, error=error))

    def _answer_refusal(self, fd: int) -> None:
        r = self._refusals.get(fd)
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
        self._send_error(r.conn, req_id, r.error)
        self._end_refusal(fd)

    def _expire_refusals(self) -> None:
        now = time.monotonic()
        for fd, r in list(self._refusals.items()):
            if r.deadline <= now:
                self._send_error(r.conn, 0, r.error)
                self._end_refusal(fd)

    def _end_refusal(self, fd: int) -> None:
        r = self._refusals.pop(fd, None)
        if r is None:
            return
        with contextlib.suppress(KeyError, ValueError, AttributeError):
            self._poller.unregister(fd)
        n = self._refusals_per_uid.get(r.uid, 1) - 1
        if n > 0:
            self._refusals_per_uid[r.uid] = n
        else:
            self._refusals_per_uid.pop(r.uid, None)
        with contextlib.suppress(OSError):
            r.conn.close()

    # ------------------------------------------------------------ lifetime

    def _forget(self, session: Session) -> None:
        with self._lock:
            if session in self._sessions:
                self._sessions.discard(session)
                n = self._per_uid.get(session.uid, 1) - 1
                if n > 0:
                    self._per_uid[session.uid] = n
                else:
                    self._per_uid.pop(session.uid, None)

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
