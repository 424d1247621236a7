"""How a BrokerError leaves the gRPC listener: a status, its details, three trailers.

The BrokerError's message becomes the status details; the gRPC status is
STATUS_OF[code]; three trailing metadata keys carry the rest:
    gfxbpf-error-code   the ErrorCode name, e.g. "ERROR_PERMISSION_DENIED"
    gfxbpf-rule         the policy rule that decided (ASCII, escaped)
    gfxbpf-error-bin    the serialized gfxbpf.v1.Error (exact text)
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

import grpc

from gfxbpf.broker.errors import BrokerError
from gfxbpf.proto import gfxbpf_pb2 as pb

log = logging.getLogger("gfxbpf.broker.grpc")

META_RULE = "gfxbpf-rule"
META_CODE = "gfxbpf-error-code"
META_ERROR = "gfxbpf-error-bin"

# ErrorCode -> grpc status. UNAVAILABLE (this host cannot run the program) is
# not grpc's UNAVAILABLE, which clients treat as "retry later".
STATUS_OF: dict[int, grpc.StatusCode] = {
    pb.ERROR_UNSPECIFIED: grpc.StatusCode.UNKNOWN,
    pb.ERROR_INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    pb.ERROR_PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    pb.ERROR_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    pb.ERROR_RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    pb.ERROR_UNAVAILABLE: grpc.StatusCode.FAILED_PRECONDITION,
    pb.ERROR_AUDIT_FAILED: grpc.StatusCode.PERMISSION_DENIED,
    pb.ERROR_HASH_MISMATCH: grpc.StatusCode.PERMISSION_DENIED,
    pb.ERROR_UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    pb.ERROR_KERNEL: grpc.StatusCode.INTERNAL,
    pb.ERROR_INTERNAL: grpc.StatusCode.INTERNAL,
    pb.ERROR_PROTOCOL: grpc.StatusCode.INVALID_ARGUMENT,
}

HOW_TO_AUTHENTICATE = (
    "get a token on the broker's Unix socket (IssueToken; gfxclient --via grpc does it) and "
    "send it as gRPC metadata 'authorization: Bearer <token>', or connect with mTLS "
    "using a client certificate that a [[tls_client]] entry of the broker's policy maps "
    "to a user"
)


def ascii_text(text: str, limit: int = 2048) -> str:
    """Printable ASCII only (grpc refuses other bytes in text metadata)."""
    out = []
    for ch in text[:limit]:
        o = ord(ch)
        out.append(ch if 0x20 <= o < 0x7F else ch.encode("unicode_escape").decode("ascii"))
    return "".join(out)


class Abort(Exception):
    """Carries a status to abort() outside of the handler's try blocks."""

    def __init__(self, err: BrokerError) -> None:
        super().__init__(err.message)
        self.err = err


def trailers(err: BrokerError) -> tuple[tuple[str, str | bytes], ...]:
    """The gfxbpf-* trailing metadata of err."""
    try:
        name = pb.ErrorCode.Name(err.code)
    except ValueError:
        name = str(err.code)
    md: list[tuple[str, str | bytes]] = [
        (META_CODE, name),
        (META_ERROR, err.to_pb().SerializeToString()),
    ]
    if err.rule:
        md.append((META_RULE, ascii_text(err.rule)))
    return tuple(md)


async def abort(context: grpc.aio.ServicerContext[Any, Any], err: BrokerError) -> NoReturn:
    """End the call with err's status, details and trailers."""
    code = STATUS_OF.get(err.code, grpc.StatusCode.UNKNOWN)
    await context.abort(code, err.message, trailing_metadata=trailers(err))
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


def internal_error(what: str, e: Exception) -> BrokerError:
    """A bug fails one call, not the listener."""
    log.exception("gRPC %s failed", what)
    return BrokerError(pb.ERROR_INTERNAL, f"broker internal error: {type(e).__name__}: {e}")


__all__ = [
    "HOW_TO_AUTHENTICATE",
    "META_CODE",
    "META_ERROR",
    "META_RULE",
    "STATUS_OF",
    "Abort",
    "abort",
    "ascii_text",
    "internal_error",
    "trailers",
]
