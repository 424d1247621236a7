"""The gRPC listener: service Broker of proto/gfxbpf.proto over grpc.aio.

A thin adapter over broker.service.Service, for callers that cannot receive
fds (remote hosts, containers, older kernels): no fd is passed, map contents
come through ReadMap (paged) and StreamEvents (the broker consumes the
attachment's own ring buffer).

Authentication, per call:
- metadata "authorization: Bearer <token>", a token IssueToken gave out on
  a Unix-socket session (tokens.TokenStore; the caller is the uid/groups of
  that session), or, when no token is sent,
- the mTLS client certificate (listener with --tls-*; the handshake already
  required a certificate signed by --tls-client-ca), mapped to a user by a
  [[tls_client]] policy entry (subject CN and/or certificate SHA-256).
Neither: UNAUTHENTICATED, with a message that says how to get a token.
Both are decided from what arrives before the request message (grpc_auth),
so a call that sends headers and then nothing never gets further than that.

Connections (issue #26): on a unix: address the broker accepts callers
itself and relays them to grpc on a private socket (grpc/accept.py says why),
so connections are capped per SO_PEERCRED uid and in total at accept, with
fds kept free for the rest of the broker; grpc closes connections that
stay without a call ([limits] grpc_idle_seconds) or do not finish the
HTTP/2 handshake (grpc_connect_seconds).

Floods (issue #16): the server is grpc.aio (grpc_servicer.BrokerServicer
says why), so a call waiting for its request holds no thread; each
authenticated uid may have [limits] grpc_calls_per_user calls in flight
(grpc_slots; more: RESOURCE_EXHAUSTED at once), and a call's request must
arrive within grpc_request_seconds of its headers (else INVALID_ARGUMENT,
ERROR_PROTOCOL).

The parts, by job: grpc_auth (who calls), grpc_slots (calls in flight per
uid), grpc_servicer (the event-loop side of a call), grpc_methods (what a
method does on the Service, in a thread; leases), grpc_errors (a
BrokerError as a status and gfxbpf-* trailers). This module holds the TLS
files and the listener: its event-loop thread, start and stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import stat
import threading
from concurrent import futures
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from gfxbpf.broker.access.leases import REAP_INTERVAL, LeaseManager
from gfxbpf.broker.access.tokens import TokenStore
from gfxbpf.broker.grpc.accept import GrpcAcceptor, open_listener
from gfxbpf.broker.grpc.errors import (
    HOW_TO_AUTHENTICATE,
    META_CODE,
    META_ERROR,
    META_RULE,
    STATUS_OF,
)
from gfxbpf.broker.grpc.methods import METHODS
from gfxbpf.broker.grpc.servicer import BrokerServicer, Gate
from gfxbpf.broker.threadnames import name_this_thread

if TYPE_CHECKING:
    from gfxbpf.broker.service import Service

log = logging.getLogger("gfxbpf.broker.grpc")


@dataclass(frozen=True)
class TlsConfig:
    """PEM bytes for an mTLS listener (read once at start)."""

    cert: bytes
    key: bytes
    client_ca: bytes

    @classmethod
    def load(cls, cert_file: str, key_file: str, client_ca_file: str) -> TlsConfig:
        """Read the three PEM files; OSError/ValueError name the file and what to do."""
        data: list[bytes] = []
        for what, path in (
            ("--tls-cert", cert_file),
            ("--tls-key", key_file),
            ("--tls-client-ca", client_ca_file),
        ):
            try:
                with open(path, "rb") as f:
                    raw = f.read(1 << 20)
            except OSError as e:
                raise OSError(
                    e.errno,
                    f"{what} {path}: cannot read: {e.strerror} (the broker runs as its "
                    "own user: make the file readable by it)",
                ) from e
            if b"-----BEGIN " not in raw:
                raise ValueError(f"{what} {path}: not a PEM file (no -----BEGIN line)")
            data.append(raw)
        return cls(*data)


def tls_from_config(cfg: Any) -> TlsConfig | None:
    """TlsConfig from a BrokerConfig (None when no --tls-cert was given)."""
    if not getattr(cfg, "tls_cert", None):
        return None
    if not cfg.tls_client_ca:
        raise ValueError("--tls-cert needs --tls-client-ca: gRPC callers must present a cert")
    return TlsConfig.load(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca)


def _unix_path(address: str) -> str | None:
    if not address.startswith("unix:"):
        return None
    rest = address[len("unix:") :]
    return "/" + rest.lstrip("/") if rest.startswith("//") else rest


class GrpcServer:
    """A running listener (from start_grpc_server). stop() is idempotent.

    The grpc.aio server runs on its own event loop in thread "gfxbpf-grpc-loop";
    the Service's work runs in `pool` (unary calls) and `streams` (one thread
    per open StreamEvents).
    """

    def __init__(
        self,
        server: grpc.aio.Server,
        address: str,
        port: int | None,
        unix_path: str | None,
        tokens: TokenStore,
        leases: LeaseManager,
        service: Service,
        servicer: BrokerServicer,
        loop: asyncio.AbstractEventLoop,
        thread: threading.Thread,
        acceptor: GrpcAcceptor | None = None,
    ) -> None:
        self.server = server
        self.acceptor = acceptor  # unix: the broker's own accept side (None for TCP)
        self.address = address  # what it listens on, with the real port
        self.port = port  # TCP port (None for unix:)
        self.unix_path = unix_path
        self.tokens = tokens
        self.leases = leases
        self.service = service
        self.servicer = servicer
        self.slots = servicer.slots  # calls in flight per uid
        self._loop = loop
        self._thread = thread
        self._stopped = threading.Event()

    def stop(self, grace: float = 2.0) -> None:
        """Stop accepting, end in-flight calls (after grace s), detach every gRPC attachment."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self.acceptor is not None:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self.acceptor.stop(), self._loop).result(5.0)
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.server.stop(grace), self._loop).result(
                grace + 5.0
            )
        self.leases.stop()
        if getattr(self.service, "tokens", None) is self.tokens:
            self.service.tokens = None
        _stop_loop(self._loop, self._thread)
        self.servicer.pool.shutdown(wait=False, cancel_futures=True)
        self.servicer.streams.shutdown(wait=False, cancel_futures=True)
        if self.unix_path is not None:
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(os.lstat(self.unix_path).st_mode):
                    os.unlink(self.unix_path)
        if self.acceptor is not None:
            shutil.rmtree(os.path.dirname(self.acceptor.inner_path), ignore_errors=True)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for stop(); True when timeout passed first (as grpc's wait_for_termination)."""
        return not self._stopped.wait(timeout)


def _start_loop() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """A new event loop, running in thread "gfxbpf-grpc-loop"."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=_run_loop, args=(loop,), name="gfxbpf-grpc-loop", daemon=True)
    thread.start()
    return loop, thread


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        with contextlib.suppress(Exception):
            loop.run_until_complete(loop.shutdown_asyncgens())


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(loop.stop)
    thread.join(10.0)
    if not thread.is_alive():
        with contextlib.suppress(Exception):
            loop.close()


def _prepare_unix_path(path: str) -> None:
    """Remove a stale socket left by a previous broker; refuse to replace anything else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise OSError(f"--grpc unix:{path}: exists and is not a socket; remove it or pick another")
    os.unlink(path)


def _listen_path(address: str, tls: TlsConfig | None) -> str | None:
    """The socket path of a unix: address (None for host:port); raises ValueError."""
    unix_path = _unix_path(address)
    if unix_path is None and tls is None:
        raise ValueError(
            f"--grpc {address}: a network listener needs mTLS (--tls-cert, --tls-key, "
            "--tls-client-ca); for local use give unix:/path"
        )
    if unix_path is not None and not unix_path.startswith("/"):
        raise ValueError(f"--grpc {address}: use an absolute path (unix:/run/gfxbpf/grpc.sock)")
    return unix_path


def _server_options(limits: Any) -> list[tuple[str, int]]:
    return [
        # A connection without a call in flight this long is closed (GOAWAY): idle
        # connections cost the broker fds and memory. Clients reconnect on their next call.
        ("grpc.max_connection_idle_ms", limits.grpc_idle_seconds * 1000),
        # ...and one that does not finish its handshake (HTTP/2 preface, TLS) this soon.
        ("grpc.server_handshake_timeout_ms", limits.grpc_connect_seconds * 1000),
        # Never share a port with another process (grpc's default is SO_REUSEPORT).
        ("grpc.so_reuseport", 0),
        # An uploaded object is the largest request; bound what one call may make us hold.
        ("grpc.max_receive_message_length", max(limits.max_object_bytes + (64 << 10), 1 << 20)),
        ("grpc.max_send_message_length", 64 << 20),
    ]


async def _listen(
    servicer: BrokerServicer,
    address: str,
    bind: str,
    tls: TlsConfig | None,
    options: list[tuple[str, int]],
) -> tuple[grpc.aio.Server, int]:
    """Create, bind and start the grpc.aio server (on its loop); the bound port."""
    # No maximum_concurrent_rpcs: it counts calls from their headers, so
    # whoever holds that many refuses everyone. CallSlots bounds each uid.
    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers((Gate(servicer),))
    try:
        if tls is not None:
            creds = grpc.ssl_server_credentials(
                [(tls.key, tls.cert)], root_certificates=tls.client_ca, require_client_auth=True
            )
            port = server.add_secure_port(bind, creds)
        else:
            port = server.add_insecure_port(bind)
    except RuntimeError as e:
        raise OSError(f"--grpc {address}: cannot listen: {e}") from e
    if not bind.startswith("unix:") and not port:
        raise OSError(f"--grpc {address}: cannot listen (address in use, or bad TLS files?)")
    await server.start()
    return server, port


def _pool(size: int, name: str) -> futures.ThreadPoolExecutor:
    """A pool whose threads carry name in /proc (broker/threadnames.py)."""
    return futures.ThreadPoolExecutor(
        max_workers=size, thread_name_prefix=name, initializer=name_this_thread, initargs=(name,)
    )


def _servicer(
    service: Service, tokens: TokenStore, tls: bool, max_workers: int, reap_interval: float
) -> BrokerServicer:
    """The servicer, its lease manager (not started yet) and its thread pools."""
    limits = service.policy.limits
    leases = LeaseManager(
        service,
        default_seconds=limits.lease_seconds,
        max_seconds=max(limits.lease_seconds, 1),
        interval=reap_interval,
    )
    return BrokerServicer(
        service,
        tokens,
        leases,
        tls=tls,
        pool=_pool(max_workers, "gfxbpf-grpc"),
        streams=_pool(4 * max_workers, "gfxbpf-grpcstrm"),
    )


def start_grpc_server(
    service: Service,
    address: str,
    tls: TlsConfig | None = None,
    *,
    tokens: TokenStore | None = None,
    max_workers: int = 64,
    socket_mode: int = 0o666,
    reap_interval: float = REAP_INTERVAL,
) -> GrpcServer:
    """Serve service Broker on address ("unix:/path" or "host:port"); return the handle.

    Sets service.tokens to the token store (so IssueToken on the Unix socket
    works) and starts the lease reaper. A host:port address requires tls
    (mTLS: client certificates are required). max_workers threads run
    unary calls' Service work (calls waiting for their turn cost none);
    open streams have their own threads. Call it after the process dropped
    its privileges: grpc starts threads. Raises OSError/ValueError with a
    clear message when it cannot listen.
    """
    unix_path = _listen_path(address, tls)
    if tokens is None:
        tokens = TokenStore.from_policy(service.policy)
    servicer = _servicer(service, tokens, tls is not None, max_workers, reap_interval)
    leases = servicer.leases
    # A token whose client holds attachments is never replaced by a new one.
    tokens.in_use = lambda digest: leases.in_use("token:" + digest)
    inner_dir = _private_dir(unix_path, address) if unix_path is not None else None
    bind = f"unix:{inner_dir}/grpc.sock" if inner_dir is not None else address
    loop, thread = _start_loop()

    def give_up() -> None:
        _stop_loop(loop, thread)
        servicer.pool.shutdown(wait=False)
        servicer.streams.shutdown(wait=False)
        if inner_dir is not None:
            shutil.rmtree(inner_dir, ignore_errors=True)

    listening = _listen(servicer, address, bind, tls, _server_options(service.policy.limits))
    try:
        server, port = asyncio.run_coroutine_threadsafe(listening, loop).result(60.0)
    except BaseException:
        give_up()
        raise
    acceptor = None
    if unix_path is not None and inner_dir is not None:
        try:
            acceptor = _accept_on(service, unix_path, socket_mode, f"{inner_dir}/grpc.sock", loop)
        except OSError:
            _stop_server(server, loop)
            give_up()
            raise
        real_address, real_port = f"unix:{unix_path}", None
    else:
        real_address, real_port = f"{address.rsplit(':', 1)[0]}:{port}", port
    leases.start()
    service.tokens = tokens
    log.info("gRPC listening on %s%s", real_address, " (mTLS)" if tls else "")
    handles = (tokens, leases, service, servicer, loop, thread, acceptor)
    return GrpcServer(server, real_address, real_port, unix_path, *handles)


def _stop_server(server: grpc.aio.Server, loop: asyncio.AbstractEventLoop) -> None:
    with contextlib.suppress(Exception):
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(5.0)


def _private_dir(unix_path: str, address: str) -> str:
    """The directory (0700) of grpc's own socket, named after the public one
    (/run/gfxbpf/.grpc.sock.d): callers reach grpc only through the broker's
    accept side (grpc/accept.py). A stale public socket, and the directory a
    broker that died left behind (the unit keeps its RuntimeDirectory), are
    removed first; anything else in the way is refused."""
    _prepare_unix_path(unix_path)
    parent, name = os.path.split(unix_path)
    inner = os.path.join(parent or "/", f".{name}.d")
    try:
        st = os.lstat(inner)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise OSError(
                f"--grpc {address}: {inner} exists and is not this user's directory; "
                "remove it (the broker keeps grpc's own socket there)"
            )
        shutil.rmtree(inner)
    try:
        os.mkdir(inner, 0o700)
    except OSError as e:
        raise OSError(f"--grpc {address}: cannot create {inner}: {e.strerror}") from e
    return inner


def _accept_on(
    service: Service, unix_path: str, socket_mode: int, inner: str, loop: asyncio.AbstractEventLoop
) -> GrpcAcceptor:
    """Listen on the public socket (mode socket_mode: callers authenticate per call)
    and start accepting there, on the gRPC loop."""
    acceptor = GrpcAcceptor(service, open_listener(unix_path, socket_mode), inner)

    async def start() -> None:
        acceptor.start()

    asyncio.run_coroutine_threadsafe(start(), loop).result(10.0)
    return acceptor


__all__ = [
    "HOW_TO_AUTHENTICATE",
    "META_CODE",
    "META_ERROR",
    "META_RULE",
    "METHODS",
    "STATUS_OF",
    "BrokerServicer",
    "GrpcServer",
    "TlsConfig",
    "start_grpc_server",
    "tls_from_config",
]
