"""Naming a profile's stacks: the symbolizer over the raw stacks, with the
unit and the notes the run calls for, and the processes it holds."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from gfxbpf.catalog.stack_copies import most_stack_bytes
from gfxbpf.client.humanize import user_name
from gfxbpf.client.profiles.engine.request import GPU, LOCKS, MEMORY, OFF_CPU, WALL
from gfxbpf.client.profiles.python.records import MAIN_FRAME
from gfxbpf.client.profiles.unwind.result import CopySize

if TYPE_CHECKING:
    from gfxbpf.client.profiles.engine.run import Run
    from gfxbpf.client.profiles.model import Profile, RawStack
    from gfxbpf.client.profiles.symbolize import Symbolizer


def name_stacks(symbolizer: Symbolizer, r: Run, raw: list[RawStack], lost: int) -> Profile:
    """The profile of these raw stacks, named; lost: what the tables or the ring lost."""
    req = r.req
    if req.probes:  # --stacks-at weighs calls or time, --memory bytes
        unit, period = {"time": "nanoseconds"}.get(req.weight, req.weight), None
    elif req.timed:
        unit, period = "nanoseconds", None
    else:
        unit, period = "samples", 1_000_000_000 // req.frequency
    # Processes sampled but never captured (everything in scope): try them now.
    r.maps.capture({s.pid for s in raw} - r.maps.seen)
    prof = symbolizer.symbolize(
        raw, unit, period_ns=period, duration_s=round(r.elapsed(), 3), copy=copy_size(r)
    )
    if req.timed:
        prof.time_kind = "off_cpu" if req.mode == OFF_CPU else "wall"
    elif req.mode == GPU:
        prof.time_kind = "gpu"  # the kernels' device time: pprof -sample_index=gpu
    _by_kind(symbolizer, r, prof)
    prof.notes.extend(r.notes)
    _python_notes(r, prof)
    _copies_hint(r, prof)
    waits = r.wait_reader
    if before := getattr(waits, "before", 0):
        prof.notes.append(
            f"{before} waits were under way when the profile began: their time counts "
            "from its start (leaf frames '[wait: ..., began before the profile]')"
        )
    if lost:
        prof.notes.append(lost_note(req.mode, lost, r.copies is not None, bool(req.probes)))
    return prof


# What fits more in a full ring, per kind of profile (default: a CPU profile's).
_RING_ADVICE = {
    OFF_CPU: "raise --min-block",  # one record per kept wait, not at a frequency
    WALL: "sample at a lower --frequency, or raise --min-block",
    # every futex wait and wake sends its stack: smaller records fit more
    LOCKS: "a smaller --stack-bytes, such as 2048, fits more waits in it",
    # a launch chain copies its stack at its 1st, 2nd, 4th, 8th ... launch
    GPU: "a launch stack is copied again at its 2nd, 4th, 8th ... launch, so a longer "
    "profile fills most gaps",
}


def lost_note(mode: str, lost: int, copied: bool, probes: bool) -> str:
    """The note on what a full ring or table lost (copied: read from stack
    copies; probes: --stacks-at or --memory, whose calls are counted)."""
    if copied and probes:
        fewer = (
            "; --sample-bytes 1048576 records an allocation per MiB allocated, far fewer"
            if mode == MEMORY
            else ""
        )
        return (
            f"{lost} stack copies or calls were lost (the ring buffer or the broker's table "
            f"was full): a stack whose every copy was lost shows no frames{fewer}"
        )
    if copied:
        return (
            f"{lost} stack copies were dropped: the ring buffer was full (this gfxclient "
            f"fell behind; {_RING_ADVICE.get(mode, 'sample at a lower --frequency')})"
        )
    return (
        f"{lost} {'calls' if probes else 'samples'} could not be counted: the broker's "
        "table was full (profile fewer processes, or for a shorter time)"
    )


def copy_size(r: Run) -> CopySize:
    """The copies' size for the notes: of the reader whose copies were the
    smallest (--wall's waits copy what offcpu's policy entry allows, its CPU
    samples what stackcopy's does)."""
    readers = [(r.copies, r.att.program)]
    if r.waits is not None and r.waits_att is not None:
        readers.append((r.waits, r.waits_att.program))
    sizes = [(c.largest, prog) for c, prog in readers if c is not None and c.largest]
    if not sizes:
        return CopySize()
    copied, program = min(sizes)
    return CopySize(copied, most_stack_bytes(program), program, r.req.stack_bytes)


def _by_kind(symbolizer: Symbolizer, r: Run, prof: Profile) -> None:
    """What a kind of profile adds: its shape (locks, wakers), its space and notes."""
    req = r.req
    if req.mode == LOCKS:
        from gfxbpf.client.profiles.locks.shape import reshape

        reshape(prof)  # each lock at the root, its waiters and holders under it
    if req.wakers:
        from gfxbpf.client.profiles.locks.wakers import join_wakers

        join_wakers(symbolizer, r, prof)  # each wait's waker above its wait frame
    if req.mode == MEMORY:
        from gfxbpf.client.profiles.memory.stacks import notes

        prof.space_kind = "inuse_space" if req.live else "alloc_space"
        untracked = (r.memory or {}).get("untracked", 0)
        prof.notes.extend(notes(req.library or "", req.live, req.cuda, req.sample_bytes, untracked))
    if req.mode == GPU and (borrowed := _under_main_frame(prof)):
        prof.notes.append(
            f"{borrowed:.1f}% of the device time came from threads that ran no Python "
            f"(autograd's pt_autograd_N): under '{MAIN_FRAME}' their stacks show what the "
            "main thread ran at each launch (typically its loss.backward() line), not a caller"
        )


def _under_main_frame(prof: Profile) -> float:
    """The share (%) of the weight whose stack borrowed the main thread's frames."""
    total = prof.total()
    borrowed = sum(w for stack, w in prof.stacks.items() if MAIN_FRAME in stack)
    return 100.0 * borrowed / total if total else 0.0


# What the frame-pointer advice of stackcheck.py says (built without frame pointers).
FRAME_POINTER_ADVICE = "-fno-omit-frame-pointer"


def _copies_hint(r: Run, prof: Profile) -> None:
    """Stacks cut by the frame-pointer walk of your own processes: the policy
    did not grant stack copies, which need no frame pointers. Say so by the advice."""
    req = r.req
    if r.copies is not None or not req.own_processes:
        return
    name = "ustackcopy" if req.probes else "stackcopy"
    on = f" --libraries {req.library}" if req.probes else ""
    for i, note in enumerate(prof.notes):
        if FRAME_POINTER_ADVICE in note:
            prof.notes[i] = (
                f"{note} Or ask the administrator to grant you program {name} (`gfxbpf-admin "
                f"approve {name} --users {user_name(os.getuid())} --scope self{on}`): gfxclient "
                "then unwinds your processes' stacks from copies by their call-frame information, "
                "with no frame pointers needed."
            )


def _python_notes(r: Run, prof: Profile) -> None:
    """The Python section of the summary (kept on the run) and its notes."""
    if r.pythons is None or r.copies is None:
        return
    from gfxbpf.client.profiles.python.targets import report

    py = r.copies.python
    procs = r.maps.procs
    profiled = {
        pid: (comm, [m.file_path for m in procs[pid].mappings] if pid in procs else [])
        for pid, comm, _ in r.seen
    }
    r.python_summary, notes = report(r.pythons, py.versions, profiled)
    r.python_summary["truncated"] = py.truncated
    r.python_summary["walker"] = r.py_counts
    bad = r.py_counts.get("unreadable", 0)
    if bad > r.py_counts.get("walked", 0) // 100:  # a thread starting or ending: a few
        prof.notes.append(
            f"{r.py_counts['unreadable']} Python walks stopped at unreadable interpreter memory "
            "(a thread starting or ending, or an interpreter this layout does not describe)"
        )
    prof.notes.extend(notes)


def processes_seen(
    raw: list[RawStack], comms: dict[int, str] | None = None
) -> list[tuple[int, str, int]]:
    """(pid, command, weight) of each process in the profile, heaviest first;
    comms names the processes whose rows carry no command (probes). A row's
    command is its thread's name: another thread's (pt_autograd_0) names the
    process only while nothing better does."""
    by_pid: dict[int, list[Any]] = {}
    for s in raw:
        row = by_pid.setdefault(s.pid, [(comms or {}).get(s.pid, ""), 0])
        if s.comm and (s.tid in (0, s.pid) or not row[0]):
            row[0] = s.comm
        row[1] += s.weight
    return sorted(((p, c, w) for p, (c, w) in by_pid.items()), key=lambda t: (-t[2], t[0]))
