"""Stopping a gfxclient command cleanly: a stop signal sets a flag instead of
raising, so the terminal and the session are left in order.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
from typing import Any


class StopSignal:
    """SIGINT/SIGTERM/SIGHUP set a flag (and wake wait()) instead of raising.

    Nothing is interrupted half-way (a frame, a reply), so the terminal and
    the session are left in order; a second Ctrl-C raises KeyboardInterrupt.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.stopped = False
        self.signum: int | None = None
        self._old: dict[int, Any] = {}
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def _handler(self, signum: int, frame: object) -> None:
        if self.stopped and signum == signal.SIGINT:
            # A second Ctrl-C: the user insists (e.g. a broker that does not
            # answer); give up now. Callers' finally blocks still restore the
            # terminal, and the kernel closes the session with the process.
            raise KeyboardInterrupt
        self.stopped = True
        self.signum = signum
        with contextlib.suppress(OSError):
            os.write(self._w, b"x")

    def install(self) -> None:
        for sig in self.SIGNALS:
            try:
                self._old[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread: Ctrl-C stays KeyboardInterrupt
                return

    def restore(self) -> None:
        for sig, old in self._old.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, old)
        self._old.clear()
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._r = self._w = -1

    def wait(self, timeout: float) -> bool:
        """Sleep up to timeout seconds; True (early) when a stop signal came."""
        if self.stopped:
            return True
        if timeout > 0:
            with contextlib.suppress(InterruptedError, OSError, ValueError):
                select.select([self._r], [], [], timeout)
        return self.stopped

    def __enter__(self) -> StopSignal:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()
