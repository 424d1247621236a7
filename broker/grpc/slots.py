"""Calls in flight per uid on the gRPC listener (policy [limits] grpc_calls_per_user).

CallSlots counts them: a caller over the limit is refused at once, so one
user's held calls cannot crowd out another's. CallSlot is one call's place,
given back when the call has ended and no thread still works for it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent import futures
from typing import Any

from gfxbpf.broker.access.peruser import PerUser


class CallSlots:
    """Calls in flight per uid. Thread-safe; every acquire() needs one release()."""

    def __init__(self) -> None:
        self._calls = PerUser()

    def acquire(self, uid: int, limit: int) -> bool:
        """Take a slot for uid unless it already has limit calls in flight."""
        return self._calls.take(uid, limit) is None

    def release(self, uid: int) -> None:
        self._calls.give_back(uid)

    def count(self, uid: int | None = None) -> int:
        """Calls in flight for uid (all uids when None)."""
        return self._calls.count(uid)


class CallSlot:
    """One call's place in CallSlots: released when the call has ended AND no
    thread still works for it (a client that hangs up mid-Attach does not free
    its slot while the attach still runs, so hanging up cannot pile work up)."""

    def __init__(self, slots: CallSlots, uid: int) -> None:
        self.slots = slots
        self.uid = uid
        self.jobs = 0
        self.ended = False
        self.released = False
        self.lock = threading.Lock()

    def submit(
        self, executor: futures.Executor, fn: Callable[..., Any], *args: Any
    ) -> asyncio.Future[Any]:
        """Run fn(*args) in executor for this call; await the result (never raises)."""
        with self.lock:
            self.jobs += 1
        try:
            job = executor.submit(fn, *args)
        except BaseException:  # shut down (the server stops): no job, no wait for one
            self._job_done(None)
            raise
        job.add_done_callback(self._job_done)  # also when cancelled before it ran
        return asyncio.wrap_future(job)

    def _job_done(self, _job: object) -> None:
        with self.lock:
            self.jobs -= 1
        self._maybe_release()

    def end(self) -> None:
        with self.lock:
            self.ended = True
        self._maybe_release()

    def _maybe_release(self) -> None:
        with self.lock:
            if self.released or not self.ended or self.jobs:
                return
            self.released = True
        self.slots.release(self.uid)


__all__ = ["CallSlot", "CallSlots"]
