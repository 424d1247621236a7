"""The gRPC Unix socket, accepted by the broker itself (issue #26, finding 1).

grpc serves on a socket in a private directory (mode 0700: the broker's
user only). The world-connectable socket callers use is the broker's own:
for each connection the accept loop reads SO_PEERCRED and refuses (closes at
once, audited) a uid that already holds [limits] grpc_connections_per_user
connections, anything past grpc_connections_total, and anything that would
leave fewer than FD_RESERVE descriptors for the Unix listener, its sessions
and new maps. An admitted connection whose first bytes do not come within
grpc_connect_seconds is closed before it costs more than its own fd; then
it is relayed byte for byte to grpc's socket, and grpc itself closes it once
no call has run on it for grpc_idle_seconds (max_connection_idle_ms).

Why a relay, and not grpc's own settings: grpc accepts on its own socket
and none of its options caps connections per peer. Its idle and handshake
timeouts only bound how long each idle connection lives: a user who opens
connections faster than they time out still holds thousands of fds (the
attack of issue #26 held 24,000). A total cap alone lets one user take every
place, shutting everyone else out of gRPC. grpc's Python API cannot adopt a
connection accepted elsewhere, so the broker accepts, decides, and relays.
Cost: two more fds per admitted connection (FDS_PER_CONNECTION) and one copy
through the event loop.

The relay binds its side of each inner connection to an abstract name that
carries the caller's uid and pid, so grpc's context.peer() tells who is
calling (peer_fields), and unauthenticated callers are audited per uid.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import resource
import secrets
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gfxbpf.broker.access.peruser import PerUser
from gfxbpf.broker.listening import ACCEPT_BATCH, LISTEN_BACKLOG, hung_up
from gfxbpf.proto import framing

if TYPE_CHECKING:
    from gfxbpf.broker.policy.model import Limits
    from gfxbpf.broker.service import Service

log = logging.getLogger("gfxbpf.broker.grpc")

FD_RESERVE = 1024  # fds no gRPC connection may take (Unix sessions, maps, the listeners)
# ...or half the fd limit, when that is smaller (a limit of 1024 still serves gRPC).
FDS_PER_CONNECTION = 3  # the caller's, the relay's inner one, grpc's end of it
RELAY_CHUNK = 64 * 1024  # bytes read at once: a connection holds at most this in the relay
ACCEPT_RETRY_SECONDS = 0.1  # after accept() failed (EMFILE and friends)
_PEER_NAME = re.compile(r"^unix-abstract:gfxbpf-grpc-[0-9a-f]+-uid(\d+)-pid(\d+)$")
_HOST_PORT = re.compile(r"^(ipv4:[^:]+|ipv6:\[[^\]]+\]):\d+$")


@dataclass(frozen=True)
class Peer:
    uid: int
    pid: int

    def inner_name(self) -> str:
        """The abstract address of the relay's side of the inner connection."""
        return f"\0gfxbpf-grpc-{secrets.token_hex(6)}-uid{self.uid}-pid{self.pid}"


def peer_fields(peer: str) -> dict[str, Any]:
    """Audit fields for grpc's context.peer(): {"peer": "uid N", "peer_pid": P}
    for a relayed Unix caller, the host without the port for TCP, else as is."""
    m = _PEER_NAME.match(peer)
    if m:
        return {"peer": f"uid {m.group(1)}", "peer_pid": int(m.group(2))}
    m = _HOST_PORT.match(peer)
    return {"peer": m.group(1) if m else peer}


def raise_fd_limit() -> int:
    """Raise the soft fd limit to the hard one (the unit's LimitNOFILE); the new soft."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def open_listener(path: str, mode: int) -> socket.socket:
    """The public SOCK_STREAM socket at path, chmod mode (the unit's UMask made it 0600)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        try:
            os.chmod(path, mode)
        except OSError as e:
            raise OSError(f"--grpc unix:{path}: cannot chmod the socket: {e.strerror}") from e
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class GrpcAcceptor:
    """Accepts on the public socket, relays admitted connections to grpc's (on its loop)."""

    def __init__(self, service: Service, listener: socket.socket, inner_path: str) -> None:
        self.service = service
        self.listener = listener
        self.inner_path = inner_path
        self.per_uid = PerUser()
        self.total = 0
        self._fd_limit = raise_fd_limit()
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopped = False

    def start(self) -> None:
        """Start accepting (call on the event loop)."""
        asyncio.get_running_loop().add_reader(self.listener.fileno(), self._accept_ready)

    async def stop(self) -> None:
        """Stop accepting and end every relayed connection."""
        self._stopped = True
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(self.listener.fileno())
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.listener.close()

    def total_cap(self, limits: Limits) -> int:
        """grpc_connections_total, lowered so the reserve of fds stays free."""
        room = (self._fd_limit - self.fd_reserve) // FDS_PER_CONNECTION
        return min(limits.grpc_connections_total, room)

    @property
    def fd_reserve(self) -> int:
        return min(FD_RESERVE, self._fd_limit // 2)

    # ------------------------------------------------------------ accept

    def _accept_ready(self) -> None:
        """Accept what waits in the backlog, up to ACCEPT_BATCH, each decided at
        once (broker/listening.py): the queue drains faster than a flood fills it."""
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE and friends: report (rate-limited), back off
                self._audit("accept", "error", detail=f"accept failed: {e}", transport="grpc")
                self._pause()
                return
            try:
                self._admit(conn)
            except Exception:  # never let one connection end the accept loop
                log.exception("admitting a gRPC connection failed")
                conn.close()

    def _pause(self) -> None:
        """Stop accepting for ACCEPT_RETRY_SECONDS (accept itself fails)."""
        loop = asyncio.get_running_loop()
        fd = self.listener.fileno()
        loop.remove_reader(fd)

        def resume() -> None:
            if not self._stopped:
                loop.add_reader(fd, self._accept_ready)

        loop.call_later(ACCEPT_RETRY_SECONDS, resume)

    def _admit(self, conn: socket.socket) -> None:
        """Relay conn to grpc, or refuse it (closed at once, audited); one
        whose caller already hung up is only closed."""
        if hung_up(conn):
            conn.close()
            return
        try:
            creds = framing.peer_credentials(conn)
        except OSError:
            conn.close()
            return
        peer = Peer(creds.uid, creds.pid)
        limits = self.service.policy.limits
        why = self._over_limit(limits, peer.uid)  # one loop: nothing changes until we return
        if why is not None:
            conn.close()
            message, rule = why
            self._audit(
                "grpc_connect",
                "denied",
                uid=peer.uid,
                pid=peer.pid,
                transport="grpc",
                code="ERROR_RESOURCE_EXHAUSTED",
                detail=message,
                rule=rule,
            )
            return
        self.per_uid.take(peer.uid, limits.grpc_connections_per_user)
        self.total += 1
        task = asyncio.get_running_loop().create_task(self._relay(conn, peer))
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._done(t, peer.uid))

    def _over_limit(self, limits: Limits, uid: int) -> tuple[str, str] | None:
        per_user = limits.grpc_connections_per_user
        if self.per_uid.count(uid) >= per_user:
            return (
                f"uid {uid} already has {per_user} gRPC connections open",
                f"[limits] grpc_connections_per_user = {per_user}",
            )
        cap = self.total_cap(limits)
        if self.total >= cap:
            rule = f"[limits] grpc_connections_total = {limits.grpc_connections_total}"
            if cap < limits.grpc_connections_total:
                rule += f" (lowered to {cap}: {self.fd_reserve} of {self._fd_limit} fds kept free)"
            return f"the broker already has {cap} gRPC connections open", rule
        return None

    def _done(self, task: asyncio.Task[None], uid: int) -> None:
        self._tasks.discard(task)
        self.total -= 1
        self.per_uid.give_back(uid)

    # ------------------------------------------------------------ relay

    async def _relay(self, conn: socket.socket, peer: Peer) -> None:
        """Wait for the caller's first bytes, then copy both ways until either ends."""
        loop = asyncio.get_running_loop()
        inner: socket.socket | None = None
        try:
            conn.setblocking(False)
            seconds = self.service.policy.limits.grpc_connect_seconds
            try:
                first = await asyncio.wait_for(loop.sock_recv(conn, RELAY_CHUNK), seconds)
            except TimeoutError:
                self._audit_silent(peer, seconds)
                return
            if not first:
                return
            inner = await self._connect_inner(peer)
            await loop.sock_sendall(inner, first)
            await asyncio.gather(_copy(conn, inner), _copy(inner, conn))
        except OSError:
            pass  # either side went away
        finally:
            conn.close()
            if inner is not None:
                inner.close()

    async def _connect_inner(self, peer: Peer) -> socket.socket:
        inner = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with contextlib.suppress(OSError):  # a name in use: grpc just sees no peer
                inner.bind(peer.inner_name())
            inner.setblocking(False)
            await asyncio.get_running_loop().sock_connect(inner, self.inner_path)
        except BaseException:
            inner.close()
            raise
        return inner

    # ------------------------------------------------------------ audit

    def _audit_silent(self, peer: Peer, seconds: int) -> None:
        self._audit(
            "grpc_connect",
            "denied",
            uid=peer.uid,
            pid=peer.pid,
            transport="grpc",
            code="ERROR_RESOURCE_EXHAUSTED",
            detail=f"nothing sent within {seconds} s of connecting: closed",
            rule=f"[limits] grpc_connect_seconds = {seconds}",
        )

    def _audit(self, op: str, result: str, **fields: Any) -> None:
        audit = getattr(self.service, "audit", None)
        if audit is None:
            return
        try:
            audit.record(op=op, result=result, **fields)
        except Exception:  # the audit log must not take the listener down
            log.exception("audit failed")


async def _copy(src: socket.socket, dst: socket.socket) -> None:
    """src -> dst until src ends; then dst's write side ends too. On an error both
    ends are shut down, so the copy the other way ends as well."""
    loop = asyncio.get_running_loop()
    try:
        while data := await loop.sock_recv(src, RELAY_CHUNK):
            await loop.sock_sendall(dst, data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
    except OSError:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


__all__ = [
    "FDS_PER_CONNECTION",
    "FD_RESERVE",
    "GrpcAcceptor",
    "Peer",
    "open_listener",
    "peer_fields",
]
