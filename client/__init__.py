"""gfxbpf.client: the library a tool uses, and the gfxclient command.

    from gfxbpf.client import Broker

    with Broker.connect() as broker, broker.attach("syscount", scope="self") as att:
        ...
        print(att.maps["counts"].read())

The client talks to the broker only through gfxbpf.proto and reads what it is
handed with the read side of gfxbpf.bpf; it never imports gfxbpf.broker and
never touches tracefs or capabilities (tests/unit/test_client_layering.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# Loaded on first use (PEP 562): every gfxclient command imports this package,
# and Broker brings protobuf and the connection (~50 ms) that `--help`, a
# usage error or an offline command never need.
_WHERE = {
    "Broker": "gfxbpf.client.broker",
    "BrokerError": "gfxbpf.client.errors",
    "BrokerUnreachable": "gfxbpf.client.errors",
    "ClientError": "gfxbpf.client.errors",
    "ProtocolError": "gfxbpf.client.errors",
    "UsageError": "gfxbpf.client.errors",
    "EventStream": "gfxbpf.client.events",
    "Attachment": "gfxbpf.client.handle",
    "ClientMap": "gfxbpf.client.handle",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
