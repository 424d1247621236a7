"""What each method of service Broker does on the Service, in a worker thread.

The event-loop side (grpc_servicer) authenticates a call, takes its slot and
reads its request; then one of these runs in a thread pool, because the
Service blocks (bpf syscalls; attach takes hundreds of ms; StreamEvents
polls a ring buffer). Attachments made over gRPC belong to one Owner per
token (or certificate) and live on a lease (leases.LeaseManager): any call
naming the attachment renews it, the reaper detaches it when it runs out.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gfxbpf.broker.access.leases import Holder, LeaseManager
from gfxbpf.broker.errors import BrokerError
from gfxbpf.broker.grpc.errors import internal_error
from gfxbpf.proto import gfxbpf_pb2 as pb

if TYPE_CHECKING:
    from gfxbpf.broker.service import Service

# What each method of service Broker carries: (request, reply, server-streaming).
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Broker"].full_name
METHODS: dict[str, tuple[type[Any], type[Any], bool]] = {
    m.name: (getattr(pb, m.input_type.name), getattr(pb, m.output_type.name), m.server_streaming)
    for m in pb.DESCRIPTOR.services_by_name["Broker"].methods
}


class ServiceMethods:
    """Service Broker's methods over a Service and a LeaseManager (thread side)."""

    def __init__(self, service: Service, leases: LeaseManager) -> None:
        self.service = service
        self.leases = leases
        self.unary: dict[str, Callable[[Holder, Any], Any]] = {
            "Hello": self.hello,
            "ListPrograms": self.list_programs,
            "Attach": self.attach,
            "Detach": self.detach,
            "ReadMap": self.read_map,
            "Stats": self.stats,
        }

    def call(self, name: str, holder: Holder, request: Any) -> Any:
        """Reply, or the BrokerError to answer with (never raises)."""
        try:
            return self.unary[name](holder, request)
        except BrokerError as e:
            return e
        except Exception as e:
            return internal_error(name, e)

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

    def stream(
        self,
        h: Holder,
        request: pb.StreamEventsRequest,
        emit: Callable[[pb.EventBatch], bool],
        cancelled: Callable[[], bool],
    ) -> BrokerError | None:
        """StreamEvents: emit() each batch; the error to end with, if any (never raises)."""
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
            return internal_error("StreamEvents", e)


__all__ = ["METHODS", "SERVICE_NAME", "ServiceMethods"]
