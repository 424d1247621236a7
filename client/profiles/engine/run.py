"""One profile being taken: its attachments, targets, readers and progress."""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from gfxbpf.client import family
from gfxbpf.client.profiles import read as profile_read

if TYPE_CHECKING:
    from gfxbpf.client.handle import Attachment
    from gfxbpf.client.profiles.copies import CopyReader, ProbeCopyReader
    from gfxbpf.client.profiles.engine.child import Child
    from gfxbpf.client.profiles.engine.request import ProfileRequest
    from gfxbpf.client.profiles.engine.snapshots import Maps
    from gfxbpf.client.profiles.python.targets import Interpreters

    Copies = CopyReader | ProbeCopyReader


class Stopper(Protocol):
    """A flag set by Ctrl-C, and a wait that it ends (client/cli/stopping.py's StopSignal)."""

    stopped: bool

    def wait(self, timeout: float) -> bool: ...


@dataclass
class Run:
    """One profile being taken: its attachment, targets and progress."""

    req: ProfileRequest
    att: Attachment
    maps: Maps
    child: Child | None
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    ticked: float = 0.0  # when tick() last ran
    samples: int = 0
    processes: list[int] = field(default_factory=list)  # tgids the profile holds
    seen: list[tuple[int, str, int]] = field(default_factory=list)  # (pid, comm, weight)
    family: set[int] = field(default_factory=set)  # the targets' descendants seen in /proc
    kernel_tree: bool = False  # the kernel follows the target's tree: keep every row
    # Stack id -> user addresses, read while sampling: an id keeps its stack for
    # the table's life (no BPF_F_REUSE_STACKID), so after it only new ids are read.
    stacks: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # Programs stackcopy, ustackcopy, offcpu: records unwound as they are read (no stack table).
    copies: Copies | None = None
    # --wall: the offcpu attachment beside the sampling one, and its reader.
    waits_att: Attachment | None = None
    waits: CopyReader | None = None
    # The CPython executables sent for the kernel to walk (and those it cannot).
    pythons: Interpreters | None = None
    python_summary: dict[str, Any] | None = None
    py_counts: dict[str, int] = field(default_factory=dict)  # the program's py_counts
    memory: dict[str, int] | None = None  # --memory: memstacks' sums (stacks.totals)
    notes: list[str] = field(default_factory=list)  # for the profile, from collecting
    # (lost, py_counts) when attached (sampling.counters): reported as differences
    counters_at_attach: tuple[int, dict[str, int]] = (0, {})

    @property
    def wait_reader(self) -> Copies | None:
        """What read the waits: --wall's offcpu reader, or an off-CPU profile's copies."""
        from gfxbpf.client.profiles.engine.request import OFF_CPU

        if self.waits is not None:
            return self.waits
        return self.copies if self.req.mode == OFF_CPU else None

    @property
    def targets(self) -> list[int]:
        return [self.child.pid] if self.child else self.req.pids

    def kept(self) -> list[int]:
        """The processes whose rows to keep (empty: all the kernel counted)."""
        if self.kernel_tree or not self.targets:
            return []
        return self.targets + sorted(self.family)

    @property
    def counts_map(self) -> str:
        return "calls" if self.req.probes else "counts"

    def elapsed(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def done(self, duration: float | None) -> bool:
        if duration is not None and self.elapsed() >= duration:
            return True
        if self.child is not None:
            return self.child.poll()
        # Explicit pids: stop when none is left running.
        return bool(self.req.pids) and not any(running(p) for p in self.req.pids)

    def tick(self, read: bool, progress: bool) -> None:
        """Capture the targets' maps; every so often read what came in so far
        (through the broker, as over gRPC, only to show progress or find pids)."""
        if self.targets:
            if self.req.children:
                self.family |= family.descendants(self.targets)
            self.maps.poll(self.targets + sorted(self.family))
        if self.copies is not None:
            from gfxbpf.client.profiles.copies import CopyReader  # imported by copy_reader

            if isinstance(self.copies, CopyReader):
                self.copies.wanted = set(self.kept())  # several --pid: their families too
            self.copies.drain()
            self.samples = self.copies.records
            if self.waits is not None:
                self.waits.wanted = set(self.kept())
                self.waits.drain()
                self.samples += self.waits.records
            return
        direct = self.att.map(self.counts_map).fd is not None
        if read and (direct or progress or not self.targets):
            entries = self.att.map(self.counts_map).raw_items()
            self.samples = _total(entries, self.req.probes)
            if not self.targets or self.req.children:  # name whatever was sampled
                pids = {TGID.unpack_from(k)[0] for k, _ in entries}  # first in both keys
                self.maps.capture(pids - self.maps.seen)
            self.read_stacks(entries, warm=True)

    def read_stacks(self, entries: list[tuple[bytes, Any]], warm: bool = False) -> None:
        """The stacks these entries name that were not read yet; warm: name
        their frames now too (sampling only: probes' stacks are rearranged)."""
        ids = profile_read.stack_ids(entries, self.req.probes) - self.stacks.keys()
        if not ids:
            return
        stacks = self.att.map("stacks")
        # Through the fd, only the stacks the counts name (no walk of the table).
        found = stacks.lookup_many(struct.pack("<I", i) for i in sorted(ids))
        if found is None and warm:
            return  # read through the broker: the whole table, so once, at the end
        new = profile_read.stack_table(stacks.raw_items() if found is None else found)
        self.stacks.update(new)
        if warm and not self.req.probes:
            by_pid: dict[int, list[tuple[int, ...]]] = {}
            for key, _ in entries:
                tgid, sid = profile_read.SAMPLE_KEY.unpack(key)[:2]
                if sid in new:
                    by_pid.setdefault(tgid, []).append(new[sid])
            for pid, user in by_pid.items():
                self.maps.symbolizer.warm(pid, user)


TGID = struct.Struct("<I")


def running(pid: int) -> bool:
    """The process exists and has not exited (a zombie waits for its parent)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rpartition(b")")[2].split()[:1]
    except OSError:
        return False
    return state not in ([b"Z"], [b"X"])


def _total(entries: list[tuple[bytes, Any]], probes: bool) -> int:
    if probes:
        return sum(profile_read.CALL_STATS.unpack(v)[0] for _, v in entries)
    return sum(profile_read.U64.unpack(v)[0] for _, v in entries)
