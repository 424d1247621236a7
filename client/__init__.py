"""gfxbpf.client: the library a tool uses, and the gfxclient command.

    from gfxbpf.client import Broker

    with Broker.connect() as broker, broker.attach("syscount", scope="self") as att:
        ...
        print(att.maps["counts"].read())

The client talks to the broker only through gfxbpf.proto and reads what it is
handed with the read side of gfxbpf.bpf; it never imports gfxbpf.broker and
never touches tracefs or capabilities (tests/unit/test_client_layering.py).
"""

from gfxbpf.client.broker import Broker
from gfxbpf.client.errors import (
    BrokerError,
    BrokerUnreachable,
    ClientError,
    ProtocolError,
    UsageError,
)
from gfxbpf.client.events import EventStream
from gfxbpf.client.handle import Attachment, ClientMap

__all__ = [
    "Attachment",
    "Broker",
    "BrokerError",
    "BrokerUnreachable",
    "ClientError",
    "ClientMap",
    "EventStream",
    "ProtocolError",
    "UsageError",
]
