"""What the client library needs from a connection to the broker.

Two transports meet it: connection.UnixConnection (the Unix control socket:
map and ring buffer fds come along, a library fd can be sent) and
grpc_transport.GrpcTransport (no fds: maps come through ReadMap, events
through StreamEvents). Broker, Attachment, ClientMap and EventStream use
only this interface, so they never ask which transport they hold.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

from gfxbpf.proto import gfxbpf_pb2 as pb


class EventCall(Protocol):
    """An open StreamEvents: iterate it for EventBatch messages; cancel() ends it.

    Iterating raises the client's own errors (errors.BrokerError,
    BrokerUnreachable), never a transport library's; after cancel() it just ends.
    """

    def __iter__(self) -> Iterator[pb.EventBatch]: ...

    def cancel(self) -> object: ...


@runtime_checkable
class Transport(Protocol):
    """One session with the broker: its operations, each a request and its reply."""

    # True when fds travel with requests and replies: attach may send the
    # uprobe target's library fd and receives the maps' fds.
    passes_fds: bool

    @property
    def closed(self) -> bool: ...

    def close(self) -> None: ...

    def hello(self, req: pb.HelloRequest) -> pb.HelloReply: ...

    def list_programs(self) -> pb.ListProgramsReply: ...

    def attach(
        self, req: pb.AttachRequest, fds: Sequence[int] = ()
    ) -> tuple[pb.AttachReply, list[int]]:
        """The reply and the fds that came with it (sent fds stay the caller's)."""
        ...

    def detach(self, attachment_id: int) -> pb.DetachReply: ...

    def read_map(self, req: pb.ReadMapRequest) -> pb.ReadMapReply: ...

    def stats(self, attachment_id: int = 0) -> pb.StatsReply: ...

    def stream_events(self, req: pb.StreamEventsRequest) -> EventCall:
        """The ring buffer's records through the broker; raises ClientError
        where this transport cannot (the Unix socket hands the ring's fd instead)."""
        ...


__all__ = ["EventCall", "Transport"]
