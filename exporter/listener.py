"""The /metrics HTTP(S) server: prometheus-client's WSGI app and threading server.

Why not prometheus_client.start_http_server itself: with TLS it wraps the
listening socket, so each TLS handshake runs inside accept() on the one
serving thread, and a local user who opens a connection and sends nothing
stalls every scrape. Here the handshake runs in the connection's own thread.
The exposition is prometheus-client's (make_wsgi_app).

Bounds (issue #26: slow endless header lines took the exporter past its
unit's MemoryMax, because the standard library allows 100 header lines of
64 KiB each and restarts its timeout at every read):
- HEAD_SECONDS from accept to the end of the request's headers, TLS
  handshake included, however the bytes trickle in (408, then closed);
- MAX_HEAD_BYTES of request line and headers (431, then closed); the
  stdlib parser only ever sees a head already complete and within it;
- MAX_CONNECTIONS at once (one thread each). When full, a new connection
  pushes out the oldest one still sending its headers (a scraper sends its
  few hundred bytes at once, so it is never the oldest), and is closed at
  once only when every place is serving a response;
- a listen backlog of LISTEN_BACKLOG, not socketserver's 5.
So memory is about MAX_CONNECTIONS x (MAX_HEAD_BYTES + a thread), whatever
the clients send.
"""

from __future__ import annotations

import collections
import contextlib
import io
import socket
import ssl
import sys
import threading
import time
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from gfxbpf.exporter.config import ListenTls

CONNECTION_TIMEOUT = 10.0  # seconds for each read or write once the headers are in
HEAD_SECONDS = 10.0  # accept -> end of headers (TLS handshake included)
MAX_HEAD_BYTES = 8192  # request line + headers
MAX_CONNECTIONS = 64  # connections served at once (a thread each)
LISTEN_BACKLOG = 128


class TlsFilesError(ValueError):
    """A certificate, key or CA file the listener cannot use."""


class HeadRefused(Exception):
    """A request head that did not arrive in time or within MAX_HEAD_BYTES."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


def tls_context(tls: ListenTls) -> ssl.SSLContext:
    """Server side; with client_ca, only clients holding a certificate it signed."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(tls.cert, tls.key)
    except (OSError, ssl.SSLError) as e:
        raise TlsFilesError(f"cannot use cert {tls.cert} with key {tls.key}: {e}") from None
    if tls.client_ca:
        try:
            ctx.load_verify_locations(cafile=tls.client_ca)
        except (OSError, ssl.SSLError) as e:
            raise TlsFilesError(f"cannot use client_ca {tls.client_ca}: {e}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
        # Strict X.509 checks on every Python, not only where 3.13 makes them
        # the default: a scraper certificate accepted on one release is
        # accepted on all (deploy/README.md, "TLS certificates").
        ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    return ctx


def read_head(sock: socket.socket, deadline: float, limit: int = MAX_HEAD_BYTES) -> bytes:
    """The bytes up to and including the blank line that ends the headers (and
    whatever came with them); raises HeadRefused, or OSError if the peer went."""
    buf = bytearray()
    while True:
        end = min((i for i in (buf.find(b"\r\n\r\n"), buf.find(b"\n\n")) if i >= 0), default=-1)
        if end >= 0:
            return bytes(buf)
        if len(buf) >= limit:
            raise HeadRefused("431 Request Header Fields Too Large")
        left = deadline - time.monotonic()
        if left <= 0:
            raise HeadRefused("408 Request Timeout")
        sock.settimeout(left)
        try:
            chunk = sock.recv(limit - len(buf))
        except TimeoutError:
            raise HeadRefused("408 Request Timeout") from None
        if not chunk:
            raise ConnectionResetError("the client closed before its headers ended")
        buf += chunk


class _Prefixed(io.RawIOBase):
    """A socket's reads, after the bytes read_head() already took from it."""

    def __init__(self, head: bytes, rest: Any) -> None:
        self._head = memoryview(head)
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self._head:
            n = min(len(b), len(self._head))
            b[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        return int(self._rest.readinto(b) or 0)


class _QuietHandler(WSGIRequestHandler):
    """wsgiref's handler, fed a head read_head() already checked."""

    def __init__(self, head: bytes, request: Any, client_address: Any, server: Any) -> None:
        self._head = head
        super().__init__(request, client_address, server)

    def setup(self) -> None:
        super().setup()
        raw = self.connection.makefile("rb", buffering=0)
        self.rfile = io.BufferedReader(_Prefixed(self._head, raw))

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass  # one line per scrape would flood the journal


class ConnectionGate:
    """Connections being served, by fd; those still sending headers, oldest first."""

    def __init__(self, limit: int = MAX_CONNECTIONS) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._active: set[int] = set()
        self._heading: collections.OrderedDict[int, None] = collections.OrderedDict()

    def admit(self, fd: int) -> bool:
        """Take a place for fd, pushing out the oldest header sender when full."""
        with self._lock:
            if len(self._active) >= self.limit:
                # Pushed-out threads leave soon; never let them pile past twice the limit.
                if not self._heading or len(self._active) >= 2 * self.limit:
                    return False
                oldest, _ = self._heading.popitem(last=False)
                _shut(oldest)  # under the lock: the fd cannot be closed and reused meanwhile
            self._active.add(fd)
            self._heading[fd] = None
            return True

    def headers_done(self, fd: int) -> None:
        with self._lock:
            self._heading.pop(fd, None)

    def leave(self, fd: int) -> None:
        """fd's connection is over; call before closing fd (idempotent)."""
        with self._lock:
            self._active.discard(fd)
            self._heading.pop(fd, None)

    def count(self) -> int:
        with self._lock:
            return len(self._active)


def _shut(fd: int) -> None:
    """Make the thread reading fd see the end of the stream (fd stays its owner's)."""
    with contextlib.suppress(OSError):
        dup = socket.socket(fileno=socket.dup(fd))
        try:
            dup.shutdown(socket.SHUT_RDWR)
        finally:
            dup.close()


class MetricsServer(ThreadingWSGIServer):
    """One thread per connection (at most MAX_CONNECTIONS); TLS handshakes and
    headers are read in that thread, under HEAD_SECONDS and MAX_HEAD_BYTES."""

    ssl_context: ssl.SSLContext | None = None
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.gate = ConnectionGate()
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.gate.admit(request.fileno()):
            self.shutdown_request(request)  # every place is serving a response
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        fd = request.fileno()
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.gate.leave(fd)
            self.shutdown_request(request)

    def finish_request(self, request: Any, client_address: Any) -> None:
        fd = request.fileno()
        deadline = time.monotonic() + HEAD_SECONDS
        conn = request
        try:
            request.settimeout(HEAD_SECONDS)
            if self.ssl_context is not None:
                conn = self.ssl_context.wrap_socket(request, server_side=True)
            try:
                head = read_head(conn, deadline)
            except HeadRefused as e:
                _answer(conn, e.status)
                return
            self.gate.headers_done(fd)
            conn.settimeout(CONNECTION_TIMEOUT)
            _QuietHandler(head, conn, client_address, self)
        finally:
            self.gate.leave(fd)
            if conn is not request:
                with contextlib.suppress(OSError):
                    conn.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A refused certificate or a client that went away: not a traceback.
        error = sys.exc_info()[1]
        if not isinstance(error, OSError | ssl.SSLError):
            print(f"gfxbpf-exporter: request from {client_address}: {error!r}", file=sys.stderr)


def _answer(conn: socket.socket, status: str) -> None:
    """A short error response, best effort (the client may not be reading)."""
    body = status.encode() + b"\n"
    with contextlib.suppress(OSError):
        conn.settimeout(1.0)
        conn.sendall(
            b"HTTP/1.0 " + status.encode() + b"\r\nContent-Type: text/plain\r\n"
            b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )


def start(
    host: str, port: int, registry: CollectorRegistry, tls: ListenTls | None = None
) -> tuple[MetricsServer, threading.Thread]:
    """Serve /metrics in a daemon thread; raises OSError (bind) or TlsFilesError."""
    context = tls_context(tls) if tls is not None else None

    class Server(MetricsServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        ssl_context = context

    httpd = make_server(host, port, make_wsgi_app(registry), Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, name="gfxbpf-metrics", daemon=True)
    thread.start()
    return httpd, thread
