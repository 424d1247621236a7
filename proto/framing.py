"""Framing for the Unix control socket.

The socket is SOCK_SEQPACKET: the kernel keeps message boundaries, so one
datagram carries exactly one serialized protobuf message and no length prefix
is needed. File descriptors ride as SCM_RIGHTS on the datagram whose message
describes them.

A zero-length datagram cannot be told apart from the peer closing the
connection (both make recvmsg return 0 bytes), so send_message refuses to
send an empty serialization; the Request/Response envelopes are never empty
once their oneof is set.

Sockets are used in blocking mode; on a non-blocking socket BlockingIOError
propagates unchanged.
"""

from __future__ import annotations

import array
import errno
import os
import socket
import struct
from collections.abc import Iterable
from typing import NamedTuple, TypeVar

from google.protobuf.message import DecodeError, Message

# The largest datagram either side accepts. Big enough for an uploaded object
# plus its envelope; map contents larger than this are paged (ReadMap cursor).
MAX_MESSAGE_SIZE = 1 << 20
# Most fds one datagram may carry (the kernel's own cap, SCM_MAX_FD, is 253).
MAX_FDS = 64
_SCM_MAX_FD = 253
# Kernel refuses a datagram larger than the send buffer minus this overhead.
_SNDBUF_OVERHEAD = 32
# getsockopt(SOL_SOCKET, ...) options Python does not name (asm-generic values,
# used by x86 and arm64): SO_PEERGROUPS (Linux >= 4.13), SO_PEERPIDFD (>= 6.5).
_SO_PEERGROUPS = 59
_SO_PEERPIDFD = 77
_UCRED = struct.Struct("iII")  # struct ucred: pid_t pid; uid_t uid; gid_t gid

M = TypeVar("M", bound=Message)


class FramingError(Exception):
    """A datagram on the control socket could not be sent or received as a message."""


class PeerClosed(FramingError):
    """The peer closed the connection (EOF or reset)."""


class MessageTooLarge(FramingError):
    """A message exceeds the size limit (or the socket's send buffer)."""


class MessageTruncated(FramingError):
    """A received datagram or its fds did not fit (MSG_TRUNC / MSG_CTRUNC)."""


class BadMessage(FramingError):
    """A received datagram is not a valid serialized message of the expected type."""


class PeerCredentials(NamedTuple):
    pid: int
    uid: int
    gid: int


def _close_all(fds: Iterable[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _ensure_sndbuf(sock: socket.socket, size: int) -> None:
    # The default send buffer (net.core.wmem_default, ~208 KiB) caps the size
    # of one datagram; grow it on demand (the kernel clamps to wmem_max).
    current = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    if size + _SNDBUF_OVERHEAD > current:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size + 4096)


def send_message(
    sock: socket.socket,
    msg: Message,
    fds: Iterable[int] = (),
    *,
    max_size: int = MAX_MESSAGE_SIZE,
) -> None:
    """Send msg as one datagram, with fds attached as SCM_RIGHTS.

    The fds stay open in the sender (the kernel duplicates them into the
    receiver); close them afterwards if they are no longer needed.
    """
    data = msg.SerializeToString()
    fd_list = [int(fd) for fd in fds]
    if not data:
        raise FramingError(
            f"refusing to send an empty {type(msg).__name__}: on SOCK_SEQPACKET a "
            "zero-length datagram reads as end of connection; set the envelope's body"
        )
    if len(data) > max_size:
        raise MessageTooLarge(
            f"{type(msg).__name__} is {len(data)} bytes, over the {max_size}-byte limit "
            "of one control-socket datagram; page the data (e.g. ReadMap cursor)"
        )
    if len(fd_list) > _SCM_MAX_FD:
        raise FramingError(
            f"{len(fd_list)} fds in one message; the kernel passes at most {_SCM_MAX_FD}"
        )
    _ensure_sndbuf(sock, len(data))
    ancillary = []
    if fd_list:
        ancillary.append((socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fd_list)))
    try:
        sent = sock.sendmsg([data], ancillary, socket.MSG_NOSIGNAL)
    except (BrokenPipeError, ConnectionResetError) as e:
        raise PeerClosed(f"peer closed the control socket ({e.strerror})") from e
    except OSError as e:
        if e.errno == errno.EMSGSIZE:
            raise MessageTooLarge(
                f"{type(msg).__name__} of {len(data)} bytes does not fit the socket send "
                f"buffer ({sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)} bytes); "
                "raise net.core.wmem_max or send less"
            ) from e
        raise
    if sent != len(data):  # SEQPACKET sends are atomic; this is a kernel surprise
        raise FramingError(f"short send on SOCK_SEQPACKET: {sent} of {len(data)} bytes")


def recv_datagram(
    sock: socket.socket, *, max_size: int = MAX_MESSAGE_SIZE, max_fds: int = MAX_FDS
) -> tuple[bytes, list[int]]:
    """Receive one datagram and the fds that came with it.

    Received fds are close-on-exec and owned by the caller. On any error the
    fds received so far are closed before the exception propagates.
    """
    int_size = array.array("i").itemsize
    try:
        data, ancdata, flags, _ = sock.recvmsg(
            max_size, socket.CMSG_SPACE(max(max_fds, 1) * int_size), socket.MSG_CMSG_CLOEXEC
        )
    except ConnectionResetError as e:
        raise PeerClosed("peer reset the control socket") from e
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % int_size
            fds.extend(array.array("i", payload[:usable]))
    if flags & socket.MSG_TRUNC:
        _close_all(fds)
        raise MessageTruncated(
            f"datagram larger than the {max_size}-byte limit was truncated and dropped"
        )
    if flags & socket.MSG_CTRUNC:
        _close_all(fds)
        raise MessageTruncated(
            f"datagram carried more than {max_fds} fds (or other control data); "
            "its fds were closed and the message dropped"
        )
    if not data:
        _close_all(fds)
        raise PeerClosed("peer closed the control socket")
    return data, fds


def recv_message(
    sock: socket.socket,
    msg_type: type[M],
    *,
    max_size: int = MAX_MESSAGE_SIZE,
    max_fds: int = MAX_FDS,
) -> tuple[M, list[int]]:
    """Receive one datagram and parse it as msg_type; return (message, fds).

    Raises PeerClosed at end of connection, MessageTruncated for an oversized
    datagram or too many fds, BadMessage for bytes that do not parse. The
    caller owns the returned fds.
    """
    data, fds = recv_datagram(sock, max_size=max_size, max_fds=max_fds)
    try:
        msg = msg_type.FromString(data)
    except (DecodeError, ValueError) as e:
        _close_all(fds)
        raise BadMessage(
            f"{len(data)}-byte datagram is not a valid {msg_type.__name__}: {e}"
        ) from e
    return msg, fds


def peer_credentials(sock: socket.socket) -> PeerCredentials:
    """The peer's (pid, uid, gid) as the kernel recorded them at connect time."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    return PeerCredentials(*_UCRED.unpack(raw))


def peer_groups(sock: socket.socket) -> list[int]:
    """The peer's supplementary group ids, as the kernel recorded them at connect time."""
    size = 64 * 4
    while True:
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, _SO_PEERGROUPS, size)
        except OSError as e:
            # ERANGE: more groups than fit; NGROUPS_MAX is 65536.
            if e.errno == errno.ERANGE and size < 65536 * 4:
                size *= 4
                continue
            raise
        usable = len(raw) - len(raw) % 4
        return list(array.array("I", raw[:usable]))


def peer_pidfd(sock: socket.socket) -> int | None:
    """A pidfd for the peer process (Linux >= 6.5), or None when the kernel lacks it.

    Unlike the pid from SO_PEERCRED, a pidfd cannot come to name a different
    process after the peer exits and its pid is reused. The caller owns the fd.
    An OSError (e.g. EINVAL or ESRCH: the peer already exited) propagates.
    """
    try:
        return sock.getsockopt(socket.SOL_SOCKET, _SO_PEERPIDFD)
    except OSError as e:
        if e.errno in (errno.ENOPROTOOPT, errno.ENODATA):
            return None
        raise
