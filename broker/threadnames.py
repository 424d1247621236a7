"""Names of the broker's pool threads, as the kernel shows them (comm).

Python 3.11 names threads for itself only, so every thread reads as
`gfxbpf-broker` in /proc and `top -H`. The gRPC pools name theirs: pool
threads are created on demand up to a bound and then kept, unlike a Unix
session's thread, which ends with its connection; a count of threads can
only tell a leak from a grown pool when the two differ by name.
"""

from __future__ import annotations

import prctl


def name_this_thread(name: str) -> None:
    """Set the calling thread's comm (the kernel keeps 15 bytes)."""
    prctl.set_name(name[:15])
