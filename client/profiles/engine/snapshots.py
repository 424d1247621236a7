"""/proc/PID/maps of the profiled processes, captured while they live: the
symbolizer names their frames from these, the unwinder finds their files."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

from gfxbpf.client.profiles.procmaps import capture, snapshot_state

if TYPE_CHECKING:
    from gfxbpf.client.profiles.procmaps import ProcessMaps, SnapshotState
    from gfxbpf.client.profiles.symbolize import Symbolizer

REFRESH_S = 0.02  # least time between two snapshots of one process asked by the unwinder


class Maps:
    """/proc/PID/maps of each process, captured while it lives, fed to the symbolizer."""

    def __init__(self, symbolizer: Symbolizer) -> None:
        self.symbolizer = symbolizer
        self.seen: set[int] = set()
        self.comms: dict[int, str] = {}  # command names (probes' keys carry none)
        # The first snapshot of each process: the symbolizer merges later ones
        # into it, so it is the whole picture the unwinder should see too.
        self.procs: dict[int, ProcessMaps] = {}
        self.refreshed: dict[int, float] = {}  # pid -> when process() last captured it
        self.states: dict[int, SnapshotState] = {}  # pid -> what its last snapshot was taken from

    def capture(self, pids: list[int] | set[int]) -> None:
        for pid in pids:
            state = snapshot_state(pid)
            if state is None or state == self.states.get(pid):
                continue  # gone, or the snapshot would be the last one again
            maps = capture(pid, text=state[0])
            if maps is not None and maps.mappings:  # a zombie has none
                self.states[pid] = state
                self.procs.setdefault(pid, maps)
                self.symbolizer.add_process(pid, maps)
                self.seen.add(pid)
                with contextlib.suppress(OSError):
                    with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
                        self.comms[pid] = f.read().strip()

    def process(self, pid: int, refresh: bool = False) -> ProcessMaps | None:
        """The process's maps, captured now if never seen (scope-wide runs) or if
        refresh: a sample from code mapped since the last snapshot (a library the
        loader just mapped), at most every REFRESH_S per process."""
        now = time.monotonic()
        if pid not in self.procs or (refresh and now - self.refreshed.get(pid, 0) >= REFRESH_S):
            self.refreshed[pid] = now
            self.capture([pid])
        return self.procs.get(pid)
