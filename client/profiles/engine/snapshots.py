"""/proc/PID/maps of the profiled processes, captured while they live: the
symbolizer names their frames from these, the unwinder finds their files."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING

from gfxbpf.client.profiles.procmaps import capture, snapshot_state

if TYPE_CHECKING:
    from gfxbpf.client.profiles.procmaps import ProcessMaps, SnapshotState
    from gfxbpf.client.profiles.symbolize import Symbolizer

REFRESH_S = 0.02  # least time between two snapshots of one process asked by the unwinder
WATCH_S = 0.05  # how often the watcher thread reads the targets' maps ...
STALL_S = 0.5  # ... once the sampling loop has not for this long (it polls every 50-250 ms)
WATCH_KEPT = 64  # snapshots a process may have waiting (a JIT remaps all the time)


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
        self.taken: dict[int, float] = {}  # pid -> when that state was read
        # The watcher thread's: the pids it reads (a tuple, replaced whole), and
        # per pid the (time read, state) it saw change, for capture() to apply.
        self.watched: tuple[int, ...] = ()
        self.polled_at = 0.0  # when the sampling loop last captured them itself
        self._waiting: dict[int, deque[tuple[float, SnapshotState]]] = {}
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def capture(self, pids: list[int] | set[int]) -> None:
        for pid in pids:
            waiting = self._waiting.get(pid)
            while waiting:  # what the watcher read since, oldest first
                self._apply(pid, *waiting.popleft())
            read_at = time.monotonic()
            state = snapshot_state(pid)
            if state is not None:
                self._apply(pid, read_at, state)

    def _apply(self, pid: int, read_at: float, state: SnapshotState) -> None:
        if state == self.states.get(pid) or read_at < self.taken.get(pid, 0.0):
            return  # the last snapshot again, or one older than it
        maps = capture(pid, text=state[0])
        if maps is not None and maps.mappings:  # a zombie has none
            self.states[pid], self.taken[pid] = state, read_at
            self.procs.setdefault(pid, maps)
            self.symbolizer.add_process(pid, maps)
            self.seen.add(pid)
            if state[2]:  # the command name, read with the maps (gone by now, maybe)
                self.comms[pid] = state[2]

    def process(self, pid: int, refresh: bool = False) -> ProcessMaps | None:
        """The process's maps, captured now if never seen (scope-wide runs) or if
        refresh: a sample from code mapped since the last snapshot (a library the
        loader just mapped), at most every REFRESH_S per process."""
        now = time.monotonic()
        if pid not in self.procs or (refresh and now - self.refreshed.get(pid, 0) >= REFRESH_S):
            self.refreshed[pid] = now
            self.capture([pid])
        return self.procs.get(pid)

    def poll(self, pids: list[int]) -> None:
        """The sampling loop's capture of the targets: the watcher thread reads
        them only while the loop has not done so for STALL_S."""
        self.watched = tuple(pids)
        self.polled_at = time.monotonic()
        self.capture(pids)

    def watch(self) -> None:
        """Read the watched processes' maps on a thread of its own while the
        profile runs. The sampling loop captures them too, but it can be held
        up for seconds (a large file's first unwind tables on a slow or loaded
        machine): a process that exits meanwhile was left with its snapshot from
        before its loader mapped libc, and every stack stopped there. The
        thread reads only while the loop has not polled for STALL_S, and only
        /proc; capture() applies what it read, in order."""
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="gfxbpf-maps", daemon=True)
            self._watcher.start()

    def stop_watching(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join()

    def _watch(self) -> None:
        last: dict[int, SnapshotState] = {}
        while not self._stop.wait(WATCH_S):
            if time.monotonic() - self.polled_at < STALL_S:
                continue  # the loop keeps up: no second read of each process
            for pid in self.watched:
                read_at = time.monotonic()
                state = snapshot_state(pid)
                if state is None or not state[0] or state == last.get(pid):
                    continue  # gone, a zombie (no maps left), or unchanged
                last[pid] = state
                if pid not in self._waiting:
                    self._waiting[pid] = deque(maxlen=WATCH_KEPT)
                self._waiting[pid].append((read_at, state))
