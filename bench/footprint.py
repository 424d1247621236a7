"""6. Broker footprint: RSS and CPU with 100 sessions.

The bench user's client opens that many Unix-socket sessions, each attached
to syscount (one shared instance), and holds them. Memory is the broker's
VmRSS; CPU is its user+system time over setting the sessions up, over a
quiet window while they are held (clients read their maps through their own
fds, so the broker should be idle), and over closing them.
"""

from __future__ import annotations

import os
import time
from typing import Any

from bench.harness import Stage, cpu_seconds, log, rss_kib


def run(stage: Stage, sessions: int, window: float) -> dict[str, Any]:
    pid = stage.broker_pid
    rss0, cpu0 = rss_kib(pid), cpu_seconds(pid)
    fds0 = len(os.listdir(f"/proc/{pid}/fd"))
    log(f"footprint: {sessions} sessions")
    t0 = time.monotonic()
    with stage.held("syscount", sessions=sessions) as held:
        setup_s = time.monotonic() - t0
        rss1, cpu1 = rss_kib(pid), cpu_seconds(pid)
        fds1 = len(os.listdir(f"/proc/{pid}/fd"))
        time.sleep(window)
        rss2, cpu2 = rss_kib(pid), cpu_seconds(pid)
    time.sleep(0.5)  # the broker closes sessions as their sockets hang up
    cpu3 = cpu_seconds(pid)
    return {
        "sessions": sessions,
        "all_shared_after_first": all(held["shared"][1:]) and not held["shared"][0],
        "rss_idle_kib": rss0,
        "rss_with_sessions_kib": max(rss1, rss2),
        "rss_per_session_kib": round((max(rss1, rss2) - rss0) / sessions, 1),
        "fds_idle": fds0,
        "fds_with_sessions": fds1,
        "setup_wall_s": round(setup_s, 3),
        "setup_cpu_s": round(cpu1 - cpu0, 3),
        "held_window_s": window,
        "held_cpu_percent": round(100 * (cpu2 - cpu1) / window, 2),
        "close_cpu_s": round(cpu3 - cpu2, 3),
    }
