"""The Unix control socket transport: one SOCK_SEQPACKET connection = one session.

Each Request carries an id the broker echoes; replies are matched by it.
Calls are serialised with a lock (one request in flight per connection), so
a connection may be shared between threads. Received fds belong to the
caller of the operation that returned them.
"""

from __future__ import annotations

import errno
import itertools
import os
import socket
import stat
import threading
from collections.abc import Sequence

from gfxbpf.client.addresses import DEFAULT_SOCKET
from gfxbpf.client.errors import (
    EXIT_DENIED,
    START_HINT,
    BrokerUnreachable,
    ClientError,
    ProtocolError,
    from_pb,
)
from gfxbpf.client.transport import EventCall
from gfxbpf.proto import framing
from gfxbpf.proto import gfxbpf_pb2 as pb

# Attach may verify and load several programs: allow the broker time.
DEFAULT_TIMEOUT = 120.0


class SocketPermissionError(ClientError):
    """The control socket exists but this user may not connect to it."""

    exit_code = EXIT_DENIED


def default_socket() -> str:
    return os.environ.get("GFXBPF_SOCKET") or DEFAULT_SOCKET


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class UnixConnection:
    """A session with the broker over its Unix control socket (a transport.Transport)."""

    transport = "unix"
    passes_fds = True

    def __init__(self, path: str | None = None, *, timeout: float | None = DEFAULT_TIMEOUT) -> None:
        self.path = path or default_socket()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.connect(self.path)
        except FileNotFoundError:
            sock.close()
            raise BrokerUnreachable(
                f"the gfxbpf broker is not running: no control socket at {self.path}\n"
                f"  {START_HINT}"
            ) from None
        except ConnectionRefusedError:
            sock.close()
            if not _is_socket(self.path):
                raise BrokerUnreachable(
                    f"{self.path} is not a socket: not the gfxbpf broker's control socket\n"
                    f"  {START_HINT}"
                ) from None
            raise BrokerUnreachable(
                f"the gfxbpf broker is not running: nothing listens on {self.path} "
                f"(a stale socket)\n  {START_HINT}"
            ) from None
        except PermissionError:
            sock.close()
            raise SocketPermissionError(
                f"permission denied connecting to {self.path}: the socket (or its directory) "
                "does not let this user in\n  ask your administrator to check the gfxbpf.socket "
                "unit (SocketMode=0666) and the policy"
            ) from None
        except OSError as e:
            sock.close()
            if e.errno in (errno.EPROTOTYPE, errno.ENOTSOCK, errno.ECONNREFUSED):
                raise BrokerUnreachable(
                    f"{self.path} is not the gfxbpf broker's control socket ({e.strerror})\n"
                    f"  {START_HINT}"
                ) from None
            raise BrokerUnreachable(f"cannot connect to {self.path}: {e.strerror}") from None
        sock.settimeout(timeout)
        self._sock: socket.socket | None = sock

    # --- lifetime ---

    @property
    def closed(self) -> bool:
        return self._sock is None

    def close(self) -> None:
        """End the session: the broker detaches everything it attached."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def __enter__(self) -> UnixConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- requests ---

    def _socket(self) -> socket.socket:
        if self._sock is None:
            raise ClientError("the connection to the broker is closed")
        return self._sock

    def _send(self, field: str, body: object, fds: Sequence[int] = ()) -> int:
        req_id = next(self._ids)
        req = pb.Request(id=req_id)
        getattr(req, field).CopyFrom(body)
        try:
            framing.send_message(self._socket(), req, fds)
        except framing.PeerClosed as e:
            last_word = self._pending_error()
            self.close()
            if last_word is not None:
                raise last_word from None
            raise BrokerUnreachable(f"the broker closed the session ({e})") from None
        except TimeoutError:
            raise BrokerUnreachable("the broker did not take the request in time") from None
        return req_id

    def _pending_error(self) -> Exception | None:
        """An error the broker sent before closing (e.g. it refused the session)."""
        sock = self._sock
        if sock is None:
            return None
        try:
            sock.settimeout(0.5)
            resp, fds = framing.recv_message(sock, pb.Response)
        except (framing.FramingError, OSError):
            return None
        _close_fds(fds)
        if resp.WhichOneof("body") == "error":
            return from_pb(resp.error, "connect")
        return None

    def _recv(self, req_id: int, field: str, op: str) -> tuple[object, list[int]]:
        sock = self._socket()
        while True:
            try:
                resp, fds = framing.recv_message(sock, pb.Response)
            except framing.PeerClosed:
                # A reset is reported before the data still queued: the broker's
                # last word (why it ended the session) may follow.
                last_word = self._pending_error()
                self.close()
                if last_word is not None:
                    raise last_word from None
                raise BrokerUnreachable(
                    f"the broker closed the session during {op} (did it stop or restart?)"
                ) from None
            except framing.FramingError as e:
                raise ProtocolError(f"unreadable reply from the broker to {op}: {e}") from None
            except TimeoutError:
                raise BrokerUnreachable(f"the broker did not answer {op} in time") from None
            kind = resp.WhichOneof("body")
            if resp.id != req_id and not (resp.id == 0 and kind == "error"):
                _close_fds(fds)  # a late reply to an abandoned request
                continue
            # id 0 carries session-level errors (e.g. a sessions_per_user limit
            # when the broker refuses the connection, or an unreadable request).
            if kind == "error":
                _close_fds(fds)
                raise from_pb(resp.error, op)
            if kind != field:
                _close_fds(fds)
                raise ProtocolError(f"the broker answered {op} with {kind or 'nothing'}")
            return getattr(resp, field), fds

    def call(self, field: str, body: object, fds: Sequence[int] = ()) -> tuple[object, list[int]]:
        """Send one request (with fds, which stay ours); return (reply body, received fds)."""
        op = field
        with self._lock:
            req_id = self._send(field, body, fds)
            return self._recv(req_id, field, op)

    def call_nofds(self, field: str, body: object) -> object:
        reply, fds = self.call(field, body)
        _close_fds(fds)
        return reply

    # --- operations ---

    def hello(self, req: pb.HelloRequest) -> pb.HelloReply:
        return self.call_nofds("hello", req)  # type: ignore[return-value]

    def list_programs(self) -> pb.ListProgramsReply:
        return self.call_nofds("list_programs", pb.ListProgramsRequest())  # type: ignore[return-value]

    def attach(
        self, req: pb.AttachRequest, fds: Sequence[int] = ()
    ) -> tuple[pb.AttachReply, list[int]]:
        """fds: the library fd a uprobe attach passes (AttachParams.library_fd_index)."""
        return self.call("attach", req, fds)  # type: ignore[return-value]

    def detach(self, attachment_id: int) -> pb.DetachReply:
        return self.call_nofds("detach", pb.DetachRequest(attachment_id=attachment_id))  # type: ignore[return-value]

    def read_map(self, req: pb.ReadMapRequest) -> pb.ReadMapReply:
        return self.call_nofds("read_map", req)  # type: ignore[return-value]

    def stats(self, attachment_id: int = 0) -> pb.StatsReply:
        return self.call_nofds("stats", pb.StatsRequest(attachment_id=attachment_id))  # type: ignore[return-value]

    def issue_token(self, ttl_seconds: int = 0) -> pb.IssueTokenReply:
        return self.call_nofds("issue_token", pb.IssueTokenRequest(ttl_seconds=ttl_seconds))  # type: ignore[return-value]

    def stream_events(self, req: pb.StreamEventsRequest) -> EventCall:
        """Not over this socket: the attach reply hands each ring buffer's fd instead."""
        raise ClientError(
            f"the broker passed no fd for the ring buffer {req.map!r}; "
            "stream it over gRPC instead (--via grpc)"
        )
