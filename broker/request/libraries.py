"""The uprobe target of an attach: only ever a file the caller could open.

The broker runs as its own user and may see files its callers cannot. Were
it to open a path a caller chose, its answers ("not allowed" for a file
that exists, "No such file" for one that does not) would tell the caller
about directories they may not read. So the caller opens the library:

- over the Unix socket the client opens it and passes the fd (SCM_RIGHTS);
  from_fd() checks that the fd is a regular file that is still at the path
  it names, the path the policy then judges;
- gRPC cannot pass fds: open_as() resolves the path as the kernel would for
  the caller (uid and groups; mode bits and POSIX ACLs; symlinks followed)
  and opens it only where the caller could have. Every way of failing is
  the one exception Unreachable, so a missing file and a hidden one look
  alike.

Both return an fd the broker owns; the uprobe attaches through
/proc/self/fd/N of it, so the file checked is the file probed.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterable

MAXSYMLINKS = 40  # the kernel's limit on symlinks followed in one lookup
R_OK, X_OK = 4, 1
_ACL_XATTR = "system.posix_acl_access"
_ACL_VERSION = 2
_ACL_HEADER = struct.Struct("<I")
_ACL_ENTRY = struct.Struct("<HHI")  # tag, perm, id (linux/posix_acl_xattr.h)
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20

Acl = list[tuple[int, int, int]]


class Unreachable(Exception):
    """The caller could not have opened this path (missing, or hidden from them)."""


class LibraryError(Exception):
    """A file the caller can see, but which cannot be a uprobe target."""


def _acl(path: str) -> Acl | None:
    """The access ACL of path, or None when mode bits alone decide."""
    try:
        raw = os.getxattr(path, _ACL_XATTR, follow_symlinks=False)
    except OSError:  # ENODATA: no ACL; EOPNOTSUPP: none possible
        return None
    body = len(raw) - _ACL_HEADER.size
    if body < 0 or body % _ACL_ENTRY.size or _ACL_HEADER.unpack_from(raw)[0] != _ACL_VERSION:
        raise Unreachable  # an ACL we cannot read: assume it keeps the caller out
    return [_ACL_ENTRY.unpack_from(raw, off) for off in range(_ACL_HEADER.size, len(raw), 8)]


def permitted(
    st: os.stat_result, acl: Acl | None, uid: int, gids: frozenset[int], want: int
) -> bool:
    """Would the kernel's DAC check grant uid (with gids) the `want` bits on this inode?

    The POSIX.1e algorithm: owner, then named users, then every matching
    group (any one granting suffices), then other; the mask caps named
    users and groups. Root is granted everything here (reading and search).
    """
    if uid == 0:
        return True
    if acl is None:
        if uid == st.st_uid:
            bits = st.st_mode >> 6
        elif st.st_gid in gids:
            bits = st.st_mode >> 3
        else:
            bits = st.st_mode
        return bits & want == want
    if uid == st.st_uid:
        return any(t == _USER_OBJ and p & want == want for t, p, _ in acl)
    mask = next((p for t, p, _ in acl if t == _MASK), 7)
    named = [p for t, p, i in acl if t == _USER and i == uid]
    if named:
        return named[0] & mask & want == want
    groups = [
        p
        for t, p, i in acl
        if (t == _GROUP_OBJ and st.st_gid in gids) or (t == _GROUP and i in gids)
    ]
    if groups:
        return any(p & mask & want == want for p in groups)
    return any(t == _OTHER and p & want == want for t, p, _ in acl)


def _need(path: str, uid: int, gids: frozenset[int], want: int) -> os.stat_result:
    try:
        st = os.stat(path)
    except OSError:
        raise Unreachable from None
    if not permitted(st, _acl(path), uid, gids, want):
        raise Unreachable
    return st


def _parts(path: str) -> list[str]:
    return [c for c in path.split("/") if c and c != "."]


def resolve_as(path: str, uid: int, gids: Iterable[int]) -> tuple[str, os.stat_result]:
    """(real path, stat) of the regular file path names, looked up as uid/gids would.

    Each directory searched needs search permission for the caller, the
    file read permission; symlinks are followed as the kernel follows them.
    Raises Unreachable wherever the caller's own open would have failed.
    """
    who = frozenset(gids)
    if not path.startswith("/"):
        raise Unreachable
    pending = list(reversed(_parts(path)))
    cur = "/"
    links = 0
    while pending:
        name = pending.pop()
        _need(cur, uid, who, X_OK)  # searching cur for name
        if name == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, name)
        try:
            st = os.lstat(nxt)
        except OSError:
            raise Unreachable from None
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAXSYMLINKS:
                raise Unreachable
            try:
                target = os.readlink(nxt)
            except OSError:
                raise Unreachable from None
            if target.startswith("/"):
                cur = "/"
            pending.extend(reversed(_parts(target)))
            continue
        if pending and not stat.S_ISDIR(st.st_mode):
            raise Unreachable
        cur = nxt
    st = _need(cur, uid, who, R_OK)
    if not stat.S_ISREG(st.st_mode):
        raise Unreachable
    return cur, st


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def open_as(path: str, uid: int, gids: Iterable[int]) -> tuple[int, str]:
    """Open path for a caller who could open it themselves: (fd, real path).

    Unreachable when they could not (or the file changed while we looked);
    LibraryError when they could but the broker cannot read it.
    """
    real, st = resolve_as(path, uid, gids)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise Unreachable from None
    except OSError as e:
        raise LibraryError(f"the broker cannot read it ({e.strerror})") from None
    try:
        # What was checked is what is open: nothing was swapped in meanwhile.
        if not _same_file(os.fstat(fd), st) or os.readlink(f"/proc/self/fd/{fd}") != real:
            raise Unreachable
    except BaseException:
        os.close(fd)
        raise
    return fd, real


def from_fd(fd: int) -> str:
    """The real path of a library fd a client passed (they opened it: no oracle).

    The file must be regular and still be at the path /proc/self/fd names,
    so the policy's globs judge this very file (not a deleted or moved one).
    """
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise LibraryError("the passed fd is not a regular file")
    real = os.readlink(f"/proc/self/fd/{fd}")
    try:
        now = os.stat(real)
    except OSError:
        now = None
    if not real.startswith("/") or now is None or not _same_file(now, st):
        raise LibraryError(
            f"the file is no longer at {real} as the broker sees it (deleted, replaced, "
            "or outside the broker's view of the file system)"
        )
    return real


__all__ = ["LibraryError", "Unreachable", "from_fd", "open_as", "permitted", "resolve_as"]
