"""Does a caller own a process? Checked without races against pid reuse.

The broker holds no CAP_SYS_PTRACE, so it cannot read another user's
/proc/<pid>/maps; it reads /proc/<pid>/status (world-readable) for the real
and effective uid. A pid alone could be recycled between the check and the
attach, so the check is anchored on a pidfd opened first: if the process
the pidfd names is still alive after /proc was read (and again after
attaching), the /proc entry read in between was that same process.
"""

from __future__ import annotations

import os
import select


class PidError(Exception):
    """The process does not exist, is not the caller's, or went away."""


class NoSuchProcess(PidError):
    """The process does not exist (any more): a wrong pid, not a refusal."""


class PidHandle:
    """A pidfd on a process whose ownership was verified; close() releases it."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self.fd = pidfd

    def alive(self) -> bool:
        """True while the process runs (a pidfd polls readable once it exits)."""
        if self.fd < 0:
            return False
        p = select.poll()
        p.register(self.fd, select.POLLIN)
        return not p.poll(0)

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __enter__(self) -> PidHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _status_uids(pid: int, proc: str) -> tuple[int, int]:
    with open(f"{proc}/{pid}/status", "rb") as f:
        for line in f.read().decode("utf-8", "replace").splitlines():
            if line.startswith("Uid:"):
                parts = line.split()[1:]
                return int(parts[0]), int(parts[1])
    raise PidError(f"process {pid}: no Uid line in {proc}/{pid}/status")


def verify_owner(pid: int, uid: int, *, proc: str = "/proc") -> PidHandle:
    """A PidHandle for pid if its real and effective uid are uid; else PidError.

    Order: pidfd_open, read status, then check the pidfd is still alive.
    """
    if not isinstance(pid, int) or pid <= 0:
        raise PidError(f"pid must be a positive process id, got {pid}")
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        raise NoSuchProcess(f"no process {pid}") from None
    except OSError as e:
        raise PidError(f"cannot open process {pid}: {e.strerror}") from None
    handle = PidHandle(pid, pidfd)
    try:
        try:
            ruid, euid = _status_uids(pid, proc)
        except (OSError, ValueError, IndexError):
            raise NoSuchProcess(f"no process {pid}") from None
        if not handle.alive():
            raise NoSuchProcess(f"process {pid} exited")
        if ruid != uid or euid != uid:
            raise PidError(
                f"process {pid} belongs to uid {ruid} (effective {euid}), not to you "
                f"(uid {uid}): scope self only traces your own processes"
            )
    except BaseException:
        handle.close()
        raise
    return handle
