"""A gRPC connection to the broker's Unix socket that waits its turn in the listen backlog.

grpc connects non-blocking: while another user's connect flood keeps the
broker's listen backlog full, each try fails EAGAIN, and grpc retries later
(issue 35 item 1: 191 connects of 200 failed). A blocking connect waits in
the kernel instead, and the kernel serves blocked connectors one per freed
slot, in order, so it gets in after those queued before it.

So for a unix: address the client gives grpc a private listener of its own
(a socket in a 0700 directory of the caller's: no other user can connect
to it or flood it), and joins each connection grpc makes there to the
broker's socket through a blocking connect (bounded by SO_SNDTIMEO), then
copies bytes both ways in two threads. The broker sees the same uid and pid
(SO_PEERCRED) as with a direct connection.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import struct
import tempfile
import threading

CHUNK = 64 * 1024


def timeval(seconds: float) -> bytes:
    """struct timeval for SO_SNDTIMEO / SO_RCVTIMEO."""
    return struct.pack("ll", int(seconds), int(seconds % 1 * 1_000_000))


def connect_waiting(path: str, seconds: float) -> socket.socket:
    """A blocking connect to the Unix stream socket at path that waits up to
    seconds for room in its listen backlog (then EAGAIN)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval(seconds))
        s.connect(path)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval(0))  # 0: no limit
    except BaseException:
        s.close()
        raise
    return s


class QueuedConnector:
    """A private listener for grpc whose connections are joined to `target`
    (a Unix socket path) through connect_waiting; close() ends it."""

    def __init__(self, target: str, wait_seconds: float) -> None:
        self._target = target
        self._wait = wait_seconds
        self._dir = tempfile.mkdtemp(prefix="gfxbpf-grpc-")  # 0700, the caller's
        self.path = os.path.join(self._dir, "broker.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self._listener.bind(self.path)
            self._listener.listen(16)
        except BaseException:
            self.close()
            raise
        threading.Thread(target=self._serve, name="gfxbpf-grpc-connect", daemon=True).start()

    @property
    def address(self) -> str:
        """The address to give grpc."""
        return f"unix:{self.path}"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _serve(self) -> None:
        while True:
            try:
                inner, _ = self._listener.accept()
            except OSError:  # closed
                return
            threading.Thread(
                target=self._join, args=(inner,), name="gfxbpf-grpc-relay", daemon=True
            ).start()

    def _join(self, inner: socket.socket) -> None:
        try:
            outer = connect_waiting(self._target, self._wait)
        except OSError:
            inner.close()  # grpc sees the connection fail, and says why it cannot connect
            return
        back = threading.Thread(target=_copy, args=(outer, inner), daemon=True)
        back.start()
        _copy(inner, outer)
        back.join()
        inner.close()
        outer.close()


def _copy(src: socket.socket, dst: socket.socket) -> None:
    """src -> dst until src ends, then dst's write side ends; on an error both
    ends shut down, so the other direction ends too."""
    how = socket.SHUT_WR
    try:
        while data := src.recv(CHUNK):
            dst.sendall(data)
    except OSError:
        how = socket.SHUT_RDWR
        _shut(src, how)
    _shut(dst, how)


def _shut(s: socket.socket, how: int) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(how)
