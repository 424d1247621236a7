"""The readers of the stack-copy programs' ring: records unwound as they are
read (stackcopy, ustackcopy, offcpu), and the Python code objects they name."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from gfxbpf.client.profiles.engine.child import HELD_COMM
from gfxbpf.client.profiles.engine.request import GPU, LOCKS, OFF_CPU, WALL

if TYPE_CHECKING:
    from gfxbpf.client.handle import Attachment
    from gfxbpf.client.profiles.copies import CopyReader
    from gfxbpf.client.profiles.engine.run import Copies, Run
    from gfxbpf.client.profiles.symbolize import Symbolizer
    from gfxbpf.client.profiles.unwind import UnwindTables

STACK_COPIES = "stack_copies"  # the stack-copy programs' ring buffer


def unwind_tables() -> UnwindTables:
    """One set of unwind tables per run, shared by the unwinder and the symbolizer."""
    from gfxbpf.client.profiles.unwind import UnwindTables

    return UnwindTables()


def copy_reader(r: Run, symbolizer: Symbolizer, tables: UnwindTables) -> Copies:
    from gfxbpf.client.profiles.copies import CopyReader, ProbeCopyReader
    from gfxbpf.client.profiles.unwind import MAX_FRAMES

    symbolizer.stack_depth = MAX_FRAMES  # the unwinder's frame limit, not a table's depth
    stream = r.att.open_events(STACK_COPIES)
    codes = code_book(r.att)
    if r.req.probes:  # --gpu: copies taken inside the launch, joined by Python chain
        return ProbeCopyReader(stream, r.maps.process, tables, codes, by_chain=r.req.mode == GPU)
    req = r.req
    if req.mode == LOCKS:
        from gfxbpf.client.profiles.locks.reader import LockReader

        reader: CopyReader = LockReader(stream, r.maps.process, tables, r.kept())
        return _profile_only(reader, r)
    if req.wakers:
        from gfxbpf.client.profiles.locks.wakers import WakerReader

        reader = WakerReader(stream, r.maps.process, tables, r.kept(), codes)
        return _profile_only(reader, r)
    reader = CopyReader(
        stream,
        r.maps.process,
        tables,
        r.kept(),
        codes,
        sample_ns=1_000_000_000 // req.frequency if req.mode == WALL else 0,
        waits=req.mode == OFF_CPU,
        threads=req.mode == WALL,
    )
    return _profile_only(reader, r)


def waits_reader(r: Run, att: Attachment, tables: UnwindTables) -> CopyReader:
    """--wall: the offcpu attachment's waits, per thread like the samples."""
    from gfxbpf.client.profiles.copies import CopyReader

    stream = att.open_events(STACK_COPIES)
    reader = CopyReader(
        stream, r.maps.process, tables, r.kept(), code_book(att), waits=True, threads=True
    )
    return _profile_only(reader, r)


def _profile_only(reader: CopyReader, r: Run) -> CopyReader:
    """The reader, told which records are the profiler's: this process's (it
    unwinds and waits for records) and a held `-- COMMAND`'s before its exec
    (it waits for the go)."""
    reader.skip.add(os.getpid())
    if r.child is not None:
        reader.held = (r.child.pid, HELD_COMM.encode())
    return reader


def code_book(att: Attachment) -> Any:
    """The Python code objects the program copied (None: it walks no Python)."""
    if "py_codes" not in att.maps:
        return None
    from gfxbpf.client.profiles.python.records import CodeBook

    codes = att.map("py_codes")
    return CodeBook(codes.lookup_many, codes.raw_items)
