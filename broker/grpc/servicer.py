"""The gRPC calls' event-loop side: who calls, their slot, their request, the reply.

Gate is where grpc asks for a method's handler when a call's headers
arrive; BrokerServicer's handlers then authenticate the call, take its uid's
slot, read its one request within grpc_request_seconds, and hand the work to
a thread (grpc_methods). Every refused call is audited ("grpc_auth",
"grpc_limit", "grpc_request"; with its uid when known, else transport
"grpc" and the peer), through the audit log's rate limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import AsyncIterator
from concurrent import futures
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError

from gfxbpf.broker.access.leases import Holder, LeaseManager
from gfxbpf.broker.access.tokens import TokenStore
from gfxbpf.broker.errors import BrokerError
from gfxbpf.broker.grpc.accept import peer_fields
from gfxbpf.broker.grpc.auth import Authenticator, AuthFailure
from gfxbpf.broker.grpc.errors import HOW_TO_AUTHENTICATE, Abort, abort
from gfxbpf.broker.grpc.methods import METHODS, SERVICE_NAME, ServiceMethods
from gfxbpf.broker.grpc.slots import CallSlot, CallSlots
from gfxbpf.proto import gfxbpf_pb2 as pb

if TYPE_CHECKING:
    from gfxbpf.broker.service import Service

log = logging.getLogger("gfxbpf.broker.grpc")

# Batches a stream's producer thread may run ahead of what the client took.
STREAM_AHEAD = 2


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
    authenticates (the token was already checked by the Gate from the
    metadata; a certificate is checked here), takes the uid's slot, and only
    then reads the one request message, for at most grpc_request_seconds.
    """

    def __init__(
        self,
        service: Service,
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
        self.methods = ServiceMethods(service, leases)
        self.pool = pool or futures.ThreadPoolExecutor(64, thread_name_prefix="gfxbpf-grpc")
        self.streams = streams or futures.ThreadPoolExecutor(
            256, thread_name_prefix="gfxbpf-grpc-stream"
        )

    # ------------------------------------------------------------ refusals

    def _audit_denied(self, op: str, context: Any, why: str, uid: int | None = None) -> None:
        audit = getattr(self.service, "audit", None)
        if audit is None:
            return
        fields: dict[str, Any] = {"detail": why, "transport": "grpc"}
        if uid is not None:
            fields["uid"] = uid
        with contextlib.suppress(Exception):
            fields.update(peer_fields(context.peer()))
        try:
            audit.denied(op, **fields)
        except Exception:  # the audit log must not take the listener down
            log.exception("audit failed")

    def _denied(self, context: Any, why: str) -> BrokerError:
        self._audit_denied("grpc_auth", context, why)
        return BrokerError(pb.ERROR_UNAUTHENTICATED, f"{why}: {HOW_TO_AUTHENTICATE}")

    # ------------------------------------------------------------ call prologue

    async def _identify(self, verdict: Holder | AuthFailure | None, context: Any) -> Holder:
        """The caller's Holder (from the Gate's verdict or the certificate); raises Abort."""
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
        raise Abort(self._denied(context, why))

    def _enter(self, holder: Holder, context: Any) -> CallSlot:
        """A slot of the caller's uid; raises Abort(RESOURCE_EXHAUSTED) over the limit."""
        uid = holder.caller.uid
        limit = self.service.policy.limits.grpc_calls_per_user
        if not self.slots.acquire(uid, limit):
            rule = f"[limits] grpc_calls_per_user = {limit}"
            why = f"uid {uid} already has {limit} gRPC calls in flight"
            self._audit_denied("grpc_limit", context, f"{why} ({rule})", uid)
            raise Abort(
                BrokerError(
                    pb.ERROR_RESOURCE_EXHAUSTED,
                    f"{why}; wait for one to end (the policy's {rule})",
                    rule,
                )
            )
        return CallSlot(self.slots, uid)

    async def _receive(self, name: str, requests: Any, context: Any, holder: Holder) -> Any:
        """The call's one request message, within grpc_request_seconds, parsed;
        raises Abort (ERROR_PROTOCOL) when it is late, missing or not a message."""
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
        raise Abort(BrokerError(pb.ERROR_PROTOCOL, why, rule))

    # ------------------------------------------------------------ handlers (event loop)

    async def handle_unary(
        self, name: str, verdict: Holder | AuthFailure | None, requests: Any, context: Any
    ) -> Any:
        try:
            holder = await self._identify(verdict, context)
            slot = self._enter(holder, context)
            try:
                request = await self._receive(name, requests, context, holder)
                outcome = await slot.submit(self.pool, self.methods.call, name, holder, request)
            finally:
                slot.end()
        except Abort as e:
            outcome = e.err
        if isinstance(outcome, BrokerError):
            await abort(context, outcome)
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
                    post(("end", self.methods.stream(holder, request, emit, stop.is_set)))

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
        except Abort as e:
            err = e.err
        if err is not None:
            await abort(context, err)


class Gate(grpc.GenericRpcHandler):
    """The interception point: grpc asks it for a method's handler when the
    call's headers arrive, with their metadata and before any message is read.
    The bearer token is checked here; what it returns is a request-streaming
    handler bound to that verdict, which refuses a failed one at once."""

    def __init__(self, servicer: BrokerServicer) -> None:
        self.servicer = servicer
        self.prefix = f"/{SERVICE_NAME}/"

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
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


__all__ = ["STREAM_AHEAD", "BrokerServicer", "Gate"]
