"""Which BPF maps the kernel still holds, by id.

A map lives while anything references it: a program, a pin, or an fd some
process kept. Listing map ids (BPF_MAP_GET_NEXT_ID) needs CAP_SYS_ADMIN, so
this runs a map iterator instead (bpf/internal/mapids.bpf.c, iter/bpf_map),
which CAP_BPF + CAP_PERFMON may load: one u32 id per live map per run.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from importlib import resources
from pathlib import Path

from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.link.attach import LinkAttachment
from gfxbpf.bpf.link.tracing import attach_iter, read_iter
from gfxbpf.bpf.loader import LoadedObject, load
from gfxbpf.bpf.object import ObjectSpec

OBJECT = "mapids.bpf.o"
PROGRAM = "map_ids"


def object_path() -> Path:
    return Path(str(resources.files("gfxbpf.bpf.internal") / OBJECT))


def map_id(fd: int) -> int:
    """The kernel's id of the map behind fd."""
    return bpfsys.map_info(fd).id


class LiveMaps:
    """ids() runs the iterator (loaded on first use); thread-safe.

    If the kernel cannot run it (no BTF, no bpf_iter, no capability),
    ids() returns None and keeps doing so: the caller decides what an
    unknown answer means. error says why.
    """

    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._obj: LoadedObject | None = None
        self._link: LinkAttachment | None = None
        self.error: str | None = None

    def _open(self) -> LinkAttachment | None:
        if self._link is not None or self.error is not None:
            return self._link
        try:
            spec = ObjectSpec.from_file(str(self._path or object_path()))
            self._obj = load(spec)
            self._link = attach_iter(self._obj.programs[PROGRAM].fd, "iter/bpf_map")
        except Exception as e:  # any failure: say why, answer None from now on
            self.error = f"{type(e).__name__}: {e}"
            self.close()
        return self._link

    def ids(self) -> set[int] | None:
        """The ids of every map the kernel holds now, or None when unknown."""
        with self._lock:
            link = self._open()
            if link is None:
                return None
            try:
                raw = read_iter(link)
            except OSError as e:
                self.error = f"reading the map iterator: {e}"
                return None
        n = len(raw) // 4
        return set(struct.unpack(f"<{n}I", raw[: n * 4]))

    def probe(self) -> str | None:
        """Load the iterator now; why ids() cannot work, or None when it can.
        With one thread the object is read and loaded in a forked child, which
        passes the iterator's link back: reading an object imports pyelftools
        (~2.4 MiB of RSS), which an idle daemon should not hold for the one
        object it loads at start, and the link is all ids() needs. A failure
        is kept (error), as ids() keeps one."""
        if threading.active_count() > 1:  # a fork copies no other thread
            return None if self.ids() is not None else self.error
        # SEQPACKET: a child that dies unanswered is an empty read, not a hang
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:  # the child: load, answer, exit at once (no atexit, no flush)
            try:
                link = self._open()
                if link is None:
                    theirs.send((self.error or "?").encode()[:4000])
                else:
                    socket.send_fds(theirs, [b"ok"], [link.fd])
            finally:
                os._exit(0)
        theirs.close()
        with ours:
            msg, fds, _, _ = socket.recv_fds(ours, 4096, 1)
        os.waitpid(pid, 0)
        with self._lock:
            if fds:
                self._link = LinkAttachment("iter/bpf_map", fds[0])
                return None
            self.error = msg.decode("utf-8", "replace") or "the map iterator's load gave no answer"
            return self.error

    def close(self) -> None:
        if self._link is not None:
            self._link.close()
            self._link = None
        if self._obj is not None:
            self._obj.close()
            self._obj = None


__all__ = ["OBJECT", "LiveMaps", "map_id", "object_path"]
