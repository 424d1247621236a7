"""The gRPC listener: service Broker of proto/gfxbpf.proto over grpcio.

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

Attachments made over gRPC belong to one Owner per token (or certificate)
and live on a lease (leases.LeaseManager): any call naming the attachment
renews it, the reaper detaches it when it runs out.

Errors: a BrokerError becomes the gRPC status below, its message the status
details, and three trailing metadata keys carry the rest:
    gfxbpf-error-code   the ErrorCode name, e.g. "ERROR_PERMISSION_DENIED"
    gfxbpf-rule         the policy rule that decided (ASCII, escaped)
    gfxbpf-error-bin    the serialized gfxbpf.v1.Error (exact text)
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pwd
import ssl
import stat
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc

from gfxbpf.broker.leases import REAP_INTERVAL, Holder, LeaseManager
from gfxbpf.broker.service import BrokerError, Caller
from gfxbpf.broker.tokens import MAX_TOKEN_CHARS, TokenStore, token_digest
from gfxbpf.proto import gfxbpf_pb2 as pb
from gfxbpf.proto import gfxbpf_pb2_grpc as pb_grpc

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


def _ascii(text: str, limit: int = 2048) -> str:
    """Printable ASCII only (grpc refuses other bytes in text metadata)."""
    out = []
    for ch in text[:limit]:
        o = ord(ch)
        out.append(ch if 0x20 <= o < 0x7F else ch.encode("unicode_escape").decode("ascii"))
    return "".join(out)


def _unix_path(address: str) -> str | None:
    if not address.startswith("unix:"):
        return None
    rest = address[len("unix:") :]
    return "/" + rest.lstrip("/") if rest.startswith("//") else rest


class _Abort(Exception):
    """Carries a status to _abort outside of the handler's try blocks."""

    def __init__(self, err: BrokerError) -> None:
        super().__init__(err.message)
        self.err = err


def _abort(context: grpc.ServicerContext, err: BrokerError) -> NoReturn:
    code = STATUS_OF.get(err.code, grpc.StatusCode.UNKNOWN)
    try:
        name = pb.ErrorCode.Name(err.code)
    except ValueError:
        name = str(err.code)
    md = [(META_CODE, name), (META_ERROR, err.to_pb().SerializeToString())]
    if err.rule:
        md.append((META_RULE, _ascii(err.rule)))
    context.set_trailing_metadata(tuple(md))
    context.abort(code, err.message)
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


class BrokerServicer(pb_grpc.BrokerServicer):
    """The Broker service over a Service, a TokenStore and a LeaseManager."""

    def __init__(
        self, service: Any, tokens: TokenStore, leases: LeaseManager, *, tls: bool = False
    ) -> None:
        self.service = service
        self.tokens = tokens
        self.leases = leases
        self.tls = tls

    # ------------------------------------------------------------ identity

    def _denied(self, context: grpc.ServicerContext, why: str) -> BrokerError:
        audit = getattr(self.service, "audit", None)
        if audit is not None:
            audit.denied("grpc_auth", detail=why, transport="grpc", peer=context.peer())
        return BrokerError(pb.ERROR_UNAUTHENTICATED, f"{why}: {HOW_TO_AUTHENTICATE}")

    def _holder(self, context: grpc.ServicerContext) -> Holder:
        """Who is calling, as a lease holder; raises _Abort(UNAUTHENTICATED)."""
        auth = [v for k, v in context.invocation_metadata() if k == "authorization"]
        if auth:
            value = auth[0] if isinstance(auth[0], str) else ""
            scheme, _, token = value.strip().partition(" ")
            token = token.strip()
            if len(auth) > 1 or scheme.lower() != "bearer" or not token:
                raise _Abort(
                    self._denied(
                        context,
                        "malformed authorization metadata (expected one "
                        "'authorization: Bearer <token>')",
                    )
                )
            if len(token) > MAX_TOKEN_CHARS:
                raise _Abort(self._denied(context, "the bearer token is unknown or expired"))
            caller = self.tokens.authenticate(token)
            expires = self.tokens.expires(token)
            if caller is None or expires is None:
                raise _Abort(self._denied(context, "the bearer token is unknown or expired"))
            return self.leases.holder("token:" + token_digest(token), caller, expires_unix=expires)
        if self.tls:
            return self._cert_holder(context)
        raise _Abort(self._denied(context, "no credentials"))

    def _cert_holder(self, context: grpc.ServicerContext) -> Holder:
        ac = context.auth_context()
        pems = ac.get("x509_pem_cert") or []
        cns = ac.get("x509_common_name") or []
        if not pems:
            raise _Abort(self._denied(context, "no client certificate and no token"))
        try:
            der = ssl.PEM_cert_to_DER_cert(pems[0].decode("ascii"))
        except (ValueError, UnicodeDecodeError):
            raise _Abort(self._denied(context, "unreadable client certificate")) from None
        fingerprint = hashlib.sha256(der).hexdigest()
        cn = cns[0].decode("utf-8", "replace") if cns else None
        uid = self.service.policy.tls_user(subject_cn=cn, cert_sha256=fingerprint)
        if uid is None:
            raise _Abort(
                self._denied(
                    context,
                    f"client certificate CN={cn!r} sha256={fingerprint} is not mapped to a user "
                    "by any [[tls_client]] entry of the policy",
                )
            )
        return self.leases.holder("cert:" + fingerprint, _caller_for_uid(uid))

    # ------------------------------------------------------------ plumbing

    def _run(self, context: grpc.ServicerContext, fn: Callable[[Holder], Any]) -> Any:
        err: BrokerError | None = None
        try:
            return fn(self._holder(context))
        except _Abort as e:
            err = e.err
        except BrokerError as e:
            err = e
        except Exception as e:  # a bug must fail one call, not the listener
            log.exception("gRPC %s failed", getattr(fn, "__name__", "call"))
            err = BrokerError(pb.ERROR_INTERNAL, f"broker internal error: {type(e).__name__}: {e}")
        _abort(context, err)

    # ------------------------------------------------------------ the service

    def Hello(self, request: pb.HelloRequest, context: grpc.ServicerContext) -> pb.HelloReply:
        return self._run(context, lambda h: self.service.hello(h.caller, request))

    def ListPrograms(
        self, request: pb.ListProgramsRequest, context: grpc.ServicerContext
    ) -> pb.ListProgramsReply:
        return self._run(context, lambda h: self.service.list_programs(h.caller, request))

    def Attach(self, request: pb.AttachRequest, context: grpc.ServicerContext) -> pb.AttachReply:
        def attach(h: Holder) -> pb.AttachReply:
            with self.leases.using(h) as owner:
                reply, fds = self.service.attach(h.caller, owner, request)
                if fds:  # nothing rides along over gRPC
                    for fd in fds:
                        with contextlib.suppress(OSError):
                            os.close(fd)
                    for m in reply.maps:
                        m.fd_index = -1
                    for p in reply.programs:
                        p.fd_index = -1
                reply.lease_expires_unix = self.leases.grant(
                    h, reply.attachment_id, request.lease_seconds
                )
                return reply

        return self._run(context, attach)

    def Detach(self, request: pb.DetachRequest, context: grpc.ServicerContext) -> pb.DetachReply:
        def detach(h: Holder) -> pb.DetachReply:
            with self.leases.using(h) as owner:
                try:
                    reply = self.service.detach(h.caller, owner, request)
                except BrokerError as e:
                    if e.code == pb.ERROR_NOT_FOUND:
                        self.leases.release(h, request.attachment_id)
                    raise
                self.leases.release(h, request.attachment_id)
                return reply

        return self._run(context, detach)

    def ReadMap(self, request: pb.ReadMapRequest, context: grpc.ServicerContext) -> pb.ReadMapReply:
        def read_map(h: Holder) -> pb.ReadMapReply:
            with self.leases.using(h) as owner:
                self.leases.renew(h, request.attachment_id)
                return self.service.read_map(h.caller, owner, request)

        return self._run(context, read_map)

    def Stats(self, request: pb.StatsRequest, context: grpc.ServicerContext) -> pb.StatsReply:
        def stats(h: Holder) -> pb.StatsReply:
            with self.leases.using(h) as owner:
                if request.attachment_id:
                    self.leases.renew(h, request.attachment_id)
                else:
                    self.leases.renew_all(h)
                return self.service.stats(h.caller, owner, request)

        return self._run(context, stats)

    def StreamEvents(
        self, request: pb.StreamEventsRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.EventBatch]:
        err: BrokerError | None = None
        try:
            h = self._holder(context)
            aid = request.attachment_id
            with self.leases.using(h) as owner, self.leases.pinned(h, aid):
                # Pinned: an open stream keeps its attachment's lease alive.
                for batch in self.service.stream_events(
                    h.caller, owner, request, lambda: not context.is_active()
                ):
                    yield batch
                    if batch.end or not context.is_active():
                        break
                return
        except _Abort as e:
            err = e.err
        except BrokerError as e:
            err = e
        except Exception as e:
            log.exception("gRPC StreamEvents failed")
            err = BrokerError(pb.ERROR_INTERNAL, f"broker internal error: {type(e).__name__}: {e}")
        _abort(context, err)


def _caller_for_uid(uid: int) -> Caller:
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


class GrpcServer:
    """A running listener (from start_grpc_server). stop() is idempotent."""

    def __init__(
        self,
        server: grpc.Server,
        address: str,
        port: int | None,
        unix_path: str | None,
        tokens: TokenStore,
        leases: LeaseManager,
        service: Any,
    ) -> None:
        self.server = server
        self.address = address  # what it listens on, with the real port
        self.port = port  # TCP port (None for unix:)
        self.unix_path = unix_path
        self.tokens = tokens
        self.leases = leases
        self.service = service
        self._stopped = threading.Event()

    def stop(self, grace: float = 2.0) -> None:
        """Stop accepting, end in-flight calls (after grace s), detach every gRPC attachment."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.server.stop(grace).wait(grace + 5.0)
        self.leases.stop()
        if getattr(self.service, "tokens", None) is self.tokens:
            self.service.tokens = None
        if self.unix_path is not None:
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(os.lstat(self.unix_path).st_mode):
                    os.unlink(self.unix_path)

    def wait(self, timeout: float | None = None) -> bool:
        return self.server.wait_for_termination(timeout)


def _prepare_unix_path(path: str) -> None:
    """Remove a stale socket left by a previous broker; refuse to replace anything else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise OSError(f"--grpc unix:{path}: exists and is not a socket; remove it or pick another")
    os.unlink(path)


def start_grpc_server(
    service: Any,
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
    (mTLS: client certificates are required). Call it after the process
    dropped its privileges: grpc starts threads. Raises OSError/ValueError
    with a clear message when it cannot listen.
    """
    policy = service.policy
    limits = policy.limits
    unix_path = _unix_path(address)
    if unix_path is None and tls is None:
        raise ValueError(
            f"--grpc {address}: a network listener needs mTLS (--tls-cert, --tls-key, "
            "--tls-client-ca); for local use give unix:/path"
        )
    if unix_path is not None and not unix_path.startswith("/"):
        raise ValueError(f"--grpc {address}: use an absolute path (unix:/run/gfxbpf/grpc.sock)")

    if tokens is None:
        tokens = TokenStore.from_policy(policy)
    leases = LeaseManager(
        service,
        default_seconds=limits.lease_seconds,
        max_seconds=max(limits.lease_seconds, 1),
        interval=reap_interval,
    )
    options = [
        # Never share a port with another process (grpc's default is SO_REUSEPORT).
        ("grpc.so_reuseport", 0),
        # An uploaded object is the largest request; bound what one call may make us hold.
        ("grpc.max_receive_message_length", max(limits.max_object_bytes + (64 << 10), 1 << 20)),
        ("grpc.max_send_message_length", 64 << 20),
    ]
    pool = futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="gfxbpf-grpc")
    server = grpc.server(pool, options=options, maximum_concurrent_rpcs=max_workers)
    pb_grpc.add_BrokerServicer_to_server(
        BrokerServicer(service, tokens, leases, tls=tls is not None), server
    )

    if unix_path is not None:
        _prepare_unix_path(unix_path)
    bind = f"unix:{unix_path}" if unix_path is not None else address
    try:
        if tls is not None:
            creds = grpc.ssl_server_credentials(
                [(tls.key, tls.cert)], root_certificates=tls.client_ca, require_client_auth=True
            )
            port = server.add_secure_port(bind, creds)
        else:
            port = server.add_insecure_port(bind)
    except RuntimeError as e:
        pool.shutdown(wait=False)
        raise OSError(f"--grpc {address}: cannot listen: {e}") from e
    if unix_path is None and not port:
        pool.shutdown(wait=False)
        raise OSError(f"--grpc {address}: cannot listen (address in use, or bad TLS files?)")

    server.start()
    if unix_path is not None:
        # The unit's UMask=0077 made it 0600; callers authenticate per call.
        try:
            os.chmod(unix_path, socket_mode)
        except OSError as e:
            server.stop(0)
            pool.shutdown(wait=False)
            raise OSError(f"--grpc {address}: cannot chmod the socket: {e.strerror}") from e
        real_address = f"unix:{unix_path}"
        real_port = None
    else:
        host = address.rsplit(":", 1)[0]
        real_address = f"{host}:{port}"
        real_port = port
    leases.start()
    service.tokens = tokens
    log.info("gRPC listening on %s%s", real_address, " (mTLS)" if tls else "")
    return GrpcServer(server, real_address, real_port, unix_path, tokens, leases, service)


__all__ = [
    "HOW_TO_AUTHENTICATE",
    "META_CODE",
    "META_ERROR",
    "META_RULE",
    "STATUS_OF",
    "BrokerServicer",
    "GrpcServer",
    "TlsConfig",
    "start_grpc_server",
    "tls_from_config",
]
