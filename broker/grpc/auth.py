"""Who a gRPC call is, decided from what arrives before its request message.

Two steps, both before the broker reads a byte of the request body:

- Authenticator.from_metadata(): the call's metadata, as the server's method
  lookup sees it (grpc_servicer.Gate). A bearer token ("authorization: Bearer
  <token>", a token IssueToken gave out on a Unix-socket session) becomes a
  Holder; malformed, unknown or expired credentials become an AuthFailure;
  no authorization metadata at all gives None (look at the certificate).
- Authenticator.from_certificate(): on an mTLS listener, the client
  certificate of the TLS auth context (the handshake already checked it
  against --tls-client-ca), mapped to a user by a [[tls_client]] entry.
  The auth context belongs to the call, so the handler does this as its
  first step, still before reading the request.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gfxbpf.broker.access.leases import Holder, LeaseManager
from gfxbpf.broker.access.tokens import MAX_TOKEN_CHARS, TokenStore, token_digest
from gfxbpf.broker.callers import Caller

if TYPE_CHECKING:
    from gfxbpf.broker.service import Service


@dataclass(frozen=True)
class AuthFailure:
    """Why a call is not authenticated (the start of the UNAUTHENTICATED message)."""

    why: str


def caller_for_uid(uid: int) -> Caller:
    """The Caller a certificate maps to: the account's primary and supplementary groups."""
    try:
        pw = pwd.getpwuid(uid)
    except (KeyError, OverflowError):
        # An account-less uid has no groups the policy could match.
        return Caller(uid=uid, gid=65534, gids=(), pid=0, transport="grpc")
    try:
        gids = tuple(sorted(set(os.getgrouplist(pw.pw_name, pw.pw_gid))))
    except OSError:
        gids = (pw.pw_gid,)
    return Caller(uid=uid, gid=pw.pw_gid, gids=gids, pid=0, transport="grpc")


class Authenticator:
    """Credentials -> lease Holder, over a TokenStore, a LeaseManager and the policy."""

    def __init__(self, service: Service, tokens: TokenStore, leases: LeaseManager, *, tls: bool):
        self.service = service
        self.tokens = tokens
        self.leases = leases
        self.tls = tls

    def from_metadata(
        self, metadata: Iterable[tuple[str, Any]] | None
    ) -> Holder | AuthFailure | None:
        """The bearer token's Holder; AuthFailure; None when no token was sent.

        In-memory lookups only: this runs on the server's event loop.
        """
        auth = [v for k, v in (metadata or ()) if k == "authorization"]
        if not auth:
            return None
        value = auth[0] if isinstance(auth[0], str) else ""
        scheme, _, token = value.strip().partition(" ")
        token = token.strip()
        if len(auth) > 1 or scheme.lower() != "bearer" or not token:
            return AuthFailure(
                "malformed authorization metadata (expected one 'authorization: Bearer <token>')"
            )
        if len(token) > MAX_TOKEN_CHARS:
            return AuthFailure("the bearer token is unknown or expired")
        caller = self.tokens.authenticate(token)
        expires = self.tokens.expires(token)
        if caller is None or expires is None:
            return AuthFailure("the bearer token is unknown or expired")
        return self.leases.holder("token:" + token_digest(token), caller, expires_unix=expires)

    def from_certificate(self, auth_context: Mapping[str, Any]) -> Holder | AuthFailure:
        """The mTLS client certificate's Holder, or AuthFailure (it may look up accounts)."""
        if not self.tls:
            return AuthFailure("no credentials")
        pems = auth_context.get("x509_pem_cert") or []
        cns = auth_context.get("x509_common_name") or []
        if not pems:
            return AuthFailure("no client certificate and no token")
        try:
            der = ssl.PEM_cert_to_DER_cert(pems[0].decode("ascii"))
        except (ValueError, UnicodeDecodeError):
            return AuthFailure("unreadable client certificate")
        fingerprint = hashlib.sha256(der).hexdigest()
        cn = cns[0].decode("utf-8", "replace") if cns else None
        uid = self.service.policy.tls_user(subject_cn=cn, cert_sha256=fingerprint)
        if uid is None:
            return AuthFailure(
                f"client certificate CN={cn!r} sha256={fingerprint} is not mapped to a user "
                "by any [[tls_client]] entry of the policy"
            )
        return self.leases.holder("cert:" + fingerprint, caller_for_uid(uid))


__all__ = ["AuthFailure", "Authenticator", "caller_for_uid"]
