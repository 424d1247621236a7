"""A Unix session that ends on an error of the broker's own (an OSError that
is not the peer going away, e.g. EBADF from a closed fd) leaves an audit
line saying why; a peer that hangs up leaves none. Offline: a socketpair
and a stand-in service."""

from __future__ import annotations

import errno
import socket
import threading
from types import SimpleNamespace
from typing import Any

from gfxbpf.broker.unix.session import Session
from gfxbpf.proto import framing
from gfxbpf.proto import gfxbpf_pb2 as pb


class Service:
    def __init__(self, fail: OSError | None) -> None:
        self.fail = fail
        self.records: list[dict[str, Any]] = []
        self.audit = SimpleNamespace(record=lambda **kw: self.records.append(kw))
        self.policy = SimpleNamespace(limits=SimpleNamespace(hello_timeout_seconds=5))
        self.closed = False

    def open_owner(self, caller: object) -> object:
        return object()

    def close_owner(self, owner: object) -> None:
        self.closed = True

    def hello(self, caller: object, body: object) -> pb.HelloReply:
        if self.fail is not None:
            raise self.fail
        return pb.HelloReply()


def _serve(service: Service, then_close: bool) -> Service:
    broker_end, client = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    session = Session(service, broker_end)  # type: ignore[arg-type]
    t = threading.Thread(target=session.run)
    t.start()
    framing.send_message(client, pb.Request(id=1, hello=pb.HelloRequest()))
    if then_close:
        client.close()
    else:
        try:
            framing.recv_message(client, pb.Response)  # the session's end, or a reply
        except framing.PeerClosed:
            pass
    t.join(10)
    assert not t.is_alive()
    if not then_close:
        client.close()
    return service


def test_an_error_of_the_brokers_own_is_audited() -> None:
    s = _serve(Service(OSError(errno.EBADF, "Bad file descriptor")), then_close=False)
    ends = [r for r in s.records if r["op"] == "session"]
    assert len(ends) == 1 and ends[0]["result"] == "error", s.records
    assert "OSError: [Errno 9] Bad file descriptor" in ends[0]["detail"]
    assert ends[0]["uid"] >= 0 and ends[0]["transport"] == "unix"
    assert s.closed  # its attachments are released all the same


def test_a_peer_that_hangs_up_leaves_no_error_line() -> None:
    s = _serve(Service(BrokenPipeError(errno.EPIPE, "Broken pipe")), then_close=True)
    assert [r for r in s.records if r["op"] == "session"] == [] and s.closed
    s = _serve(Service(None), then_close=True)
    assert s.records == [] and s.closed
