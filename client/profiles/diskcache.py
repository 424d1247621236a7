"""The client's one disk cache: a folder of flat files named by key, for the
symbol tables (symtab.py) and the unwind tables (unwind/cache.py).

What is loaded steers what a profile shows (names, unwind rules), so a file
is used only from a folder that is the caller's and that nobody else may
write in, and only if the file is the caller's own, opened without blocking
and without following a final symlink (another user who could write the
folder, or plant a link in it, could name libz's frames with hers; issue 35
item 11). Writes are atomic (a rename), so concurrent profiles never read
half a file, and the folder is pruned to a size, least recently used first.
"""

from __future__ import annotations

import os
import stat
import tempfile

__all__ = ["CACHE_LIMIT", "default_dir", "load", "private_dir", "prune", "store"]

# The most a folder keeps (libLLVM's symbol table is 3 MB, its unwind table 6 MB).
CACHE_LIMIT = 1 << 30


def default_dir(kind: str) -> str:
    """$XDG_CACHE_HOME/gfxbpf/KIND, else ~/.cache/gfxbpf/KIND."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gfxbpf", kind)


def private_dir(folder: str) -> bool:
    """The folder is the caller's, no symlink, and nobody else may write in it."""
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode)
        and st.st_uid == os.getuid()
        and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def load(folder: str, key: str) -> bytes | None:
    """The bytes stored under key, or None (missing, or not safely the caller's)."""
    if not private_dir(folder):
        return None
    path = os.path.join(folder, key)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size > CACHE_LIMIT:
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read()
        os.utime(fd)  # recently used: pruned last
        return data
    except OSError:
        return None
    finally:
        os.close(fd)


def store(folder: str, key: str, data: bytes, limit: int = CACHE_LIMIT) -> None:
    """Write data under key. A cache that cannot be written only costs a
    parse next time: nothing is raised."""
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        if not private_dir(folder):
            return
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, os.path.join(folder, key))
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return
    prune(folder, limit)


def prune(folder: str, limit: int = CACHE_LIMIT) -> None:
    """Remove the least recently used files until the folder holds at most limit bytes."""
    try:
        entries = []
        with os.scandir(folder) as it:
            for e in it:
                if e.is_file(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    entries.append((st.st_mtime_ns, st.st_size, e.path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= limit:
                break
            os.unlink(path)
            total -= size
    except OSError:
        pass
