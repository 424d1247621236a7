"""Per-user budget of the broker's CPU time spent loading programs.

Loading a program is mostly the kernel verifier's work, done in the broker's
thread (system time): 0.05-1 s of CPU for the larger catalog programs. The
map budget (budget.py) bounds the memory a loop of loads creates, not that
CPU: a user attaching to children that exit during the load, or varying a
knob so no warm instance fits, had the broker verify programs back to back
and slowed every other user's attach (issue 35 item 5).

So each load's CPU time (time.thread_time() around opening and loading:
user and system time of the loading thread, the verifier's included) is
charged to the caller's uid, whether the load or the attach after it
succeeds or not. A load is refused while the user's loads of the last
`window` seconds took `seconds` of CPU or more (load_cpu_seconds_per_user
per load_cpu_window_seconds), with the time until it fits again. One user's
loads also run one at a time, so she can keep at most one CPU verifying and
overshoots the budget by at most one load. Taking a warm instance or joining
a shared one loads nothing and costs nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class LoadLimits:
    seconds: float  # CPU seconds of loads per uid per window
    window: float  # seconds


class OverLoadBudget(Exception):
    """A load refused: the uid's loads took `used` CPU seconds in the window;
    retry_after: seconds until enough of them leave it."""

    def __init__(self, used: float, retry_after: float) -> None:
        super().__init__(f"{used:.1f} s of load CPU used")
        self.used = used
        self.retry_after = retry_after


class LoadBudget:
    """CPU seconds of recent loads per uid; thread-safe."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._lock = threading.Lock()
        self._loads: dict[int, list[tuple[float, float]]] = {}  # uid: [(at, cpu s)]
        self._serial: dict[int, threading.Lock] = {}  # one load at a time per uid

    def used(self, uid: int, window: float) -> float:
        """CPU seconds of uid's loads that ended in the last window."""
        with self._lock:
            return sum(cpu for _, cpu in self._recent(uid, self._clock(), window))

    @contextmanager
    def loading(self, uid: int, limits: LoadLimits) -> Iterator[None]:
        """Around one load for uid: waits for uid's load under way, raises
        OverLoadBudget if uid's recent loads used the budget, else charges the
        CPU time of the block, however it ends."""
        with self._lock:
            serial = self._serial.setdefault(uid, threading.Lock())
        with serial:
            self._check(uid, limits)
            start = self._cpu_clock()
            try:
                yield
            finally:
                spent = max(0.0, self._cpu_clock() - start)
                with self._lock:
                    self._loads.setdefault(uid, []).append((self._clock(), spent))

    def _check(self, uid: int, limits: LoadLimits) -> None:
        with self._lock:
            now = self._clock()
            recent = self._recent(uid, now, limits.window)
            used = sum(cpu for _, cpu in recent)
            if used < limits.seconds:
                return
            left = used
            for at, cpu in recent:  # oldest first
                left -= cpu
                if left < limits.seconds:
                    raise OverLoadBudget(used, max(0.0, at + limits.window - now))
            raise OverLoadBudget(used, 0.0)  # not reached: the loop ends below the limit

    def _recent(self, uid: int, now: float, window: float) -> list[tuple[float, float]]:
        """uid's loads in the window, oldest first; older ones dropped. Holds _lock."""
        q = [(at, cpu) for at, cpu in self._loads.get(uid, []) if now - at < window]
        if q:
            self._loads[uid] = q
        else:
            self._loads.pop(uid, None)
        return q
