"""The /metrics HTTP(S) server: prometheus-client's WSGI app and threading server.

Why not prometheus_client.start_http_server itself: with TLS it wraps the
listening socket, so each TLS handshake runs inside accept() on the one
serving thread, and a local user who opens a connection and sends nothing
stalls every scrape. Here the handshake runs in the connection's own thread,
under a timeout, and a connection that never sends a request is dropped
after the same timeout. The exposition is prometheus-client's (make_wsgi_app).
"""

from __future__ import annotations

import socket
import ssl
import sys
import threading
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from gfxbpf.exporter.config import ListenTls

CONNECTION_TIMEOUT = 10.0  # seconds for a handshake, and for each read of a request


class TlsFilesError(ValueError):
    """A certificate, key or CA file the listener cannot use."""


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


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass  # one line per scrape would flood the journal


class MetricsServer(ThreadingWSGIServer):
    """One thread per connection; TLS handshakes happen in that thread."""

    ssl_context: ssl.SSLContext | None = None

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(CONNECTION_TIMEOUT)
        if self.ssl_context is not None:
            request = self.ssl_context.wrap_socket(request, server_side=True)
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A refused certificate or a client that went away: not a traceback.
        error = sys.exc_info()[1]
        if not isinstance(error, OSError | ssl.SSLError):
            print(f"gfxbpf-exporter: request from {client_address}: {error!r}", file=sys.stderr)


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
