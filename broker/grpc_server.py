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
Both are decided from what arrives before the request message (grpc_auth),
so a call that sends headers and then nothing never gets further than that.

Floods (issue #16): the server is grpc.aio (see BrokerServicer for why), so
a call waiting for its request holds no thread; each authenticated uid may
have [limits] grpc_calls_per_user calls in flight (more: RESOURCE_EXHAUSTED
at once), and a call's request must arrive within grpc_request_seconds of
its headers (else INVALID_ARGUMENT, ERROR_PROTOCOL). Every refused call is
audited ("grpc_auth", "grpc_limit", "grpc_request"; with its uid when known,
else transport "grpc" and the peer), through the audit log's rate limit.

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

import asyncio
import contextlib
import functools
import logging
import os
import stat
import threading
from collections.abc import AsyncIterator, Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError

from gfxbpf.broker.grpc_auth import Authenticator, AuthFailure, CallSlots
from gfxbpf.broker.leases import REAP_INTERVAL, Holder, LeaseManager
from gfxbpf.broker.service import BrokerError
from gfxbpf.broker.tokens import TokenStore
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


def _trailers(err: BrokerError) -> tuple[tuple[str, str | bytes], ...]:
    try:
        name = pb.ErrorCode.Name(err.code)
    except ValueError:
        name = str(err.code)
    md: list[tuple[str, str | bytes]] = [
        (META_CODE, name),
        (META_ERROR, err.to_pb().SerializeToString()),
    ]
    if err.rule:
        md.append((META_RULE, _ascii(err.rule)))
    return tuple(md)


async def _abort(context: grpc.aio.ServicerContext, err: BrokerError) -> NoReturn:
    code = STATUS_OF.get(err.code, grpc.StatusCode.UNKNOWN)
    await context.abort(code, err.message, trailing_metadata=_trailers(err))
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


def _internal(what: str, e: Exception) -> BrokerError:
    """A bug fails one call, not the listener."""
    log.exception("gRPC %s failed", what)
    return BrokerError(pb.ERROR_INTERNAL, f"broker internal error: {type(e).__name__}: {e}")


# What each method of service Broker carries: (request, reply, server-streaming).
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Broker"].full_name
METHODS: dict[str, tuple[type[Any], type[Any], bool]] = {
    m.name: (getattr(pb, m.input_type.name), getattr(pb, m.output_type.name), m.server_streaming)
    for m in pb.DESCRIPTOR.services_by_name["Broker"].methods
}
# Batches a stream's producer thread may run ahead of what the client took.
STREAM_AHEAD = 2


class _Slot:
    """One call's place in CallSlots: released when the call has ended AND no
    thread still works for it (a client that hangs up mid-Attach does not free
    its slot while the attach still runs, so hanging up cannot pile work up)."""

    def __init__(self, slots: CallSlots, uid: int) -> None:
        self.slots = slots
        self.uid = uid
        self.jobs = 0
        self.ended = False
        self.released = False
        self.lock = threading.Lock()

    def submit(
        self, executor: futures.Executor, fn: Callable[..., Any], *args: Any
    ) -> asyncio.Future[Any]:
        """Run fn(*args) in executor for this call; await the result (never raises)."""
        with self.lock:
            self.jobs += 1
        try:
            job = executor.submit(fn, *args)
        except BaseException:  # shut down (the server stops): no job, no wait for one
            self._job_done(None)
            raise
        job.add_done_callback(self._job_done)  # also when cancelled before it ran
        return asyncio.wrap_future(job)

    def _job_done(self, _job: object) -> None:
        with self.lock:
            self.jobs -= 1
        self._maybe_release()

    def end(self) -> None:
        with self.lock:
            self.ended = True
        self._maybe_release()

    def _maybe_release(self) -> None:
        with self.lock:
            if self.released or not self.ended or self.jobs:
                return
            self.released = True
        self.slots.release(self.uid)


class BrokerServicer:
    """Service Broker over a Service, a TokenStore and a LeaseManager, on grpc.aio.

    Why grpc.aio and not the thread-per-call server: a call that sent its
    headers but not its request is, on the sync server, a pool thread waiting
    for the body (and a slot of maximum_concurrent_rpcs): 64 such calls from
    anyone stalled every user (issue #16). Here a call waiting for its
    request is a coroutine on one event loop and costs no thread, the
    receive is bounded with asyncio.wait_for, and per-uid accounting is
    released by `finally` on every way a call ends (abort, client cancel or
    disconnect, server stop). The Service itself blocks (bpf syscalls, attach
    takes hundreds of ms, StreamEvents polls a ring buffer), so its work runs
    in thread pools, entered only by authenticated calls within their
    user's grpc_calls_per_user, once their request has arrived.

    Every method is registered request-streaming on the server side (on the
    wire a unary call is a stream of one message; the client sees no
    difference), so its handler starts at the call's headers: it
    authenticates (the token was already checked by the _Gate from the
    metadata; a certificate is checked here), takes the uid's slot, and only
    then reads the one request message, for at most grpc_request_seconds.
    """

    def __init__(
        self,
        service: Any,
        tokens: TokenStore,
        leases: LeaseManager,
        *,
        tls: bool = False,
        pool: futures.Executor | None = None,
        streams: futures.Executor | None = None,
    ) -> None:
        self.service = service
        self.tokens = tokens
        self.leases = leases
        self.tls = tls
        self.auth = Authenticator(service, tokens, leases, tls=tls)
        self.slots = CallSlots()
        self.pool = pool or futures.ThreadPoolExecutor(64, thread_name_prefix="gfxbpf-grpc")
        self.streams = streams or futures.ThreadPoolExecutor(
            256, thread_name_prefix="gfxbpf-grpc-stream"
        )
        self.unary: dict[str, Callable[[Holder, Any], Any]] = {
            "Hello": self.hello,
            "ListPrograms": self.list_programs,
            "Attach": self.attach,
            "Detach": self.detach,
            "ReadMap": self.read_map,
            "Stats": self.stats,
        }

    # ------------------------------------------------------------ refusals

    def _audit_denied(self, op: str, context: Any, why: str, uid: int | None = None) -> None:
        audit = getattr(self.service, "audit", None)
        if audit is None:
            return
        fields: dict[str, Any] = {"detail": why, "transport": "grpc"}
        if uid is not None:
            fields["uid"] = uid
        with contextlib.suppress(Exception):
            fields["peer"] = context.peer()
        try:
            audit.denied(op, **fields)
        except Exception:  # the audit log must not take the listener down
            log.exception("audit failed")

    def _denied(self, context: Any, why: str) -> BrokerError:
        self._audit_denied("grpc_auth", context, why)
        return BrokerError(pb.ERROR_UNAUTHENTICATED, f"{why}: {HOW_TO_AUTHENTICATE}")

    # ------------------------------------------------------------ call prologue

    async def _identify(self, verdict: Holder | AuthFailure | None, context: Any) -> Holder:
        """The caller's Holder (from the _Gate's verdict or the certificate); raises _Abort."""
        if isinstance(verdict, Holder):
            return verdict
        if verdict is None and self.tls:
            # pwd/grp lookups may block (NSS): not on the event loop.
            loop = asyncio.get_running_loop()
            verdict = await loop.run_in_executor(
                self.pool, self.auth.from_certificate, context.auth_context()
            )
            if isinstance(verdict, Holder):
                return verdict
        why = verdict.why if isinstance(verdict, AuthFailure) else "no credentials"
        raise _Abort(self._denied(context, why))

    def _enter(self, holder: Holder, context: Any) -> _Slot:
        """A slot of the caller's uid; raises _Abort(RESOURCE_EXHAUSTED) over the limit."""
        uid = holder.caller.uid
        limit = self.service.policy.limits.grpc_calls_per_user
        if not self.slots.acquire(uid, limit):
            rule = f"[limits] grpc_calls_per_user = {limit}"
            why = f"uid {uid} already has {limit} gRPC calls in flight"
            self._audit_denied("grpc_limit", context, f"{why} ({rule})", uid)
            raise _Abort(
                BrokerError(
                    pb.ERROR_RESOURCE_EXHAUSTED,
                    f"{why}; wait for one to end (the policy's {rule})",
                    rule,
                )
            )
        return _Slot(self.slots, uid)

    async def _receive(self, name: str, requests: Any, context: Any, holder: Holder) -> Any:
        """The call's one request message, within grpc_request_seconds, parsed;
        raises _Abort (ERROR_PROTOCOL) when it is late, missing or not a message."""
        seconds = self.service.policy.limits.grpc_request_seconds
        rule = ""
        try:
            data = await asyncio.wait_for(anext(requests), seconds)
        except TimeoutError:
            why = f"no request message within {seconds} s of the call's headers"
            rule = f"[limits] grpc_request_seconds = {seconds}"
        except StopAsyncIteration:
            why = "the call ended its request stream without a request message"
        else:
            # Parsed here, not by grpc, whose own failure is an INTERNAL status
            # and a logged traceback, with nothing in the audit log.
            request_type = METHODS[name][0]
            try:
                return request_type.FromString(data)
            except DecodeError as e:
                why = f"the request is not a valid {request_type.DESCRIPTOR.full_name}: {e}"
        self._audit_denied(
            "grpc_request", context, f"{why} ({rule})" if rule else why, holder.caller.uid
        )
        raise _Abort(BrokerError(pb.ERROR_PROTOCOL, why, rule))

    # ------------------------------------------------------------ handlers (event loop)

    async def handle_unary(
        self, name: str, verdict: Holder | AuthFailure | None, requests: Any, context: Any
    ) -> Any:
        try:
            holder = await self._identify(verdict, context)
            slot = self._enter(holder, context)
            try:
                request = await self._receive(name, requests, context, holder)
                outcome = await slot.submit(self.pool, self._call, name, holder, request)
            finally:
                slot.end()
        except _Abort as e:
            outcome = e.err
        if isinstance(outcome, BrokerError):
            await _abort(context, outcome)
        return outcome

    async def handle_stream(
        self, name: str, verdict: Holder | AuthFailure | None, requests: Any, context: Any
    ) -> AsyncIterator[Any]:
        """StreamEvents: a thread runs the Service's iterator and hands batches
        over, at most STREAM_AHEAD ahead of what the client took."""
        err: BrokerError | None = None
        try:
            holder = await self._identify(verdict, context)
            slot = self._enter(holder, context)
            stop = threading.Event()  # the call ended: the producer stops
            try:
                request = await self._receive(name, requests, context, holder)
                loop = asyncio.get_running_loop()
                queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
                credit = threading.Semaphore(STREAM_AHEAD)

                def post(item: tuple[str, Any]) -> None:
                    with contextlib.suppress(RuntimeError):  # the loop is gone: server stopped
                        loop.call_soon_threadsafe(queue.put_nowait, item)

                def emit(batch: Any) -> bool:
                    while not credit.acquire(timeout=0.25):
                        if stop.is_set():
                            return False
                    if stop.is_set():
                        return False
                    post(("batch", batch))
                    return True

                def produce() -> None:
                    post(("end", self._stream(holder, request, emit, stop.is_set)))

                slot.submit(self.streams, produce)
                while True:
                    kind, item = await queue.get()
                    if kind == "end":
                        err = item
                        break
                    yield item
                    credit.release()
            finally:
                stop.set()
                slot.end()
        except _Abort as e:
            err = e.err
        if err is not None:
            await _abort(context, err)

    # ------------------------------------------------------------ the service (threads)

    def _call(self, name: str, holder: Holder, request: Any) -> Any:
        """Reply, or the BrokerError to answer with (never raises)."""
        try:
            return self.unary[name](holder, request)
        except BrokerError as e:
            return e
        except Exception as e:
            return _internal(name, e)

    def hello(self, h: Holder, request: pb.HelloRequest) -> pb.HelloReply:
        return self.service.hello(h.caller, request)

    def list_programs(self, h: Holder, request: pb.ListProgramsRequest) -> pb.ListProgramsReply:
        return self.service.list_programs(h.caller, request)

    def attach(self, h: Holder, request: pb.AttachRequest) -> pb.AttachReply:
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

    def detach(self, h: Holder, request: pb.DetachRequest) -> pb.DetachReply:
        with self.leases.using(h) as owner:
            try:
                reply = self.service.detach(h.caller, owner, request)
            except BrokerError as e:
                if e.code == pb.ERROR_NOT_FOUND:
                    self.leases.release(h, request.attachment_id)
                raise
            self.leases.release(h, request.attachment_id)
            return reply

    def read_map(self, h: Holder, request: pb.ReadMapRequest) -> pb.ReadMapReply:
        with self.leases.using(h) as owner:
            self.leases.renew(h, request.attachment_id)
            return self.service.read_map(h.caller, owner, request)

    def stats(self, h: Holder, request: pb.StatsRequest) -> pb.StatsReply:
        with self.leases.using(h) as owner:
            if request.attachment_id:
                self.leases.renew(h, request.attachment_id)
            else:
                self.leases.renew_all(h)
            return self.service.stats(h.caller, owner, request)

    def _stream(
        self,
        h: Holder,
        request: pb.StreamEventsRequest,
        emit: Callable[[pb.EventBatch], bool],
        cancelled: Callable[[], bool],
    ) -> BrokerError | None:
        """StreamEvents in a thread: emit() each batch; the error to end with, if any."""
        try:
            aid = request.attachment_id
            with self.leases.using(h) as owner, self.leases.pinned(h, aid):
                # Pinned: an open stream keeps its attachment's lease alive.
                for batch in self.service.stream_events(h.caller, owner, request, cancelled):
                    if not emit(batch) or batch.end:
                        break
            return None
        except BrokerError as e:
            return e
        except Exception as e:
            return _internal("StreamEvents", e)


class _Gate(grpc.GenericRpcHandler):
    """The interception point: grpc asks it for a method's handler when the
    call's headers arrive, with their metadata and before any message is read.
    The bearer token is checked here; what it returns is a request-streaming
    handler bound to that verdict, which refuses a failed one at once."""

    def __init__(self, servicer: BrokerServicer) -> None:
        self.servicer = servicer
        self.prefix = f"/{SERVICE_NAME}/"

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method or ""
        if not method.startswith(self.prefix):
            return None
        name = method[len(self.prefix) :]
        spec = METHODS.get(name)
        if spec is None:
            return None  # UNIMPLEMENTED
        _, reply_type, streaming = spec
        verdict = self.servicer.auth.from_metadata(details.invocation_metadata)
        if streaming:
            return grpc.stream_stream_rpc_method_handler(
                functools.partial(self.servicer.handle_stream, name, verdict),
                # Raw bytes: _receive parses them (and answers a bad one).
                response_serializer=reply_type.SerializeToString,
            )
        return grpc.stream_unary_rpc_method_handler(
            functools.partial(self.servicer.handle_unary, name, verdict),
            response_serializer=reply_type.SerializeToString,
        )


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
        service: Any,
        servicer: BrokerServicer,
        loop: asyncio.AbstractEventLoop,
        thread: threading.Thread,
    ) -> None:
        self.server = server
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

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for stop(); True when timeout passed first (as grpc's wait_for_termination)."""
        return not self._stopped.wait(timeout)


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
    (mTLS: client certificates are required). max_workers threads run
    unary calls' Service work (calls waiting for their turn cost none);
    open streams have their own threads. Call it after the process dropped
    its privileges: grpc starts threads. Raises OSError/ValueError with a
    clear message when it cannot listen.
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
    servicer = BrokerServicer(
        service,
        tokens,
        leases,
        tls=tls is not None,
        pool=futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="gfxbpf-grpc"),
        streams=futures.ThreadPoolExecutor(
            max_workers=4 * max_workers, thread_name_prefix="gfxbpf-grpc-stream"
        ),
    )
    if unix_path is not None:
        _prepare_unix_path(unix_path)
    bind = f"unix:{unix_path}" if unix_path is not None else address

    async def listen() -> tuple[grpc.aio.Server, int]:
        # No maximum_concurrent_rpcs: it counts calls from their headers, so
        # whoever holds that many refuses everyone. CallSlots bounds each uid.
        server = grpc.aio.server(options=options)
        server.add_generic_rpc_handlers((_Gate(servicer),))
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
        if unix_path is None and not port:
            raise OSError(f"--grpc {address}: cannot listen (address in use, or bad TLS files?)")
        await server.start()
        return server, port

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=_run_loop, args=(loop,), name="gfxbpf-grpc-loop", daemon=True)
    thread.start()

    def give_up() -> None:
        _stop_loop(loop, thread)
        servicer.pool.shutdown(wait=False)
        servicer.streams.shutdown(wait=False)

    try:
        server, port = asyncio.run_coroutine_threadsafe(listen(), loop).result(60.0)
    except BaseException:
        give_up()
        raise
    if unix_path is not None:
        # The unit's UMask=0077 made it 0600; callers authenticate per call.
        try:
            os.chmod(unix_path, socket_mode)
        except OSError as e:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(5.0)
            give_up()
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
    return GrpcServer(
        server, real_address, real_port, unix_path, tokens, leases, service, servicer, loop, thread
    )


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
