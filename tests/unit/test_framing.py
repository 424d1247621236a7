"""SOCK_SEQPACKET framing: round trip, fd passing, truncation, EOF, credentials."""

from __future__ import annotations

import array
import os
import socket

import pytest

from gfxbpf.proto import framing
from gfxbpf.proto import gfxbpf_pb2 as pb


@pytest.fixture
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    yield a, b
    a.close()
    b.close()


def _open_fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


def test_round_trip(pair):
    a, b = pair
    req = pb.Request(id=7, attach=pb.AttachRequest(name="syscount", scope=pb.SCOPE_SELF))
    req.attach.params.functions.extend(["vkQueueSubmit", "vkCreateDevice"])
    framing.send_message(a, req)
    got, fds = framing.recv_message(b, pb.Request)
    assert fds == []
    assert got == req
    assert got.WhichOneof("body") == "attach"
    assert list(got.attach.params.functions) == ["vkQueueSubmit", "vkCreateDevice"]


def test_messages_keep_boundaries(pair):
    a, b = pair
    for i in range(1, 4):
        framing.send_message(a, pb.Response(id=i, detach=pb.DetachReply(unloaded=i == 2)))
    ids = [framing.recv_message(b, pb.Response)[0] for _ in range(3)]
    assert [(r.id, r.detach.unloaded) for r in ids] == [(1, False), (2, True), (3, False)]


def test_fd_passing_pipe(pair):
    a, b = pair
    r, w = os.pipe()
    try:
        reply = pb.Response(id=1, attach=pb.AttachReply(attachment_id=5))
        reply.attach.maps.add(name="counts", fd_index=0)
        framing.send_message(a, reply, fds=[r])
        got, fds = framing.recv_message(b, pb.Response)
        assert len(fds) == 1
        assert got.attach.maps[0].fd_index == 0
        received = fds[0]
        assert received not in (r, w)  # a new fd in this process, same pipe
        assert os.get_inheritable(received) is False  # MSG_CMSG_CLOEXEC
        os.write(w, b"through the passed fd")
        assert os.read(received, 100) == b"through the passed fd"
        os.close(received)
    finally:
        os.close(r)
        os.close(w)


def test_large_message_within_limit(pair):
    # Bigger than the default socket send buffer (~208 KiB): send grows it.
    a, b = pair
    blob = os.urandom(600 * 1024)
    framing.send_message(a, pb.Request(id=1, attach=pb.AttachRequest(object=blob)))
    got, _ = framing.recv_message(b, pb.Request)
    assert got.attach.object == blob


def test_send_over_limit_refused(pair):
    a, _ = pair
    msg = pb.Request(id=1, attach=pb.AttachRequest(object=b"x" * 2000))
    with pytest.raises(framing.MessageTooLarge, match="over the 1000-byte limit"):
        framing.send_message(a, msg, max_size=1000)


def test_send_empty_refused(pair):
    a, _ = pair
    with pytest.raises(framing.FramingError, match="zero-length datagram"):
        framing.send_message(a, pb.Request())


def test_truncated_datagram_closes_fds(pair):
    a, b = pair
    r, w = os.pipe()
    try:
        before = _open_fds()
        fds = array.array("i", [r])
        a.sendmsg([b"\x08" * 5000], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        with pytest.raises(framing.MessageTruncated, match="4096-byte limit"):
            framing.recv_message(b, pb.Request, max_size=4096)
        assert _open_fds() == before  # the fd that came with it was closed
        # The connection still works for the next datagram.
        framing.send_message(a, pb.Request(id=9, stats=pb.StatsRequest()))
        got, _ = framing.recv_message(b, pb.Request, max_size=4096)
        assert got.id == 9
    finally:
        os.close(r)
        os.close(w)


def test_too_many_fds_closes_them(pair):
    a, b = pair
    r, w = os.pipe()
    try:
        before = _open_fds()
        framing.send_message(a, pb.Response(id=1, detach=pb.DetachReply()), fds=[r] * 6)
        with pytest.raises(framing.MessageTruncated, match="more than 2 fds"):
            framing.recv_message(b, pb.Response, max_fds=2)
        assert _open_fds() == before
    finally:
        os.close(r)
        os.close(w)


def test_garbage_is_bad_message(pair):
    a, b = pair
    r, w = os.pipe()
    try:
        before = _open_fds()
        a.sendmsg(
            [b"\xff\xff\xff\xff"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r]))]
        )
        with pytest.raises(framing.BadMessage, match="not a valid Request"):
            framing.recv_message(b, pb.Request)
        assert _open_fds() == before
    finally:
        os.close(r)
        os.close(w)


def test_eof_is_peer_closed(pair):
    a, b = pair
    framing.send_message(a, pb.Request(id=1, hello=pb.HelloRequest()))
    a.close()
    got, _ = framing.recv_message(b, pb.Request)  # queued data still arrives
    assert got.id == 1
    with pytest.raises(framing.PeerClosed):
        framing.recv_message(b, pb.Request)


def test_send_to_closed_peer(pair):
    a, b = pair
    b.close()
    with pytest.raises(framing.PeerClosed):
        framing.send_message(a, pb.Request(id=1, hello=pb.HelloRequest()))


def test_peer_credentials(pair):
    a, b = pair
    creds = framing.peer_credentials(b)
    assert creds == (os.getpid(), os.getuid(), os.getgid())
    assert creds.uid == os.getuid()


def test_peer_pidfd(pair):
    a, b = pair
    fd = framing.peer_pidfd(b)
    if fd is None:
        pytest.skip("kernel lacks SO_PEERPIDFD (< 6.5)")
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            info = f.read()
        assert f"Pid:\t{os.getpid()}" in info
    finally:
        os.close(fd)


def test_peer_groups(pair):
    a, b = pair
    assert sorted(framing.peer_groups(b)) == sorted(os.getgroups())


@pytest.mark.skipif(os.geteuid() != 0, reason="setgroups needs root")
def test_peer_groups_many():
    # More groups than the first buffer holds (64): exercises the ERANGE retry.
    groups = list(range(20000, 20100))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: set the groups, report what the peer sees
        code = 1
        try:
            os.close(r)
            os.setgroups(groups)
            a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            seen = framing.peer_groups(b)
            os.write(w, repr(sorted(seen)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert out.decode() == repr(groups)
