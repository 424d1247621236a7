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
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
from collections.abc import Callable

from gfxbpf.broker.service import BrokerError, Caller, Owner, Service
from gfxbpf.proto import framing
from gfxbpf.proto import gfxbpf_pb2 as pb

ACCEPT_POLL_SECONDS = 0.5
# A refused session (sessions_per_user) waits this long for its first request.
REFUSE_WAIT_SECONDS = 2.0


class Session:
    def __init__(self, server: UnixServer, conn: socket.socket) -> None:
        self.server = server
        self.conn = conn
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
        while True:
            try:
                req, fds = framing.recv_message(self.conn, pb.Request)
            except framing.PeerClosed:
                return
            except framing.FramingError as e:
                self._audit_protocol(str(e))
                self.error(0, pb.ERROR_PROTOCOL, str(e))
                continue
            try:
                self.handle(req, fds)
            finally:  # the service duplicated what it keeps (an Attach's library fd)
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)

    def _audit_protocol(self, detail: str) -> None:
        assert self.caller is not None
        self.server.service.audit.record(
            op="protocol",
            result="error",
            uid=self.caller.uid,
            pid=self.caller.pid,
            transport="unix",
            detail=detail,
        )

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
            service.audit.record(
                op=body or "unknown",
                result="error",
                uid=caller.uid,
                pid=caller.pid,
                transport="unix",
                detail=f"internal error: {type(e).__name__}: {e}",
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
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)

    @property
    def session_count(self) -> int:
        with self._lock:
            return len(self._sessions)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve, name="gfxbpf-unix-accept", daemon=True)
        self._thread.start()

    def serve(self) -> None:
        self.listener.setblocking(False)
        poller = select.poll()
        poller.register(self.listener.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while not self._stop.is_set():
            try:
                events = poller.poll(ACCEPT_POLL_SECONDS * 1000)
            except InterruptedError:
                continue
            if not events or self._stop.is_set():
                continue
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as e:  # EMFILE and friends: report, back off, go on
                if self._on_error:
                    self._on_error(f"accept failed: {e}")
                self._stop.wait(0.1)
                continue
            conn.setblocking(True)
            session = Session(self, conn)
            with self._lock:
                self._sessions.add(session)
            t = threading.Thread(target=session.run, name="gfxbpf-session", daemon=True)
            try:
                t.start()
            except RuntimeError as e:  # cannot start a thread: refuse this client only
                with self._lock:
                    self._sessions.discard(session)
                with contextlib.suppress(OSError):
                    conn.close()
                if self._on_error:
                    self._on_error(f"cannot start a session thread: {e}")

    def _forget(self, session: Session) -> None:
        with self._lock:
            self._sessions.discard(session)

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
