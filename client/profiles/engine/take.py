"""take_profile(): one call from a request to a named profile."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from gfxbpf.client.profiles.engine.live import not_ours, open_profile
from gfxbpf.client.profiles.engine.naming import name_stacks, processes_seen
from gfxbpf.client.profiles.engine.run import Run, Stopper
from gfxbpf.client.profiles.engine.sampling import collect, sample

if TYPE_CHECKING:
    from gfxbpf.client.broker import Broker
    from gfxbpf.client.profiles.engine.request import ProfileRequest
    from gfxbpf.client.profiles.model import Profile


@dataclass
class Taken:
    """A profile taken: its named stacks, and the run that took them (the
    programs, targets, processes seen, Python section and times)."""

    profile: Profile
    run: Run
    lost: int  # records the ring dropped, or samples or calls the tables had no room for
    read_s: float  # from the end of sampling to detached: the maps read
    empty: bool  # nothing was counted


def take_profile(
    req: ProfileRequest,
    connect: Callable[[], Broker],
    stop: Stopper,
    duration: float | None = None,
    progress: TextIO | None = None,
    keep_collector_off: bool = False,
) -> Taken:
    """Attach, run req.command (held before exec until the attach is live) or
    watch req.pids, sample until they exit, duration ends or stop is set, then
    detach and name the stacks. progress: a terminal to show the count on.
    From the end of sampling the cyclic collector is off (the rows become
    objects that all live on: it would only walk them); it is turned back on
    at the return unless keep_collector_off (a caller writing a file from the
    profile turns it on when done)."""
    collecting = gc.isenabled()
    try:
        return _take(req, connect, stop, duration, progress)
    finally:
        if collecting and not keep_collector_off:
            gc.enable()


def _take(
    req: ProfileRequest,
    connect: Callable[[], Broker],
    stop: Stopper,
    duration: float | None,
    progress: TextIO | None,
) -> Taken:
    with open_profile(req, connect) as live:
        r = live.run
        live.start()
        sample(r, stop, duration, progress)
        # From here to the file, tens of thousands of rows become objects that
        # all live to the end: the cyclic collector would only walk them (~1/3
        # of profile_stacks' time with 16,000 rows).
        gc.disable()
        raw, lost = collect(r)
        raw = not_ours(raw, r.child)
        r.processes = sorted({s.pid for s in raw})
        r.seen = processes_seen(raw, r.maps.comms)
    read_s = time.monotonic() - (r.ended or 0.0)
    return Taken(name_stacks(live.symbolizer, r, raw, lost), r, lost, read_s, not raw)
