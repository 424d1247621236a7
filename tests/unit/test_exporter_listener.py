"""The exporter's /metrics listener: plain HTTP, HTTPS with client certificates, and a
client that connects and says nothing (it must not stall other scrapes)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from gfxbpf.exporter import listener
from gfxbpf.exporter.config import ConfigError, ListenTls, parse_config
from tests.tlscerts import Issued, make_ca, strict_client_context


def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    Counter("gfxbpf_test_events", "a test counter", registry=reg).inc(3)
    return reg


def write(tmp: Path, name: str, issued: Issued) -> tuple[str, str]:
    cert, key = tmp / f"{name}.crt", tmp / f"{name}.key"
    cert.write_bytes(issued.cert_pem)
    key.write_bytes(issued.key_pem)
    return str(cert), str(key)


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, str]:
    ca, other = make_ca("scrapers CA"), make_ca("someone else")
    out: dict[str, str] = {}
    out["server_cert"], out["server_key"] = write(
        tmp_path, "server", ca.issue("localhost", server=True)
    )
    out["client_cert"], out["client_key"] = write(tmp_path, "prometheus", ca.issue("prometheus"))
    out["stranger_cert"], out["stranger_key"] = write(tmp_path, "stranger", other.issue("mallory"))
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    out["ca"] = str(tmp_path / "ca.crt")
    return out


@pytest.fixture
def https(pki: dict[str, str]) -> Iterator[int]:
    tls = ListenTls(pki["server_cert"], pki["server_key"], pki["ca"])
    server, thread = listener.start("127.0.0.1", 0, registry(), tls)
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def client_context(pki: dict[str, str], who: str | None) -> ssl.SSLContext:
    ctx = strict_client_context(pki["ca"])
    if who is not None:
        ctx.load_cert_chain(pki[f"{who}_cert"], pki[f"{who}_key"])
    return ctx


def get(url: str, ctx: ssl.SSLContext | None = None, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, context=ctx, timeout=timeout) as r:  # noqa: S310
        return str(r.read().decode())


def test_plain_http_serves_the_registry() -> None:
    server, thread = listener.start("127.0.0.1", 0, registry())
    try:
        text = get(f"http://127.0.0.1:{server.server_port}/metrics")
        assert "gfxbpf_test_events_total 3.0" in text
    finally:
        server.shutdown()
        server.server_close()


def test_https_with_a_client_certificate(https: int, pki: dict[str, str]) -> None:
    text = get(f"https://localhost:{https}/metrics", client_context(pki, "client"))
    assert "gfxbpf_test_events_total 3.0" in text


@pytest.mark.parametrize("who", [None, "stranger"])
def test_https_refuses_scrapers_without_a_certificate_it_trusts(
    https: int, pki: dict[str, str], who: str | None
) -> None:
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)) as e:
        get(f"https://localhost:{https}/metrics", client_context(pki, who))
    assert "gfxbpf_test_events" not in str(e.value)
    # ...and the server goes on serving the scraper it trusts.
    assert "gfxbpf_test_events" in get(
        f"https://localhost:{https}/metrics", client_context(pki, "client")
    )


def test_a_silent_connection_does_not_stall_scrapes(https: int, pki: dict[str, str]) -> None:
    # A local user opens connections and never sends a ClientHello.
    silent = [socket.create_connection(("127.0.0.1", https)) for _ in range(3)]
    try:
        text = get(f"https://localhost:{https}/metrics", client_context(pki, "client"), timeout=3)
        assert "gfxbpf_test_events_total" in text
    finally:
        for s in silent:
            s.close()


def test_unusable_tls_files_are_named(tmp_path: Path, pki: dict[str, str]) -> None:
    missing = str(tmp_path / "nope.crt")
    with pytest.raises(listener.TlsFilesError, match="nope.crt"):
        listener.tls_context(ListenTls(missing, pki["server_key"]))
    with pytest.raises(listener.TlsFilesError, match="client_ca"):
        listener.tls_context(ListenTls(pki["server_cert"], pki["server_key"], missing))


def test_listen_tls_config() -> None:
    cfg = parse_config(
        "[listen_tls]\ncert = 'c.pem'\nkey = 'k.pem'\nclient_ca = 'ca.pem'\n"
        "[[program]]\nname = 'syscount'\n",
        "e.toml",
    )
    assert cfg.tls == ListenTls("c.pem", "k.pem", "ca.pem")
    with pytest.raises(ConfigError, match=r"e.toml: \[listen_tls\]: field 'key': missing"):
        parse_config("[listen_tls]\ncert = 'c.pem'\n[[program]]\nname = 'a'\n", "e.toml")


@pytest.fixture
def plain(monkeypatch: pytest.MonkeyPatch) -> Iterator[listener.MetricsServer]:
    monkeypatch.setattr(listener, "HEAD_SECONDS", 1.0)
    server, thread = listener.start("127.0.0.1", 0, registry())
    server.gate.limit = 4
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _status(s: socket.socket) -> str:
    s.settimeout(5)
    return s.recv(4096).decode(errors="replace").split("\r\n", 1)[0]


def test_headers_past_the_byte_cap_are_refused(plain: listener.MetricsServer) -> None:
    with socket.create_connection(("127.0.0.1", plain.server_port)) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
        with contextlib.suppress(OSError):  # the server may close while we still send
            for _ in range(30):  # 12 KB in 31 lines: within the stdlib's own limits
                s.sendall(b"X-Filler: " + b"a" * 400 + b"\r\n")
        assert _status(s) == "HTTP/1.0 431 Request Header Fields Too Large"


def test_headers_must_end_within_the_deadline_however_slow(plain: listener.MetricsServer) -> None:
    with socket.create_connection(("127.0.0.1", plain.server_port)) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
        t0 = time.monotonic()
        status = ""
        while time.monotonic() - t0 < 5 and not status:
            try:  # a short line every 0.1 s: each read is quick, the whole is not
                s.sendall(b"X: y\r\n")
            except OSError:
                break
            s.settimeout(0.1)
            with contextlib.suppress(TimeoutError):
                status = s.recv(4096).decode(errors="replace").split("\r\n", 1)[0]
        assert status == "HTTP/1.0 408 Request Timeout"
        assert time.monotonic() - t0 < 3


def test_a_full_house_of_header_senders_makes_way_for_a_scrape(
    plain: listener.MetricsServer,
) -> None:
    slow = [socket.create_connection(("127.0.0.1", plain.server_port)) for _ in range(12)]
    try:
        for s in slow:
            s.sendall(b"GET /metrics HTTP/1.1\r\n")
        time.sleep(0.2)
        assert plain.gate.count() <= 2 * plain.gate.limit
        text = get(f"http://127.0.0.1:{plain.server_port}/metrics", timeout=3)
        assert "gfxbpf_test_events_total 3.0" in text
    finally:
        for s in slow:
            s.close()
