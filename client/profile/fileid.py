"""A file's content identity for cache keys: device, inode, size and mtime.

A build-id alone names what a file should contain, not what it does: anyone
can write a file carrying a system library's build-id. A cached table is
therefore keyed by the build-id and this identity, so it is used again only
for the very file it was built from (an upgrade or a rewrite changes mtime,
size or inode).
"""

from __future__ import annotations

import os

__all__ = ["file_identity", "trusted_owner"]


def file_identity(st: os.stat_result) -> str:
    """device-inode-size-mtime_ns, hex: stable while the file is unchanged."""
    return f"{st.st_dev:x}-{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"


def trusted_owner(st: os.stat_result) -> bool:
    """Whether what is read from this file may go into the caller's on-disk
    caches: root's files (system libraries) and the caller's own. A file of
    a third user may change under the same name at any time."""
    return st.st_uid in (0, os.getuid())
