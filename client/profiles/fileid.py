"""Which file is this, and may it fill a cache: one answer for the client's caches.

A profile reads files other users control: the libraries mapped by the
processes it samples, /tmp/perf-PID.map. Three rules follow (issue 26):

- open without blocking and without following a final symlink, then look at
  what was opened (fstat on the fd), never at the path again: a FIFO or a
  device planted at the path is refused instead of hanging the client, and a
  file swapped after the check is not the one read;
- a cache entry is named by what the file says it is (a build-id, which any
  file can claim) AND by which file it is (FileId: device, inode, size,
  mtime, ctime), so a file that borrows another's build-id never shares its
  entry;
- only files owned by the caller or by root fill the caller's caches: another
  user could rewrite theirs in place, keeping the identity.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

__all__ = ["FileId", "cache_key", "may_cache", "open_regular", "open_regular_path"]


@dataclass(frozen=True)
class FileId:
    """A file's identity while it is unchanged. The inode is unique on its
    device while the file exists; size, mtime and ctime change when its
    content does (ctime cannot be set by the owner, mtime can)."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileId:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def text(self) -> str:
        """For a file name: hex fields joined by '-'."""
        fields = (self.dev, self.ino, self.size, self.mtime_ns, self.ctime_ns)
        return "-".join(f"{v:x}" for v in fields)


def cache_key(build_id: str | None, st: os.stat_result) -> str:
    """A cache file name: the build-id (if any) and the file's identity."""
    return f"{build_id or 'noid'}-{FileId.of(st).text()}"


def may_cache(st: os.stat_result) -> bool:
    """Whether what was read from this file may be kept in the caller's caches."""
    return st.st_uid in (os.getuid(), 0)


def open_regular(
    path: str, *, owners: tuple[int, ...] | None = None, max_size: int | None = None
) -> tuple[int, os.stat_result]:
    """(fd, its fstat) of a regular file opened read-only, O_NONBLOCK and
    O_NOFOLLOW (and O_NOCTTY: a terminal planted there must not become ours);
    the caller closes fd. Raises OSError (with a reason) for a path that is
    not a regular file, is owned by none of owners, or is larger than
    max_size bytes."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        if owners is not None and st.st_uid not in owners:
            raise OSError(f"{path} is owned by uid {st.st_uid}, not by {owners}")
        if max_size is not None and st.st_size > max_size:
            raise OSError(f"{path} is larger than {max_size} bytes")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def open_regular_path(fd: int) -> str:
    """A path that opens the very file fd refers to (for readers that take a
    path): what is read there is what was checked, whatever the old path holds now."""
    return f"/proc/self/fd/{fd}"
