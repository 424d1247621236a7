"""What this kernel offers clients, for HelloReply.Features and StatsReply."""

from __future__ import annotations

import os
import re
import stat

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


_UNPRIV_BPF = "/proc/sys/kernel/unprivileged_bpf_disabled"


def unprivileged_bpf_disabled() -> int | None:
    """The sysctl kernel.unprivileged_bpf_disabled (0, 1 or 2), None if unreadable.

    At 0 any user may load socket filters, and such a program may write a
    map whose fd its user holds even when the map is frozen (freezing only
    stops bpf(2) writes). The broker then must not hand out fds of maps
    another user reads (broker/attachments.py, instance_uid).
    """
    try:
        with open(_UNPRIV_BPF) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def unprivileged_bpf_allowed() -> bool:
    """Whether users without capabilities may load BPF programs now."""
    return unprivileged_bpf_disabled() == 0


_MOUNTS = "/proc/self/mounts"
BPFFS = "/sys/fs/bpf"


def open_bpffs() -> list[tuple[str, int]]:
    """(mount point, mode) of each bpffs any user may create files in (mode
    1777, as some distributions mount /sys/fs/bpf and a plain `mount -t bpf`
    does): there users pin the maps they are given, which then outlive their
    sessions and the broker. Mounts hidden from the broker are not seen."""
    points = {BPFFS}
    try:
        with open(_MOUNTS) as f:
            points.update(line.split()[1] for line in f if line.split()[2:3] == ["bpf"])
    except OSError:
        pass
    out = []
    for point in sorted(points):
        try:
            st = os.stat(point)
        except OSError:
            continue
        if os.path.ismount(point) and st.st_mode & stat.S_IWOTH:
            out.append((point, stat.S_IMODE(st.st_mode)))
    return out
