"""Connects that wait their turn in a full listen backlog (client/grpc_queued.py),
and the listeners' hung-up check (broker/listening.py); issue 35 item 1."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from gfxbpf.broker.listening import hung_up
from gfxbpf.client.grpc_queued import QueuedConnector, connect_waiting


def _fill(path: str) -> list[socket.socket]:
    """Connect non-blocking until the listener's backlog refuses (EAGAIN)."""
    held = []
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(path)
        except BlockingIOError:
            s.close()
            return held
        held.append(s)


def _full_listener(path: str) -> tuple[socket.socket, list[socket.socket]]:
    """A listener at path whose backlog is full, and the connections filling it."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    return listener, _fill(path)


def test_a_waiting_connect_gets_in_when_the_full_backlog_moves(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    listener, held = _full_listener(path)
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(connect_waiting(path, 5.0)))
    t.start()
    t.join(0.2)
    assert t.is_alive()  # waiting in the kernel, not failed
    for _ in held:  # the broker accepts: the queue moves, the waiting connect gets in
        listener.accept()[0].close()
    t.join(5)
    assert got and isinstance(got[0], socket.socket)
    for s in [*held, got[0]]:
        s.close()  # type: ignore[union-attr]
    listener.close()


def test_a_waiting_connect_gives_up_after_its_time(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    listener, held = _full_listener(path)
    with pytest.raises(BlockingIOError):
        connect_waiting(path, 0.2)
    for s in [*held, listener]:
        s.close()


def test_the_connector_relays_both_ways_to_the_target(tmp_path: Path) -> None:
    path = str(tmp_path / "broker.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)

    def echo() -> None:
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(100):
                conn.sendall(data.upper())

    threading.Thread(target=echo, daemon=True).start()
    c = QueuedConnector(path, 5.0)
    assert c.address.startswith("unix:") and (Path(c.path).parent.stat().st_mode & 0o077) == 0
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(c.path)
    s.sendall(b"hello")
    assert s.recv(100) == b"HELLO"
    s.close()
    c.close()
    assert not Path(c.path).parent.exists()
    server.close()


def test_hung_up_tells_a_closed_peer_from_an_open_or_talking_one() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    assert not hung_up(a)
    b.send(b"x")
    assert not hung_up(a)  # a request waits: serve it
    a.recv(1)
    b.close()
    assert hung_up(a)
    a.close()
