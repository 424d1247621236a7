"""Sampling until the targets exit, then collecting what the kernel counted
or sent: the stacks a profile holds, as RawStacks."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TextIO

from gfxbpf.client.profiles import read as profile_read
from gfxbpf.client.profiles.engine.request import GPU, MEMORY
from gfxbpf.client.profiles.engine.run import TGID, Run, Stopper

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gfxbpf.client.profiles.copies import ProbeCopyReader
    from gfxbpf.client.profiles.engine.run import Copies
    from gfxbpf.client.profiles.model import RawStack

# Stack copies are read this often: a new process's maps are read at its first
# record, so one that lives a few ms more than this is still caught.
COPY_READ_S = 0.01
COPY_TICK_S = 0.05  # ... and the targets' trees and maps polled this often
# After the first 100 ms the ring's reader thread looks this often while records
# flow (not every ms: at 999 Hz its wakes cost the client a tenth of its CPU).
COPY_PUMP_S = COPY_READ_S / 2


def sample(run: Run, stop: Stopper, duration: float | None, progress: TextIO | None) -> None:
    """Until the targets exit, the duration ends or Ctrl-C; maps captured all
    along, by this loop and by a thread that is never held up by it (the
    loop's first tick tells it the targets)."""
    run.maps.watch()
    try:
        _sample(run, stop, duration, progress)
    finally:
        run.maps.stop_watching()


def _sample(run: Run, stop: Stopper, duration: float | None, progress: TextIO | None) -> None:
    last_count = 0.0
    while not run.done(duration) and not stop.stopped:
        now = time.monotonic()
        count = now - last_count >= 1.0
        if count:
            last_count = now
        if run.copies is None or run.elapsed() < 0.1 or now - run.ticked >= COPY_TICK_S:
            run.ticked = now
            run.tick(count, progress is not None)
        if progress is not None and count:
            what = "calls" if run.req.probes else "samples"
            progress.write(f"\rprofiling: {run.elapsed():5.1f} s, {run.samples} {what}  ")
            progress.flush()
        if run.copies is not None:  # the ring holds ~250 ms of a CPU at 999 Hz
            # The first 100 ms a snapshot a millisecond: a process that lives a few
            # ms must be caught after its loader mapped the libraries, or its
            # copies cannot be unwound (its maps are gone once it exits).
            if run.elapsed() < 0.1:
                run.copies.drain(0.001)
            else:  # then in batches: a wake per record costs more than its unwind
                for reader in (run.copies, run.waits):
                    if reader is not None:
                        reader.stream.pace(COPY_PUMP_S)
                stop.wait(max(0.0, COPY_READ_S - (time.monotonic() - now)))
                run.copies.drain()
            if run.waits is not None:
                run.waits.drain()
            continue
        # Often at first: a short-lived process must be caught with its libraries.
        stop.wait(0.05 if run.elapsed() < 1.0 else 0.25)
    run.ended = time.monotonic()
    if progress is not None:
        progress.write("\n")
        progress.flush()


def collect(run: Run) -> tuple[list[RawStack], int]:
    """Raw stacks from the maps (targets only), and the count the tables lost."""
    att, req = run.att, run.req
    if run.copies is not None:
        return _collect_copies(run, run.copies)
    entries = att.map(run.counts_map).raw_items()
    run.read_stacks(entries)
    stacks = run.stacks
    if req.probes:
        raw = profile_read.call_stacks(entries, stacks, req.functions, req.weight)
    else:
        raw = profile_read.profile_stacks(entries, stacks, run.kept())
    return raw, profile_read.lost_count(att.map("lost").raw_items())


def _collect_copies(run: Run, copies: Copies) -> tuple[list[RawStack], int]:
    from gfxbpf.client.profiles.copies import CopyReader

    copies.stream.flush()  # what the ring holds now, past the reading thread
    while copies.drain():  # what came in since the last look
        pass
    if run.waits is not None:
        run.waits.stream.flush()
        while run.waits.drain():
            pass
    lost, py_counts = counters(run)
    lost0, py0 = run.counters_at_attach
    lost -= lost0
    run.py_counts = {k: v - py0.get(k, 0) for k, v in py_counts.items()}
    if isinstance(copies, CopyReader):
        waited = run.waits.raw_stacks() if run.waits is not None else []
        return copies.raw_stacks() + waited, lost
    req = run.req
    if req.mode == MEMORY:
        from gfxbpf.client.profiles.memory.stacks import SITES, memory_stacks, totals

        rows = run.att.map(SITES).raw_items()
        run.memory = totals(rows)
        return memory_stacks(copies, rows, req.live), lost
    if req.mode == GPU:
        from gfxbpf.client.profiles.gpu.kernels import launch_stacks

        raw, notes = launch_stacks(copies, run.att)
        run.notes.extend(notes)
        return raw, lost
    return probe_stacks(run, copies, (req.weight,))[0], lost


def probe_stacks(run: Run, copies: ProbeCopyReader, weights: Sequence[str]) -> list[list[RawStack]]:
    """--stacks-at: the rows of this attachment's calls table (a warm instance
    holds earlier ones too), one list of stacks per weight, from one read. The
    rows' paths are found once: the other weights only re-weigh those stacks."""
    from gfxbpf.client.profiles.copies import call_weight, rows_of

    entries = rows_of(run.att.map("calls").raw_items(), run.att.reply.since_ns)
    first = copies.raw_stacks(entries, run.req.functions, weights[0])[0]
    # raw_stacks gives one stack per entry, in order
    return [first] + [
        [replace(s, weight=call_weight(v, w)) for s, (_, v) in zip(first, entries, strict=True)]
        for w in weights[1:]
    ]


def counters(run: Run) -> tuple[int, dict[str, int]]:
    """What the copy programs' frozen counters hold now: records lost (both
    attachments) and the Python walker's counts. A warm instance (the broker
    reuses one across profiles) holds its earlier profiles' counts too, so a
    profile reports the difference from its attach (Run.counters_at_attach)."""
    lost = profile_read.lost_count(run.att.map("lost").raw_items())
    if run.waits_att is not None:
        lost += profile_read.lost_count(run.waits_att.map("lost").raw_items())
    py = run.att.map("py_counts").raw_items() if "py_counts" in run.att.maps else []
    return lost, _py_counts(py)


# py_counts indexes (gfx_python.h GFX_PYC_*) -> the summary's names
_PY_COUNTS = ("walked", "truncated", "no_thread_state", "unreadable", "codes_not_stored")


def _py_counts(entries: list[tuple[bytes, Any]]) -> dict[str, int]:
    out = {}
    for key, value in entries:
        i = TGID.unpack_from(key)[0]
        if i < len(_PY_COUNTS) and isinstance(value, bytes) and len(value) == 8:
            out[_PY_COUNTS[i]] = profile_read.U64.unpack(value)[0]
    return out
