"""Where the broker's gRPC listener is, and TLS files for reaching it.

Kept apart from grpc_transport so that gfxclient's start-up does not import
grpc (about 45 ms) unless a gRPC connection is made.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, NamedTuple

from gfxbpf.client.addresses import DEFAULT_GRPC
from gfxbpf.client.errors import UsageError

if TYPE_CHECKING:
    import grpc


def default_grpc() -> str:
    return os.environ.get("GFXBPF_GRPC") or DEFAULT_GRPC


class TlsFiles(NamedTuple):  # not a dataclass: see bpf/maps.py's Page
    """PEM files for an mTLS connection to a host:port gRPC address."""

    ca: str | None = None  # server CA; None = the system roots
    cert: str | None = None  # client certificate (the policy maps it to a user)
    key: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        import grpc  # here, not at the top: only TLS connections need it

        def read(path: str | None, what: str) -> bytes | None:
            if path is None:
                return None
            try:
                with open(path, "rb") as f:
                    return f.read()
            except OSError as e:
                raise UsageError(f"cannot read the {what} {path}: {e.strerror}") from None

        if (self.cert is None) != (self.key is None):
            raise UsageError("give both --tls-cert and --tls-key (or neither)")
        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca, "CA certificate"),
            private_key=read(self.key, "client key"),
            certificate_chain=read(self.cert, "client certificate"),
        )
