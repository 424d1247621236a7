"""Broker: the client library's entry point.

    from gfxbpf.client import Broker

    with Broker.connect() as broker:
        with broker.attach("syscount", scope="self") as att:
            time.sleep(1)
            for key, value in att.maps["counts"].read():
                ...

Transport (via=): "fd" keeps the Unix-socket session and reads the map fds
the broker passes; "grpc" gets a token over the Unix socket (or uses
GFXBPF_TOKEN / a client certificate) and does everything over gRPC; "auto"
picks "fd" when the broker's Hello says unprivileged map reads work on this
kernel (features.direct_map_reads), else "grpc" (and, if no gRPC listener
answers, the Unix session with reads through the broker).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

from gfxbpf.client.connection import UnixConnection, default_socket
from gfxbpf.client.errors import BrokerError, BrokerUnreachable, UsageError
from gfxbpf.client.grpc_config import TlsFiles, default_grpc
from gfxbpf.client.handle import Attachment
from gfxbpf.client.transport import Transport
from gfxbpf.proto import gfxbpf_pb2 as pb
from gfxbpf.proto.scopes import SCOPE_ENUMS, is_scope_value

if TYPE_CHECKING:
    from gfxbpf.client.tokens import TokenCache

PROTOCOL = 1
VIAS = ("auto", "fd", "grpc")


@functools.cache
def client_version() -> str:
    """The installed gfxbpf's version, from its dist-info directory's name.

    importlib.metadata.version() costs ~21 ms (it imports email, zipfile,
    csv...; 97 M instructions under callgrind), and every connection's Hello
    carries the version: it is the fallback only.
    """
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.startswith(_DIST_PREFIX) and name.endswith(".dist-info"):
                return name[len(_DIST_PREFIX) : -len(".dist-info")]
    from importlib import metadata

    try:
        return metadata.version("gfxbpf")
    except metadata.PackageNotFoundError:
        return "0+unknown"


_DIST_PREFIX = "gfxbpf-"


def scope_value(scope: str | int | None) -> pb.Scope:
    if isinstance(scope, int):
        if not is_scope_value(scope):
            raise UsageError(f"unknown scope {scope}")
        return cast(pb.Scope, scope)  # one of the three: the stubs type them as the enum
    if not scope:  # None or "": the policy picks
        return pb.SCOPE_UNSPECIFIED
    try:
        return SCOPE_ENUMS[scope]
    except KeyError:
        raise UsageError(f"unknown scope {scope!r}: use 'self' or 'system'") from None


class Broker:
    """A connection to the gfxbpf broker (a session); close() detaches everything."""

    def __init__(
        self,
        transport: Transport,
        hello: pb.HelloReply,
        via: str,
        *,
        direct_reads: bool,
        socket_path: str | None = None,
        grpc_address: str | None = None,
    ) -> None:
        self.transport: Transport = transport
        self._hello = hello
        self.via = via
        self.direct_reads = direct_reads  # read passed map fds ourselves
        self.socket_path = socket_path
        self.grpc_address = grpc_address
        self._attachments: list[Attachment] = []

    # --- connecting ---

    @classmethod
    def connect(
        cls,
        socket: str | None = None,
        grpc: str | None = None,
        via: str = "auto",
        *,
        token: str | None = None,
        tls: TlsFiles | None = None,
    ) -> Broker:
        """Connect to the broker.

        socket: the Unix control socket (default $GFXBPF_SOCKET or
        /run/gfxbpf/control.sock). grpc: the gRPC address (default
        $GFXBPF_GRPC or unix:/run/gfxbpf/grpc.sock). token: a gRPC token
        (default $GFXBPF_TOKEN; else one is issued over the socket and cached).
        """
        if via not in VIAS:
            raise UsageError(f"unknown transport {via!r}: use one of {', '.join(VIAS)}")
        socket_path = socket or default_socket()
        grpc_address = grpc or default_grpc()
        token = token or os.environ.get("GFXBPF_TOKEN") or None
        has_identity = token is not None or (tls is not None and tls.cert is not None)

        requested = via
        unix: UnixConnection | None = None
        try:
            unix = UnixConnection(socket_path)
        except BrokerUnreachable:
            # Without the socket, gRPC still works for whoever can authenticate there.
            if via == "fd" or not has_identity:
                raise
        try:
            hello = unix.hello(_hello_request()) if unix is not None else None
            if via == "auto":
                via = "fd" if hello is not None and hello.features.direct_map_reads else "grpc"
            if via == "fd":
                assert unix is not None and hello is not None
                return cls(
                    unix,
                    hello,
                    "fd",
                    direct_reads=hello.features.direct_map_reads,
                    socket_path=socket_path,
                )
            try:
                broker = cls._connect_grpc(unix, grpc_address, token, tls, socket_path)
            except BrokerUnreachable:
                if requested != "auto" or unix is None or hello is None:
                    raise
                # No gRPC listener: keep the session and read maps through the broker.
                return cls(unix, hello, "fd", direct_reads=False, socket_path=socket_path)
            if unix is not None:
                unix.close()  # the token outlives the session that issued it
                unix = None
            return broker
        except BaseException:
            if unix is not None:
                unix.close()
            raise

    @classmethod
    def _connect_grpc(
        cls,
        unix: UnixConnection | None,
        address: str,
        token: str | None,
        tls: TlsFiles | None,
        socket_path: str,
    ) -> Broker:
        from gfxbpf.client.grpc_transport import GrpcTransport
        from gfxbpf.client.tokens import TokenCache, cache_key  # gRPC only: hashlib, tempfile

        transport = GrpcTransport(
            address, token, tls=tls if not address.startswith("unix:") else None
        )
        try:
            cache = TokenCache()
            key = cache_key(socket_path, address)
            issued_here = False
            if transport.token is None and (tls is None or tls.cert is None):
                cached = cache.get(key)
                if cached is not None:
                    transport.set_token(cached)
                elif unix is not None:
                    transport.set_token(_issue(unix, cache, key))
                    issued_here = True
                else:
                    raise BrokerUnreachable(
                        f"gRPC needs a token, and the Unix socket {socket_path} (which issues "
                        "them) cannot be reached; set GFXBPF_TOKEN"
                    )
            try:
                hello = transport.hello(_hello_request())
            except BrokerError as e:
                # A cached token from an earlier broker run: get a fresh one once.
                if e.code != pb.ERROR_UNAUTHENTICATED or issued_here or unix is None:
                    raise
                cache.forget(key)
                transport.set_token(_issue(unix, cache, key))
                hello = transport.hello(_hello_request())
            return cls(transport, hello, "grpc", direct_reads=False, grpc_address=address)
        except BaseException:
            transport.close()
            raise

    # --- lifetime ---

    def close(self) -> None:
        """Detach every attachment and end the session (idempotent)."""
        for att in list(self._attachments):
            with contextlib.suppress(Exception):
                att.detach()
        self._attachments.clear()
        self.transport.close()

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _forget(self, att: Attachment) -> None:
        with contextlib.suppress(ValueError):
            self._attachments.remove(att)

    # --- operations ---

    def hello(self) -> pb.HelloReply:
        """The broker's Hello (versions, kernel features, who it thinks we are)."""
        return self._hello

    def list_programs(self) -> list[pb.ProgramListing]:
        """The programs this user may run (with availability on this host)."""
        return list(self.transport.list_programs().programs)

    def program(self, name: str) -> pb.ProgramListing:
        programs = self.list_programs()
        for p in programs:
            if p.name == name:
                return p
        names = ", ".join(p.name for p in programs) or "none"
        raise UsageError(
            f"no program {name!r} among those you may use (yours: {names}); "
            "`gfxclient list` shows them"
        )

    def attach(
        self,
        name: str | None = None,
        scope: str | int | None = None,
        pid: int | None = None,
        library: str | None = None,
        functions: Iterable[str] = (),
        *,
        object: bytes | None = None,
        lease_seconds: int = 0,
        frequency: int = 0,
        children: bool = False,
        stack_bytes: int = 0,
        min_block_us: int = 0,
        python_files: Iterable[pb.PythonFile] = (),
        python_frames: int = 0,
        job: str = "",
        sample_bytes: int = 0,
    ) -> Attachment:
        """Attach a catalog program by name (or approved object bytes).

        job (scope "job"): a Slurm job id of this user's, running on this node.

        children (with pid): the process's descendants too, those alive now
        and those it forks later, followed in the kernel.

        python_files (programs that walk Python frames): the CPython
        executables whose processes' Python frames to walk.

        library (uprobe programs): over the Unix socket this process opens it
        and passes the fd, so it must be readable by this user; over gRPC the
        broker opens it, and only if this user could.
        """
        if (name is None) == (object is None):
            raise UsageError("attach needs exactly one of a program name or object bytes")
        params = pb.AttachParams(
            pid=pid or 0, library=library or "", functions=[str(f) for f in functions],
            frequency=frequency,  # sampling programs (profile); 0: the default
            children=children,
            stack_bytes=stack_bytes,  # stackcopy, ustackcopy; 0: 8 KiB or the policy's cap
            min_block_us=min_block_us,  # offcpu: shortest wait kept; 0: the default
            python_files=list(python_files),
            python_frames=python_frames,
            job=job,  # scope job: the Slurm job id
            sample_bytes=sample_bytes,  # memstacks: bytes per recorded allocation; 0: all
        )  # fmt: skip
        req = pb.AttachRequest(scope=scope_value(scope), params=params)
        if lease_seconds < 0:
            raise UsageError("lease_seconds must be >= 0")
        req.lease_seconds = lease_seconds
        if name is not None:
            req.name = name
        else:
            req.object = bytes(object or b"")
        return self._send_attach(req, library)

    def _send_attach(self, req: pb.AttachRequest, library: str | None) -> Attachment:
        """Send the request (with the library's fd over the Unix socket)."""
        if library and self.transport.passes_fds:
            # The broker opens no path for us: we open the library and pass it.
            lib_fd = open_library(library)
            req.params.library_fd_index = 0
            try:
                reply, fds = self.transport.attach(req, [lib_fd])
            finally:
                os.close(lib_fd)
        else:
            reply, fds = self.transport.attach(req)
        att = self._attachment(reply, fds)
        self._attachments.append(att)
        return att

    def _attachment(self, reply: pb.AttachReply, fds: list[int]) -> Attachment:
        """The reply as an Attachment; on failure its fds closed and the broker told."""
        try:
            return Attachment(self, reply, fds)
        except BaseException:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            with contextlib.suppress(Exception):
                self.transport.detach(reply.attachment_id)
            raise

    @property
    def attachments(self) -> list[Attachment]:
        return list(self._attachments)

    def stats(self, attachment_id: int = 0) -> pb.StatsReply:
        """Run counts and run times (0: every attachment this caller holds)."""
        return self.transport.stats(attachment_id)


def open_library(path: str) -> int:
    """An fd on the uprobe target, opened as the user (the broker checks the file)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise UsageError(
            f"cannot open library {path}: {e.strerror}\n"
            "  the broker traces only a library you can read yourself; check the path"
        ) from None


def _hello_request() -> pb.HelloRequest:
    return pb.HelloRequest(protocol=PROTOCOL, client_version=f"gfxclient {client_version()}")


def _issue(unix: UnixConnection, cache: TokenCache, key: str) -> str:
    reply = unix.issue_token()
    cache.put(key, reply.token, reply.expires_unix)
    return reply.token
