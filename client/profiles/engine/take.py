"""take_profile(): one call from a request to a named profile."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from gfxbpf.client.profiles.engine.attach import attach, attach_waits, find_pythons
from gfxbpf.client.profiles.engine.child import HELD_COMM, Child
from gfxbpf.client.profiles.engine.naming import name_stacks, processes_seen
from gfxbpf.client.profiles.engine.readers import (
    STACK_COPIES,
    copy_reader,
    unwind_tables,
    waits_reader,
)
from gfxbpf.client.profiles.engine.run import Run, Stopper
from gfxbpf.client.profiles.engine.sampling import collect, sample
from gfxbpf.client.profiles.engine.snapshots import Maps
from gfxbpf.client.profiles.symbolize import Symbolizer

if TYPE_CHECKING:
    from gfxbpf.client.broker import Broker
    from gfxbpf.client.handle import Attachment
    from gfxbpf.client.profiles.engine.request import ProfileRequest
    from gfxbpf.client.profiles.model import Profile, RawStack
    from gfxbpf.client.profiles.unwind import UnwindTables


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
    tables = unwind_tables()
    symbolizer = Symbolizer(unwind_tables=tables)
    child = Child(req.command) if req.command else None
    pythons = find_pythons(req)
    try:
        broker = connect()
        try:
            att = attach(broker, req, one_pid(req, child), pythons)
            waits_att = attach_waits(broker, req, att, one_pid(req, child), pythons)
        except BaseException:
            broker.close()
            raise
    except BaseException:
        if child is not None:
            child.abandon()
        raise
    with broker:
        r = _new_run(req, att, symbolizer, tables, child)
        r.pythons = pythons
        if waits_att is not None:
            r.waits_att, r.waits = waits_att, waits_reader(r, waits_att, tables)
        try:
            if child is not None:
                child.release()
                r.started = time.monotonic()
            sample(r, stop, duration, progress)
            # From here to the file, tens of thousands of rows become objects that
            # all live to the end: the cyclic collector would only walk them (~1/3
            # of profile_stacks' time with 16,000 rows).
            gc.disable()
            raw, lost = collect(r)
            raw = not_ours(raw, child)
            r.processes = sorted({s.pid for s in raw})
            r.seen = processes_seen(raw, r.maps.comms)
        finally:
            att.detach()
            if waits_att is not None:
                waits_att.detach()
    read_s = time.monotonic() - (r.ended or 0.0)
    return Taken(name_stacks(symbolizer, r, raw, lost), r, lost, read_s, not raw)


def not_ours(raw: list[RawStack], child: Child | None) -> list[RawStack]:
    """The stacks without this process's own (a profile of all the user's
    processes holds the profiler) nor the held child's before its exec."""
    me, held = os.getpid(), child.pid if child is not None else None
    return [s for s in raw if s.pid != me and not (s.pid == held and s.comm == HELD_COMM)]


def one_pid(req: ProfileRequest, child: Child | None) -> int | None:
    """The pid the kernel filters on: COMMAND's, or a single --pid (several: the
    kernel filters by uid and this client keeps the chosen ones)."""
    if child is not None:
        return child.pid
    return req.pids[0] if len(req.pids) == 1 else None


def _new_run(
    req: ProfileRequest,
    att: Attachment,
    symbolizer: Symbolizer,
    tables: UnwindTables,
    child: Child | None,
) -> Run:
    """The run's state: stacks from copies (stackcopy) or from the stack table."""
    r = Run(req, att, Maps(symbolizer), child)
    r.kernel_tree = req.children and one_pid(req, child) is not None
    if STACK_COPIES in att.maps:
        r.copies = copy_reader(r, symbolizer, tables)
    else:
        symbolizer.stack_depth = att.map("stacks").desc.value_size // 8
    return r
