"""What this kernel offers clients, for HelloReply.Features and StatsReply."""

from __future__ import annotations

import os
import re

# Before 5.19, with unprivileged_bpf_disabled set, a process without
# capabilities cannot use bpf(2) even on a map fd it was handed.
DIRECT_MAP_READS_SINCE = (5, 19)
_BPF_STATS = "/proc/sys/kernel/bpf_stats_enabled"


def kernel_version(release: str) -> tuple[int, int] | None:
    """(major, minor) of a uname release such as "6.18.44-fc"; None if unreadable."""
    m = re.match(r"(\d+)\.(\d+)", release)
    return (int(m.group(1)), int(m.group(2))) if m else None


def direct_map_reads(release: str | None = None) -> bool:
    """Whether a client may read the maps whose fds it is handed."""
    version = kernel_version(os.uname().release if release is None else release)
    return version is not None and version >= DIRECT_MAP_READS_SINCE


def bpf_stats_enabled() -> bool:
    """Whether the kernel counts program run time (sysctl kernel.bpf_stats_enabled)."""
    try:
        with open(_BPF_STATS) as f:
            return f.read().strip() == "1"
    except OSError:
        return False
