"""Snapshots of /proc/PID/maps and of the process's perf map file.

Taken while the process lives, so that stacks of a process that exited during
the profile still resolve. The perf map (/tmp/perf-PID.map, written by JITs
and by Python 3.12+ with -X perf) is read at capture time: it is deleted by
some runtimes when they exit.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass, field

from gfxbpf.client.profiles.fileid import open_regular

__all__ = [
    "Mapping",
    "PerfMapEntry",
    "ProcessMaps",
    "SnapshotState",
    "capture",
    "mapped_files",
    "parse_maps",
    "parse_perf_map",
    "snapshot_state",
]

PERF_MAP_DIR = "/tmp"
# A perf map larger than this is not read (a runaway JIT must not eat the client).
_PERF_MAP_LIMIT = 256 << 20


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    perms: str  # "r-xp"
    offset: int  # file offset of start
    dev: str  # "fd:01" (major:minor, hex)
    inode: int
    path: str  # "" for anonymous; "[heap]", "[vdso]" for special ones

    @property
    def is_file(self) -> bool:
        return self.inode != 0 and self.path.startswith("/")

    @property
    def file_path(self) -> str:
        """The path without the kernel's " (deleted)" suffix."""
        return self.path.removesuffix(" (deleted)")

    @property
    def executable(self) -> bool:
        return "x" in self.perms


@dataclass(frozen=True)
class PerfMapEntry:
    start: int
    size: int
    name: str


@dataclass
class ProcessMaps:
    pid: int
    mappings: list[Mapping]  # sorted by start
    perf_map: list[PerfMapEntry] = field(default_factory=list)  # sorted by start
    perf_map_path: str | None = None  # where perf_map was read from, if it existed
    comm: str = ""  # /proc/PID/comm at capture
    # "/proc/PID/root" when the process sees another mount namespace (a container):
    # its paths are read through it; "" when the paths mean the same to us.
    root: str = ""
    # What /proc/PID/root points to, as the kernel writes it to us (with root).
    root_link: str = ""

    def __post_init__(self) -> None:
        self._index()
        self._local: dict[tuple[str, int], str] = {}

    def local_path(self, m: Mapping) -> str:
        """Where we open m's file. Through root when there is one. A chrooted
        process in a mount namespace of its own has its namespace's paths, and
        /proc/PID/root is the chroot: then its root's path is cut off the front
        (it is the same prefix), or, where we see that namespace's files at the
        same paths, our own path holds the mapped inode."""
        key = (m.file_path, m.inode)
        found = self._local.get(key)
        if found is None:
            found = self._local[key] = _where_mapped(self.root, self.root_link, m)
        return found

    def _index(self) -> None:
        self._starts = [m.start for m in self.mappings]
        self._perf_starts = [e.start for e in self.perf_map]

    def find(self, addr: int) -> Mapping | None:
        i = bisect.bisect_right(self._starts, addr) - 1
        if i >= 0 and addr < self.mappings[i].end:
            return self.mappings[i]
        return None

    def find_perf(self, addr: int) -> PerfMapEntry | None:
        i = bisect.bisect_right(self._perf_starts, addr) - 1
        if i >= 0 and addr < self.perf_map[i].start + max(self.perf_map[i].size, 1):
            return self.perf_map[i]
        return None

    def merge(self, later: ProcessMaps) -> bool:
        """Add what a later snapshot of the same process saw (new libraries, new JIT code).
        An earlier mapping that a later one overlaps is dropped: it was unmapped
        or replaced in between (an exec, a library mapped where another was), and
        find() needs ranges that do not overlap. One the later snapshot does not
        overlap is kept (a library unloaded since: older samples still name it).
        True if anything changed."""
        starts = [m.start for m in later.mappings]  # sorted, as parse_maps gives them
        kept = {
            (m.start, m.end): m for m in self.mappings if not _overlaps(later.mappings, starts, m)
        }
        kept.update({(m.start, m.end): m for m in later.mappings})
        mappings = sorted(kept.values(), key=lambda m: m.start)
        perf = {(e.start, e.size): e for e in self.perf_map}
        perf.update({(e.start, e.size): e for e in later.perf_map})
        perf_map = sorted(perf.values(), key=lambda e: e.start)
        self.comm = later.comm or self.comm
        path = later.perf_map_path or self.perf_map_path
        if (mappings, perf_map, path) == (self.mappings, self.perf_map, self.perf_map_path):
            return False  # the usual case, several times a second: keep the names found
        self.mappings, self.perf_map, self.perf_map_path = mappings, perf_map, path
        self._index()
        return True


def _overlaps(mappings: list[Mapping], starts: list[int], m: Mapping) -> bool:
    """Whether m overlaps one of mappings (sorted, not overlapping; starts: theirs)."""
    i = bisect.bisect_left(starts, m.end) - 1  # the last one starting below m's end
    return i >= 0 and mappings[i].end > m.start


def parse_maps(text: str) -> list[Mapping]:
    """The lines of /proc/PID/maps, sorted by start; malformed lines are skipped."""
    out = []
    for line in text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 5:
            continue
        try:
            lo, hi = (int(x, 16) for x in parts[0].split("-", 1))
            out.append(
                Mapping(
                    start=lo,
                    end=hi,
                    perms=parts[1],
                    offset=int(parts[2], 16),
                    dev=parts[3],
                    inode=int(parts[4]),
                    path=parts[5].strip() if len(parts) > 5 else "",
                )
            )
        except ValueError:
            continue
    out.sort(key=lambda m: m.start)
    return out


def parse_perf_map(text: str) -> list[PerfMapEntry]:
    """Lines `START SIZE name` (hex, with or without 0x), sorted by start."""
    out = []
    for line in text.splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) < 3:
            continue
        try:
            out.append(PerfMapEntry(int(parts[0], 16), int(parts[1], 16), parts[2].strip()))
        except ValueError:
            continue
    out.sort(key=lambda e: e.start)
    return out


def _read_perf_map(pid: int, directory: str) -> tuple[list[PerfMapEntry], str | None]:
    path = os.path.join(directory, f"perf-{pid}.map")
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
        # Anyone can create /tmp/perf-PID.map first: only a regular file of the
        # process's user is read (a FIFO would block us forever, a symlink could
        # point anywhere, another user's file would plant names for the pid).
        fd, st = open_regular(path, owners=(owner,), max_size=_PERF_MAP_LIMIT)
        with open(fd, encoding="utf-8", errors="replace") as f:
            # Runtimes leave their maps behind: one older than the process is
            # from an earlier process that had the same pid.
            started = _start_time(pid)
            if started is not None and st.st_mtime < started - 1:
                return [], None
            return parse_perf_map(f.read(_PERF_MAP_LIMIT)), path
    except OSError:
        return [], None


def _start_time(pid: int) -> float | None:
    """When the process started (Unix time), from /proc/PID/stat and the boot time."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            # Field 22 counts clock ticks since boot; the name (field 2) may hold spaces.
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat", encoding="utf-8") as f:
            btime = next(int(ln.split()[1]) for ln in f if ln.startswith("btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


# What a snapshot would be taken from: the maps text, the perf map file's
# (size, mtime_ns) or None, the command name and the mount namespace.
SnapshotState = tuple[str, tuple[int, int] | None, str, str]


def mapped_files(pid: int) -> list[str]:
    """The paths of the files the process maps (none when it is gone or not
    readable by the caller)."""
    text = _maps_text(pid)
    return [] if text is None else [m.file_path for m in parse_maps(text) if m.is_file]


def _maps_text(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def snapshot_state(pid: int, perf_map_dir: str = PERF_MAP_DIR) -> SnapshotState | None:
    """What capture() reads, less the parsing (a tenth of its cost): equal states
    give equal snapshots, so a caller polling a process skips unchanged ones.
    None if the process is gone or its maps unreadable."""
    text = _maps_text(pid)
    if text is None:
        return None
    try:
        st = os.stat(os.path.join(perf_map_dir, f"perf-{pid}.map"))
        perf: tuple[int, int] | None = (st.st_size, st.st_mtime_ns)
    except OSError:
        perf = None
    return text, perf, _read_comm(pid), _readlink(f"/proc/{pid}/ns/mnt")


def capture(
    pid: int, perf_map_dir: str = PERF_MAP_DIR, text: str | None = None
) -> ProcessMaps | None:
    """A snapshot of the process's mappings (+ perf map), or None if it is gone
    or not readable by the caller. text: its maps text, if just read."""
    if text is None and (text := _maps_text(pid)) is None:
        return None
    perf, perf_path = _read_perf_map(pid, perf_map_dir)
    return ProcessMaps(
        pid=pid,
        mappings=parse_maps(text),
        perf_map=perf,
        perf_map_path=perf_path,
        comm=_read_comm(pid),
        root=(root := _root_of(pid)),
        root_link=_readlink(root) if root else "",
    )


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def _where_mapped(root: str, link: str, m: Mapping) -> str:
    theirs = root + m.file_path
    if not root or _stat_ids(theirs)[1] == m.inode:
        return theirs
    if link not in ("", "/") and m.file_path.startswith(link + "/"):
        inside = root + m.file_path[len(link) :]
        if _stat_ids(inside)[1] == m.inode:
            return inside
    # Our path only if it is the mapped file itself: same device, same inode.
    return m.file_path if _stat_ids(m.file_path) == (m.dev, m.inode) else theirs


def _stat_ids(path: str) -> tuple[str, int]:
    """(device as maps writes it, "fe:01"; inode) of path, ("", 0) if it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return "", 0
    return f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}", st.st_ino


def _read_comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def _root_of(pid: int) -> str:
    """/proc/PID/root if the process is in another mount namespace, else ""."""
    try:
        if os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt"):
            return f"/proc/{pid}/root"
    except OSError:
        pass
    return ""
