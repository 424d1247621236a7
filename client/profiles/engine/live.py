"""A profile open while it is taken: attached, read as often as its user
wants, closed at the end. take_profile() is one open, sample, collect and
close; a watch view (`watch cuda --by-python`) reads one every interval, so
its counts stay exact across intervals (one attachment, never re-attached)."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from gfxbpf.client.profiles.engine.attach import attach, attach_waits, find_pythons
from gfxbpf.client.profiles.engine.child import HELD_COMM, Child
from gfxbpf.client.profiles.engine.readers import (
    STACK_COPIES,
    copy_reader,
    unwind_tables,
    waits_reader,
)
from gfxbpf.client.profiles.engine.run import Run
from gfxbpf.client.profiles.engine.sampling import counters, probe_stacks
from gfxbpf.client.profiles.engine.snapshots import Maps
from gfxbpf.client.profiles.symbolize import Symbolizer

if TYPE_CHECKING:
    from collections.abc import Callable

    from gfxbpf.client.broker import Broker
    from gfxbpf.client.handle import Attachment
    from gfxbpf.client.profiles.engine.request import ProfileRequest
    from gfxbpf.client.profiles.model import RawStack
    from gfxbpf.client.profiles.unwind import UnwindTables


class LiveProfile:
    """An attached profile: its broker session, its run (attachments, readers,
    the targets' maps) and the symbolizer that names its stacks."""

    def __init__(self, broker: Broker, run: Run, symbolizer: Symbolizer) -> None:
        self.broker = broker
        self.run = run
        self.symbolizer = symbolizer

    def start(self) -> None:
        """Let a held `-- COMMAND` exec: the attach is live."""
        if self.run.child is not None:
            self.run.child.release()
            self.run.started = time.monotonic()

    def poll(self) -> None:
        """The targets' maps captured and every record the kernel sent so far read."""
        run = self.run
        run.tick(read=False, progress=False)
        for reader in (run.copies, run.waits):
            while reader is not None and reader.drain():
                pass

    def probe_stacks(self, *weights: str) -> list[list[RawStack]]:
        """--stacks-at: the calls counted since the attach, one list of stacks per
        weight ("calls", "time"), all from one read of the table."""
        from gfxbpf.client.profiles.copies import ProbeCopyReader

        if not isinstance(self.run.copies, ProbeCopyReader):
            raise TypeError("probe_stacks: not a --stacks-at profile read from stack copies")
        return probe_stacks(self.run, self.run.copies, weights)

    def close(self) -> None:
        """Detach (the sampling attachment, then --wall's waits) and end the session."""
        try:
            try:
                self.run.att.detach()
            finally:
                if self.run.waits_att is not None:
                    self.run.waits_att.detach()
        finally:
            self.broker.close()

    def __enter__(self) -> LiveProfile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_profile(req: ProfileRequest, connect: Callable[[], Broker]) -> LiveProfile:
    """Attach what req needs; `-- COMMAND` starts held before exec (start()
    lets it run). Nothing is left attached, nor a child held, if this fails."""
    tables = unwind_tables()
    symbolizer = Symbolizer(unwind_tables=tables)
    child = Child(req.command) if req.command else None
    pythons = find_pythons(req)
    try:
        broker = connect()
        try:
            att = attach(broker, req, one_pid(req, child), pythons)
            waits_att = attach_waits(broker, req, att, one_pid(req, child), pythons)
            r = _new_run(req, att, symbolizer, tables, child)
            r.pythons = pythons
            if waits_att is not None:
                r.waits_att, r.waits = waits_att, waits_reader(r, waits_att, tables)
            if r.copies is not None:
                r.counters_at_attach = counters(r)
        except BaseException:
            broker.close()  # ends the session: whatever it attached is detached
            raise
    except BaseException:
        if child is not None:
            child.abandon()
        raise
    return LiveProfile(broker, r, symbolizer)


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
