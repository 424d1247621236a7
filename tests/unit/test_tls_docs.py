"""Certificates made exactly as deploy/README.md ("TLS certificates") says work
with every product TLS endpoint under strict X.509 verification, on Python
3.11 (Debian 12) as on 3.13 (Debian 13, where strict is the default).

The exporter's listener sets the strict flag itself, so a client certificate
that only lax verification accepts is refused on every release."""

from __future__ import annotations

import re
import shutil
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.serialization import Encoding, load_pem_private_key

from gfxbpf.broker.grpc.server import TlsConfig, start_grpc_server
from gfxbpf.broker.policy.rules import Policy
from gfxbpf.client.grpc_config import TlsFiles
from gfxbpf.exporter import listener
from gfxbpf.exporter.config import ListenTls
from gfxbpf.proto import gfxbpf_pb2 as pb
from gfxbpf.proto import gfxbpf_pb2_grpc as pb_grpc
from tests.tlscerts import strict_client_context
from tests.unit.test_exporter_listener import registry
from tests.unit.test_grpc_server import POLICY, FakeService

DOC = Path(__file__).resolve().parents[2] / "deploy" / "README.md"
BLOCK = re.compile(r"<!-- tls-certs[^>]*-->\n```sh\n(.*?)```", re.S)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The documented openssl commands, run as written (HOST=localhost)."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl (Debian: openssl) is needed; tools/test_deps.sh installs it")
    m = BLOCK.search(DOC.read_text())
    assert m, f"{DOC}: no <!-- tls-certs --> sh block"
    out = tmp_path_factory.mktemp("doc-certs")
    r = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", m.group(1)],
        cwd=out,
        env={"PATH": "/usr/bin:/bin", "HOST": "localhost", "CLIENT": "ci-runner"},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert "server.crt: OK" in r.stdout and "client.crt: OK" in r.stdout
    return out


@pytest.fixture
def exporter(certs: Path) -> Iterator[int]:
    tls = ListenTls(str(certs / "server.crt"), str(certs / "server.key"), str(certs / "ca.crt"))
    server, thread = listener.start("127.0.0.1", 0, registry(), tls)
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def scrape(port: int, ctx: ssl.SSLContext) -> str:
    url = f"https://localhost:{port}/metrics"
    with urllib.request.urlopen(url, context=ctx, timeout=5) as r:  # noqa: S310
        return str(r.read().decode())


def test_documented_certificates_carry_the_key_identifiers(certs: Path) -> None:
    for name in ("server", "client"):
        cert = x509.load_pem_x509_certificate((certs / f"{name}.crt").read_bytes())
        cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier)
        cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)


def test_exporter_serves_a_strict_scraper_with_documented_certificates(
    certs: Path, exporter: int
) -> None:
    ctx = strict_client_context(str(certs / "ca.crt"))
    ctx.load_cert_chain(certs / "client.crt", certs / "client.key")
    assert "gfxbpf_test_events_total 3.0" in scrape(exporter, ctx)


def test_exporter_refuses_a_client_certificate_without_authority_key_id(
    certs: Path, exporter: int, tmp_path: Path
) -> None:
    # Signed by the right CA, but without the extensions the doc asks for:
    # lax verification (Python 3.11's default) would let this scraper in.
    ca_key = load_pem_private_key((certs / "ca.key").read_bytes(), None)
    ca = x509.load_pem_x509_certificate((certs / "ca.crt").read_bytes())
    key = load_pem_private_key((certs / "client.key").read_bytes(), None)
    bare = (
        x509.CertificateBuilder()
        .subject_name(x509.Name.from_rfc4514_string("CN=prometheus"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        .not_valid_before(ca.not_valid_before_utc)
        .not_valid_after(ca.not_valid_after_utc)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    (tmp_path / "bare.crt").write_bytes(bare.public_bytes(Encoding.PEM))
    ctx = strict_client_context(str(certs / "ca.crt"))
    ctx.load_cert_chain(tmp_path / "bare.crt", certs / "client.key")
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        scrape(exporter, ctx)
    # The documented client certificate still gets in.
    good = strict_client_context(str(certs / "ca.crt"))
    good.load_cert_chain(certs / "client.crt", certs / "client.key")
    assert "gfxbpf_test_events" in scrape(exporter, good)


def test_grpc_mtls_with_documented_certificates(certs: Path) -> None:
    policy = Policy.parse(POLICY + '[[tls_client]]\nsubject_cn = "ci-runner"\nuser = 4321\n')
    handle = start_grpc_server(
        FakeService(policy),
        "127.0.0.1:0",
        TlsConfig.load(str(certs / "server.crt"), str(certs / "server.key"), str(certs / "ca.crt")),
    )
    try:
        # gfxclient --tls-ca ca.crt --tls-cert client.crt --tls-key client.key
        files = TlsFiles(
            str(certs / "ca.crt"), str(certs / "client.crt"), str(certs / "client.key")
        )
        target = f"localhost:{handle.port}"
        stub = pb_grpc.BrokerStub(grpc.secure_channel(target, files.credentials()))
        assert stub.Hello(pb.HelloRequest(), timeout=10).uid == 4321
    finally:
        handle.stop(0)
