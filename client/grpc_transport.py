"""The gRPC transport: the broker's Broker service, for callers without fd passing.

Authentication is a bearer token (metadata "authorization: Bearer <token>")
issued over the Unix socket, or an mTLS client certificate for host:port
addresses. Errors come back as gRPC status codes; the policy rule rides in
the trailing metadata key "gfxbpf-rule" (proto/gfxbpf.proto). They are
turned into the same BrokerError the Unix transport raises.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast

import grpc
from google.protobuf.message import DecodeError

from gfxbpf.client.errors import BrokerError, BrokerUnreachable, UsageError
from gfxbpf.client.grpc_config import TlsFiles, default_grpc
from gfxbpf.client.grpc_queued import QueuedConnector, connect_waiting
from gfxbpf.proto import gfxbpf_pb2 as pb
from gfxbpf.proto import gfxbpf_pb2_grpc as pb_grpc

CONNECT_TIMEOUT = 10.0
CALL_TIMEOUT = 120.0
PROBE_SECONDS = 5.0  # the longest the first connect waits in a full listen backlog
# Trailers the broker's gRPC server sets on errors (broker/grpc/errors.py):
RULE_KEY = "gfxbpf-rule"  # the policy rule that decided
CODE_KEY = "gfxbpf-error-code"  # the ErrorCode name: more precise than the gRPC status
ERROR_KEY = "gfxbpf-error-bin"  # the serialized gfxbpf.v1.Error (exact message and rule)

_STATUS_TO_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: pb.ERROR_INVALID_ARGUMENT,
    grpc.StatusCode.PERMISSION_DENIED: pb.ERROR_PERMISSION_DENIED,
    grpc.StatusCode.NOT_FOUND: pb.ERROR_NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED: pb.ERROR_RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION: pb.ERROR_UNAVAILABLE,
    grpc.StatusCode.UNAVAILABLE: pb.ERROR_UNAVAILABLE,
    grpc.StatusCode.UNAUTHENTICATED: pb.ERROR_UNAUTHENTICATED,
    grpc.StatusCode.INTERNAL: pb.ERROR_INTERNAL,
    grpc.StatusCode.UNKNOWN: pb.ERROR_INTERNAL,
    grpc.StatusCode.ABORTED: pb.ERROR_KERNEL,
    grpc.StatusCode.DATA_LOSS: pb.ERROR_PROTOCOL,
    grpc.StatusCode.OUT_OF_RANGE: pb.ERROR_INVALID_ARGUMENT,
    grpc.StatusCode.UNIMPLEMENTED: pb.ERROR_INVALID_ARGUMENT,
}


def _trailers(err: grpc.RpcError) -> dict[str, str | bytes]:
    try:
        md = err.trailing_metadata() or ()
    except Exception:  # noqa: BLE001 - a call that never reached the server has none
        return {}
    # (key, value) pairs at run time, whatever the stubs call them.
    pairs = cast("Iterable[tuple[str, str | bytes]]", md)
    return {k: v for k, v in pairs}


def _text(value: str | bytes | None) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def convert_error(err: grpc.RpcError, op: str, address: str = "") -> Exception:
    """The client error for a failed gRPC call."""
    status = err.code()
    details = err.details() or ""
    md = _trailers(err)
    raw = md.get(ERROR_KEY)
    if isinstance(raw, bytes):
        try:
            exact = pb.Error.FromString(raw)
        except DecodeError:
            exact = None
        if exact is not None and exact.code:
            return BrokerError(exact.code, exact.message or details, exact.rule, operation=op)
    rule = _text(md.get(RULE_KEY))
    code_text = _text(md.get(CODE_KEY))
    where = f" at {address}" if address else ""
    if status == grpc.StatusCode.DEADLINE_EXCEEDED:
        return BrokerUnreachable(f"the broker{where} did not answer {op} in time")
    if status == grpc.StatusCode.CANCELLED:
        return BrokerUnreachable(f"{op} was cancelled")
    if status == grpc.StatusCode.UNAVAILABLE and not code_text:
        # grpc's own UNAVAILABLE: the transport, not the broker, failed.
        return BrokerUnreachable(
            f"cannot reach the broker's gRPC listener{where}: {details}\n"
            "  is the broker running with --grpc? (or use --via fd)"
        )
    code: int = _STATUS_TO_CODE.get(status, pb.ERROR_INTERNAL)
    if code_text:
        try:
            code = pb.ErrorCode.Value(code_text)
        except ValueError:
            with contextlib.suppress(ValueError):
                code = int(code_text)
    return BrokerError(code, details, rule, operation=op)


def _check_unix_listener(path: str) -> None:
    """Fail fast on a missing or stale socket (grpc itself would retry until the timeout)."""
    hint = "\n  use --via fd, or point --grpc / GFXBPF_GRPC at the broker's gRPC listener"
    try:
        # Blocking: in a listen backlog another user's connects keep full, it
        # waits its turn (a non-blocking connect fails EAGAIN at once).
        probe = connect_waiting(path, PROBE_SECONDS)
    except FileNotFoundError:
        raise BrokerUnreachable(
            f"no gRPC socket at {path}: the broker is not running, or runs without --grpc" + hint
        ) from None
    except ConnectionRefusedError:
        raise BrokerUnreachable(
            f"nothing listens on the gRPC socket {path} (the broker stopped)" + hint
        ) from None
    except PermissionError:
        raise BrokerUnreachable(f"permission denied on the gRPC socket {path}" + hint) from None
    except OSError as e:
        raise BrokerUnreachable(f"cannot connect to the gRPC socket {path}: {e}" + hint) from None
    probe.close()


class GrpcEvents:
    """An open StreamEvents call (a transport.EventCall): its batches, with
    gRPC errors turned into the client's; cancel() ends it quietly."""

    def __init__(self, call: Any) -> None:
        self._call = call

    def __iter__(self) -> Iterator[pb.EventBatch]:
        try:
            yield from self._call
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                raise convert_error(e, "stream_events") from None

    def cancel(self) -> None:
        self._call.cancel()


class GrpcTransport:
    """Calls to the broker's gRPC service with a token or client certificate
    (a transport.Transport)."""

    transport = "grpc"
    passes_fds = False

    def __init__(
        self,
        address: str | None = None,
        token: str | None = None,
        *,
        tls: TlsFiles | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
        call_timeout: float = CALL_TIMEOUT,
    ) -> None:
        self.address = address or default_grpc()
        self.token = token
        self.call_timeout = call_timeout
        # Proxies from the environment must never see a local socket or token.
        options = [("grpc.enable_http_proxy", 0)]
        self._connector: QueuedConnector | None = None
        if self.address.startswith("unix:"):
            path = self.address[len("unix:") :].removeprefix("//")
            _check_unix_listener(path)
            # grpc's own connect gives up on a full backlog: it connects to a
            # private listener joined to the broker's by a waiting connect.
            self._connector = QueuedConnector(path, connect_timeout)
            channel = grpc.insecure_channel(self._connector.address, options=options)
        elif tls is not None:
            channel = grpc.secure_channel(self.address, tls.credentials(), options=options)
        else:
            # A token crosses the network: never in clear text.
            channel = grpc.secure_channel(
                self.address, grpc.ssl_channel_credentials(), options=options
            )
        self._channel: grpc.Channel | None = channel
        self._stub = pb_grpc.BrokerStub(channel)
        try:
            grpc.channel_ready_future(channel).result(timeout=connect_timeout)
        except grpc.FutureTimeoutError:
            self.close()
            raise BrokerUnreachable(
                f"cannot reach the broker's gRPC listener at {self.address} "
                f"(no connection within {connect_timeout:g} s)\n"
                "  is the broker running with --grpc? (or use --via fd)"
            ) from None

    def set_token(self, token: str | None) -> None:
        self.token = token

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        if self.token:
            return (("authorization", f"Bearer {self.token}"),)
        return ()

    def _call(self, method: Any, req: Any, op: str) -> Any:
        if self._channel is None:
            raise BrokerUnreachable("the gRPC channel is closed")
        try:
            return method(req, metadata=self._metadata(), timeout=self.call_timeout)
        except grpc.RpcError as e:
            raise convert_error(e, op, self.address) from None

    # --- lifetime ---

    @property
    def closed(self) -> bool:
        return self._channel is None

    def close(self) -> None:
        ch, self._channel = self._channel, None
        if ch is not None:
            ch.close()
        connector, self._connector = self._connector, None
        if connector is not None:
            connector.close()

    # --- operations ---

    def hello(self, req: pb.HelloRequest) -> pb.HelloReply:
        return self._call(self._stub.Hello, req, "hello")

    def list_programs(self) -> pb.ListProgramsReply:
        return self._call(self._stub.ListPrograms, pb.ListProgramsRequest(), "list_programs")

    def attach(
        self, req: pb.AttachRequest, fds: Sequence[int] = ()
    ) -> tuple[pb.AttachReply, list[int]]:
        if fds:
            raise UsageError("gRPC carries no fds: the broker opens the library by its path")
        return self._call(self._stub.Attach, req, "attach"), []

    def detach(self, attachment_id: int) -> pb.DetachReply:
        req = pb.DetachRequest(attachment_id=attachment_id)
        return self._call(self._stub.Detach, req, "detach")

    def read_map(self, req: pb.ReadMapRequest) -> pb.ReadMapReply:
        return self._call(self._stub.ReadMap, req, "read_map")

    def stats(self, attachment_id: int = 0) -> pb.StatsReply:
        return self._call(self._stub.Stats, pb.StatsRequest(attachment_id=attachment_id), "stats")

    def stream_events(self, req: pb.StreamEventsRequest) -> GrpcEvents:
        """The streaming call: iterate it for EventBatch messages; .cancel() ends it."""
        if self._channel is None:
            raise BrokerUnreachable("the gRPC channel is closed")
        return GrpcEvents(self._stub.StreamEvents(req, metadata=self._metadata()))
