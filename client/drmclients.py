"""DRM client ids of the caller's own processes, from /proc/PID/fdinfo.

Since Linux 6.17 the GPU scheduler's events carry the job's DRM client id,
the `drm-client-id` a process's open DRM file shows in /proc/PID/fdinfo/FD.
The kernel lets a user read fdinfo only of processes they could ptrace
(their own, in practice), so this names the client ids of the caller's own
processes and leaves every other id a bare number. It only labels what the
broker already showed: who may see which jobs is decided in the kernel
(scope self keeps the jobs queued by the caller's uid).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import NamedTuple

from gfxbpf.client.printable import printable

__all__ = ["DrmClient", "DrmClientNames", "scan"]

# fdinfo files of DRM devices are a few hundred bytes.
MAX_FDINFO = 64 * 1024


class DrmClient(NamedTuple):  # not a dataclass: see bpf/maps.py's Page
    client_id: int
    pid: int
    comm: str
    driver: str


def _read(path: str, limit: int = MAX_FDINFO) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", errors="replace")
    except OSError:  # gone, or not ours to read
        return None


def _parse_fdinfo(text: str) -> tuple[int | None, str]:
    """(drm-client-id, drm-driver) from one fdinfo text; None when not a DRM file."""
    client_id, driver = None, ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "drm-client-id" and value.strip().isdigit():
            client_id = int(value.strip())
        elif key == "drm-driver":
            driver = value.strip()
    return client_id, driver


def _process_clients(proc: str, pid: int) -> list[DrmClient]:
    fd_dir = os.path.join(proc, str(pid), "fd")
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return []
    comm = (_read(os.path.join(proc, str(pid), "comm"), 64) or "").strip()
    out: dict[int, DrmClient] = {}
    for fd in fds:
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if not target.startswith("/dev/dri/"):
            continue  # only DRM device files have a client id
        text = _read(os.path.join(proc, str(pid), "fdinfo", fd))
        client_id, driver = _parse_fdinfo(text or "")
        if client_id is not None:
            out[client_id] = DrmClient(client_id, pid, comm, driver)
    return list(out.values())


def scan(proc: str = "/proc") -> dict[int, list[DrmClient]]:
    """client id -> the processes (readable to us) that hold that DRM client."""
    found: dict[int, list[DrmClient]] = {}
    try:
        pids = [int(n) for n in os.listdir(proc) if n.isdigit()]
    except OSError:
        return found
    for pid in sorted(pids):
        for c in _process_clients(proc, pid):
            found.setdefault(c.client_id, []).append(c)
    return found


class DrmClientNames:
    """Labels for client ids, rescanning /proc at most every `ttl` seconds."""

    def __init__(
        self,
        ttl: float = 2.0,
        scanner: Callable[[], dict[int, list[DrmClient]]] = scan,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl = ttl
        self._scan = scanner
        self._clock = clock
        self._at: float | None = None
        self._clients: dict[int, list[DrmClient]] = {}

    def label(self, client_id: int) -> str:
        now = self._clock()
        if self._at is None or now - self._at >= self._ttl:
            self._clients, self._at = self._scan(), now
        holders = self._clients.get(client_id)
        if not holders:
            return str(client_id)
        shown = ", ".join(f"pid {c.pid} {printable(c.comm)}" for c in holders[:3])
        more = f" +{len(holders) - 3}" if len(holders) > 3 else ""
        return f"{client_id} ({holders[0].driver}: {shown}{more})"
