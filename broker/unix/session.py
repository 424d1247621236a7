"""One session on the Unix control socket: a connection, its thread, its Owner.

The peer is who SO_PEERCRED says (plus SO_PEERGROUPS), everything it
attaches belongs to one Owner, and when the connection ends (EOF, reset,
kill -9 of the client) close_owner() detaches it all. One datagram is one
Request; the Response echoes its id and carries map fds as SCM_RIGHTS
(gfxbpf.proto.framing).

A garbage, truncated or oversized datagram gets an ERROR_PROTOCOL reply
(id 0, since its id cannot be read) and the session goes on. The only fd
a client sends is an Attach's library (AttachParams.library_fd_index);
every fd a request carries is closed once it is answered. A session whose
first request does not arrive within hello_timeout_seconds is told so and
closed (audited).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable
from typing import Any, cast

from google.protobuf.message import Message

from gfxbpf.broker.callers import Caller
from gfxbpf.broker.errors import BrokerError
from gfxbpf.broker.owners import Owner
from gfxbpf.broker.service import Service
from gfxbpf.proto import framing
from gfxbpf.proto import gfxbpf_pb2 as pb

# A refused session (sessions_per_user) waits this long for its first request.
REFUSE_WAIT_SECONDS = 2.0

# Request bodies answered by one reply in the Response field of the same name.
UNARY: dict[str, Callable[[Service, Caller, Owner, Any], Message]] = {
    "hello": lambda s, caller, owner, body: s.hello(caller, body),
    "list_programs": lambda s, caller, owner, body: s.list_programs(caller, body),
    "detach": lambda s, caller, owner, body: s.detach(caller, owner, body),
    "read_map": lambda s, caller, owner, body: s.read_map(caller, owner, body),
    "stats": lambda s, caller, owner, body: s.stats(caller, owner, body),
    "issue_token": lambda s, caller, owner, body: s.issue_token(caller, owner, body),
}


class Session:
    """A connection's thread: run() serves it until it ends, then calls on_end(self)."""

    def __init__(
        self,
        service: Service,
        conn: socket.socket,
        uid: int = -1,
        on_end: Callable[[Session], None] | None = None,
    ) -> None:
        self.service = service
        self.conn = conn
        self.uid = uid  # SO_PEERCRED at accept: what the server counts it under
        self.on_end = on_end
        self.send_lock = threading.Lock()
        self.caller: Caller | None = None
        self.owner: Owner | None = None

    def send(self, resp: pb.Response, fds: list[int] | None = None) -> None:
        with self.send_lock:
            framing.send_message(self.conn, resp, fds or ())

    def error(self, req_id: int, code: int, message: str, rule: str = "") -> None:
        # cast: the stubs type code as the enum; the runtime takes any int.
        error = pb.Error(code=cast(pb.ErrorCode, code), message=message, rule=rule)
        self.send(pb.Response(id=req_id, error=error))

    def run(self) -> None:
        try:
            creds = framing.peer_credentials(self.conn)
            try:
                groups = framing.peer_groups(self.conn)
            except OSError:
                groups = []
            gids = tuple(sorted({creds.gid, *groups}))
            self.caller = Caller(creds.uid, creds.gid, gids, creds.pid, "unix")
            try:
                self.owner = self.service.open_owner(self.caller)
            except BrokerError as e:
                self._refuse(e)
                return
            self._loop()
        except (framing.FramingError, BrokenPipeError, ConnectionResetError):
            pass  # the peer went away mid-reply: the session is over
        except OSError as e:  # not the peer's doing (EBADF, EMFILE...): say why it ended
            if self.caller is not None:
                self._audit("session", "error", detail=f"session ended: {type(e).__name__}: {e}")
        finally:
            if self.owner is not None:
                self.service.close_owner(self.owner)
            with contextlib.suppress(OSError):
                self.conn.close()
            if self.on_end is not None:
                self.on_end(self)

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
        timeout = self.service.policy.limits.hello_timeout_seconds
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
        self.service.audit.record(
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
        """Answer one request: its reply, or the error it ended with."""
        body = req.WhichOneof("body")
        try:
            self._answer(req, body, fds or [])
        except BrokerError as e:
            self.error(req.id, e.code, e.message, e.rule)
        except (framing.FramingError, OSError):
            raise
        except Exception as e:  # a broker bug: answer, log, keep serving
            self._audit(
                body or "unknown", "error", detail=f"internal error: {type(e).__name__}: {e}"
            )
            self.error(req.id, pb.ERROR_INTERNAL, f"internal error: {type(e).__name__}: {e}")

    def _answer(self, req: pb.Request, body: str | None, fds: list[int]) -> None:
        caller, owner = self.caller, self.owner
        assert caller is not None and owner is not None
        if body in UNARY:
            reply = UNARY[body](self.service, caller, owner, getattr(req, body))
            # The reply field is named like the request's (typed per field in the stubs).
            fields: dict[str, Any] = {body: reply}
            self.send(pb.Response(id=req.id, **fields))
        elif body == "attach":
            areply, map_fds = self.service.attach(caller, owner, req.attach, fds)
            try:
                self.send(pb.Response(id=req.id, attach=areply), map_fds)
            except framing.MessageTooLarge as e:
                self.error(req.id, pb.ERROR_INTERNAL, f"attach reply too large: {e}")
            finally:  # duplicates made for this reply (replies.describe)
                for fd in map_fds:
                    os.close(fd)
        elif body == "stream_events":
            # Raises INVALID_ARGUMENT over Unix: the client holds the ring's fd.
            for batch in self.service.stream_events(
                caller, owner, req.stream_events, lambda: owner.closed
            ):
                self.send(pb.Response(id=req.id, events=batch))
        else:
            self._audit_protocol(f"request {req.id} has no body")
            self.error(
                req.id,
                pb.ERROR_PROTOCOL,
                "request has no body (or one this broker does not know): set one of "
                "hello, list_programs, attach, detach, read_map, stream_events, stats, "
                "issue_token",
            )


__all__ = ["REFUSE_WAIT_SECONDS", "UNARY", "Session"]
