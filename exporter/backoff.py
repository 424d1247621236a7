"""Exponential backoff, checked when a scrape arrives (there is no timer thread)."""

from __future__ import annotations

import time
from collections.abc import Callable

INITIAL = 1.0
MAXIMUM = 60.0


class Backoff:
    """ready() says whether another attempt may be made now; failed() pushes it out."""

    def __init__(
        self,
        initial: float = INITIAL,
        maximum: float = MAXIMUM,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.initial = initial
        self.maximum = maximum
        self.clock = clock
        self.delay = 0.0  # 0: the next attempt may be made at once
        self.next_at = 0.0
        self.failures = 0

    def ready(self) -> bool:
        return self.clock() >= self.next_at

    def failed(self) -> None:
        self.failures += 1
        self.delay = self.initial if self.delay == 0 else min(self.delay * 2, self.maximum)
        self.next_at = self.clock() + self.delay

    def reset(self) -> None:
        self.delay = 0.0
        self.next_at = 0.0
        self.failures = 0
