"""Shared program instances, reference-counted.

Identical requests (same object hash, scope, uid for scope self, pid,
library and functions) share one kernel instance: a hundred users watching
the same system-scope program cost the traced workload what one does. The
instance is closed when the last attachment releases it, or, if a request
has it pinned then (pin()), when that request is done: a revoke during a
reload must never close an fd a request is about to read or send, since the
kernel may hand its number to another user's map meanwhile.

Creation happens under a per-key lock, not the registry lock, so loads of
different programs run concurrently while two identical requests still end
up sharing one instance.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar


class Closable(Protocol):
    def close(self) -> None: ...


T = TypeVar("T", bound=Closable)


@dataclass(frozen=True)
class InstanceKey:
    sha256: str
    scope: str
    uid: int | None  # the caller's uid for scope self, None for system
    pid: int | None
    library: str | None  # real path of the uprobe target
    functions: tuple[str, ...]
    unique: int | None = None  # set for programs that are never shared (ring buffers)
    frequency: int | None = None  # perf_event sampling, Hz
    children: bool = False  # the pid's descendants too (a process tree)
    job: Hashable | None = None  # scope job: the job's cgroup (request/slurmjob.JobCgroup)


class _Slot(Generic[T]):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.value: T | None = None
        self.refs = 0
        self.dead = False
        self.busy = 0  # pins held by requests (Registry.pin)
        self.closing: T | None = None  # released while busy: the last request closes it


class Gone(Exception):
    """The instance was released (detached, revoked) before the request used it."""


class Pin(Generic[T]):
    """A request's hold on an instance (Registry.pin); let go at the end of its with-block."""

    def __init__(self, slot: _Slot[T]) -> None:
        self._slot: _Slot[T] | None = slot

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        slot, self._slot = self._slot, None
        if slot is None:
            return
        with slot.lock:
            slot.busy -= 1
            closing = None
            if not slot.busy:
                closing, slot.closing = slot.closing, None
        if closing is not None:
            closing.close()


class Registry(Generic[T]):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[Hashable, _Slot[T]] = {}

    def acquire(self, key: Hashable, create: Callable[[], T]) -> tuple[T, bool]:
        """(instance, joined): join the live instance for key, or create() it.

        create() runs under the key's lock; if it raises, nothing is kept.
        """
        while True:
            with self._lock:
                slot = self._slots.get(key)
                if slot is None:
                    slot = _Slot()
                    self._slots[key] = slot
            with slot.lock:
                if slot.dead:
                    continue  # released (or failed) meanwhile: start over
                if slot.value is not None:
                    slot.refs += 1
                    return slot.value, True
                try:
                    slot.value = create()
                except BaseException:
                    slot.dead = True
                    self._forget(key, slot)
                    raise
                slot.refs = 1
                return slot.value, False

    def release(self, key: Hashable, value: T) -> bool:
        """Drop one reference; close the instance when it was the last. True if closed."""
        with self._lock:
            slot = self._slots.get(key)
        if slot is None:
            raise KeyError(f"no instance for {key!r}")
        with slot.lock:
            if slot.value is not value:
                raise KeyError(f"instance for {key!r} is not the one released")
            slot.refs -= 1
            if slot.refs > 0:
                return False
            slot.value = None
            slot.dead = True
            self._forget(key, slot)
            if slot.busy:
                slot.closing = value
            else:
                value.close()
            return True

    def pin(self, key: Hashable, value: T) -> Pin[T]:
        """Keep value open while the returned Pin is held (with-block): its fds
        stay valid. Gone now if value was released already; a release
        meanwhile closes it when the last pin is let go."""
        with self._lock:
            slot = self._slots.get(key)
        if slot is None:
            raise Gone(key)
        with slot.lock:
            if slot.value is not value:
                raise Gone(key)
            slot.busy += 1
        return Pin(slot)

    def refs(self, key: Hashable) -> int:
        with self._lock:
            slot = self._slots.get(key)
        return 0 if slot is None else slot.refs

    def __len__(self) -> int:
        with self._lock:
            return sum(1 for s in self._slots.values() if s.value is not None)

    def _forget(self, key: Hashable, slot: _Slot[T]) -> None:
        with self._lock:
            if self._slots.get(key) is slot:
                del self._slots[key]
