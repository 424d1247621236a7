"""Stopping a child process: ask with a signal, wait, then SIGKILL.

The one copy for the benchmarks and the test harnesses (tests/kernel/
brokerenv.py, promenv.py, tests/browser.py, which import bench modules
already; bench imports nothing from tests).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from typing import Any

__all__ = ["stop"]

# A SIGKILLed process is reaped at once unless it is stuck in the kernel:
# then waiting longer would not help, and the caller should hear about it.
_REAP_SECONDS = 10.0


def stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
    """Send sig unless proc has exited, wait up to timeout seconds, then SIGKILL
    it; return its exit status (negative: the signal that ended it)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(_REAP_SECONDS)
    return proc.returncode
