"""Stack copies (programs `stackcopy`, `ustackcopy`, `offcpu`) read as they come and unwound here.

Each record of the `stack_copies` ring buffer (catalog/programs/gfx_ucopy.h,
struct ustack_rec) holds a sample's user registers and the top of its user
stack. They are read as they come, so the 2 MiB ring keeps up at 999 Hz, and
each is unwound at once by the call-frame information of the files the
process maps (gfxbpf.client.profiles.unwind), so memory holds one tuple of
return addresses per distinct stack, not the copies.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from gfxbpf.client import profiles as profile
from gfxbpf.client.errors import ProtocolError
from gfxbpf.client.profiles.python import records as py
from gfxbpf.client.profiles.python.mixed import split_runs
from gfxbpf.client.profiles.stackcheck import NO_MAPS, NOT_UNWOUND

if TYPE_CHECKING:
    from gfxbpf.client.events import EventStream
    from gfxbpf.client.profiles.model import RawStack
    from gfxbpf.client.profiles.procmaps import ProcessMaps
    from gfxbpf.client.profiles.unwind import UnwindTables
    from gfxbpf.client.profiles.unwind.memo import UnwindMemo

# struct ustack_rec's header: tgid, tid, flags, size, ip, sp, bp, entry_ns,
# elapsed, function, pad, comm[16]; the stack bytes follow.
HEADER = struct.Struct("<4I3QQQII16s")
FLAG_KERNEL = 1  # sampled in kernel mode: the registers are the user ones it entered with
FLAG_SHORT = 2  # the stack ended (an unreadable page) before the copy's size
# offcpu records: how the thread left the CPU, and whether `function` is a syscall number
FLAG_RUNNABLE = 256  # preempted (or yielded) while runnable
FLAG_IO = 512  # an uninterruptible sleep
FLAG_SYSCALL = 1024  # (16 and 32 mark Python records: python/records.py)
# The wait was under way when the profile began: its time counts from then.
FLAG_BEFORE = 4096
BEFORE_NOTE = "began before the profile"
# Wait states, as the summary counts them.
STATES = ("sleeping", "uninterruptible", "preempted")


class StackKey(NamedTuple):
    """What tells one counted stack from another."""

    tgid: int
    kernel: bool  # sampled in kernel mode
    comm: str
    frames: tuple[int, ...]  # innermost first
    stop: str | None  # why the unwind stopped
    scanned: bool  # a stack scan found a frame
    pyframes: tuple[py.Frame, ...]  # innermost first
    leaf: str | None  # the wait's leaf frame (offcpu)
    tid: int


# tgid, refresh -> the process's maps (refresh: snapshot it again first)
MapsOf = Callable[[int, bool], "ProcessMaps | None"]
# ustackcopy's calls map: key (tgid, function, caller, hash of the Python
# chain, hash of the code addresses above the caller, when the profile
# began), value (calls, total_ns)
CALL_KEY = struct.Struct("<IIQQQQ")
CALL_STATS = struct.Struct("<QQ")
U64 = struct.Struct("<Q")
# A row of ustackcopy's calls map whose copies unwound to different paths.
MERGED = "merged"


def parse_header(rec: bytes) -> tuple[Any, ...]:
    """A stack copy record's header fields (HEADER's order)."""
    if len(rec) < HEADER.size:
        raise ProtocolError(
            f"a {len(rec)}-byte stack copy record: this gfxclient expects at least "
            f"{HEADER.size} (the broker runs another version of the program: update gfxclient)"
        )
    return HEADER.unpack_from(rec)


def _unwind(
    rec: bytes,
    ip: int,
    sp: int,
    bp: int,
    size: int,
    maps: ProcessMaps,
    tables: UnwindTables,
    memo: UnwindMemo,
    skip: int = 0,
    exact: bool = True,
) -> tuple[tuple[int, ...], str | None, bool]:
    """frames, why the walk stopped (None: complete), whether a stack scan found
    a frame. skip: stack bytes above the copy's start where sp points (it
    is their address); exact False: ip is a return address."""
    stack = memoryview(rec)[HEADER.size + skip : HEADER.size + size]
    return memo.walk(ip, sp, bp, stack, maps, tables, exact)


def _memo() -> UnwindMemo:
    from gfxbpf.client.profiles.unwind.memo import UnwindMemo

    return UnwindMemo()


def wait_state(flags: int) -> str:
    """How an offcpu record's thread left the CPU (one of STATES)."""
    if flags & FLAG_RUNNABLE:
        return "preempted"
    return "uninterruptible" if flags & FLAG_IO else "sleeping"


@functools.lru_cache(maxsize=4096)  # one per (flags, system call): asked at every wait
def wait_frame(flags: int, syscall: int) -> str:
    """The leaf frame that says why an offcpu record's thread waited: the system
    call it was in (the kernel's frames are never shown), or that it was preempted."""
    from gfxbpf.client.syscalls import SYSCALLS

    if flags & FLAG_RUNNABLE:
        return "[preempted]"
    what = SYSCALLS.get(syscall, f"syscall {syscall}") if flags & FLAG_SYSCALL else "page fault"
    if flags & FLAG_IO:
        what += ", uninterruptible"
    if flags & FLAG_BEFORE:
        what += f", {BEFORE_NOTE}"
    return f"[wait: {what}]"


class CopyReader:
    """Drains a stackcopy (or offcpu) attachment's ring buffer and unwinds every
    record. Weights: 1 a sample; sample_ns a sample (time at the sampling
    period, for wall-clock profiles); waits: an offcpu record's time off the
    CPU in ns, with its wait frame as the leaf. threads: a frame per thread
    (every stack keeps its thread id, RawStack.tid, either way)."""

    def __init__(
        self,
        stream: EventStream,
        process_maps: MapsOf,
        tables: UnwindTables,
        pids: Sequence[int] = (),
        codes: py.CodeBook | None = None,
        *,
        sample_ns: int = 0,
        waits: bool = False,
        threads: bool = False,
    ) -> None:
        self.sample_ns = sample_ns
        self.waits = waits
        self.threads = threads
        self.by_state = dict.fromkeys(STATES, 0)  # offcpu: ns off the CPU per state
        self.stream = stream
        self.process_maps = process_maps  # tgid -> its maps (captured on first sight)
        self.tables = tables
        self.memo = _memo()  # repeated copies of one place walk once
        self.wanted = set(pids)
        self.skip: set[int] = set()  # tgids never kept (the profiler itself, waiting by design)
        # (tgid, command name) whose records are not the profile's: a held
        # `-- COMMAND` before its exec (the profiler's Python, waiting for the go).
        self.held: tuple[int, bytes] | None = None
        self.counts: dict[StackKey, int] = {}
        self.records = 0  # every record read, those of unwanted pids included
        self.samples = 0  # records kept
        self.short = 0  # records whose stack ended before the copy's size
        self.largest = 0  # bytes of the largest copy seen (the notes' advice)
        self.before = 0  # offcpu: waits under way when the profile began (seen at their end)
        self._comms: dict[bytes, str] = {}
        self.python = PythonJoin(codes)

    def drain(self, timeout: float = 0.0) -> int:
        """Read what the ring holds (waiting up to timeout for the first); the count."""
        records = self.stream.poll_raw(timeout)
        for rec in records:
            self.add(rec)
        self.python.resolve()
        return len(records)

    def add(self, rec: bytes) -> None:
        """Unwind one record into the counts (a Python record waits for its stack's)."""
        if self.python.held(rec):
            return
        tgid, tid, flags, _s, _ip, _sp, _bp, ts, elapsed, function, _pad, comm = parse_header(rec)
        self.records += 1
        pyframes = self.python.frames_of(tgid, tid, ts)
        if not self.ours(tgid, comm):
            return
        self.samples += 1
        weight, leaf = self.sample_ns or 1, None
        if self.waits:
            weight, leaf = elapsed, wait_frame(flags, function)
            self.by_state[wait_state(flags)] += elapsed
            self.before += bool(flags & FLAG_BEFORE)
        key = self.key_of(rec, pyframes, leaf)
        self.counts[key] = self.counts.get(key, 0) + weight

    def ours(self, tgid: int, comm: bytes) -> bool:
        """Whether a record (of process tgid, command name comm) is the profile's:
        a wanted process, neither this profiler nor a held child before its exec
        (whose waits would count in the totals and the notes, not the stacks)."""
        if (self.wanted and tgid not in self.wanted) or tgid in self.skip:
            return False
        held = self.held  # the pid first: most records are not the held child's
        return held is None or tgid != held[0] or comm.split(b"\0", 1)[0] != held[1]

    def key_of(self, rec: bytes, pyframes: tuple[py.Frame, ...], leaf: str | None) -> StackKey:
        """The record's stack, unwound, as a key of the counts."""
        tgid, tid, flags, size, ip, sp, bp, _ts, _e, _f, _pad, comm = parse_header(rec)
        self.short += bool(flags & FLAG_SHORT)
        self.largest = max(self.largest, size)
        name = self._comms.get(comm)
        if name is None:
            name = self._comms[comm] = comm.split(b"\0", 1)[0].decode("utf-8", "replace")
        kernel = bool(flags & FLAG_KERNEL)
        maps = self.process_maps(tgid, False)
        if maps is None:
            return StackKey(tgid, kernel, name, (), NO_MAPS, False, pyframes, leaf, tid)
        frames, stop, scan = _unwind(rec, ip, sp, bp, size, maps, self.tables, self.memo)
        if not frames and (maps := self.process_maps(tgid, True)) is not None:
            frames, stop, scan = _unwind(
                rec, ip, sp, bp, size, maps, self.tables, self.memo
            )  # newer maps
        return StackKey(tgid, kernel, name, frames, stop, scan, pyframes, leaf, tid)

    def raw_stacks(self) -> list[RawStack]:
        """The samples as the symbolizer takes them, one RawStack per distinct stack."""
        self.python.resolve(final=True)
        return [self.raw_stack(k, weight) for k, weight in self.counts.items()]

    def raw_stack(self, k: StackKey, weight: int) -> RawStack:
        """One counted stack as the symbolizer takes it."""
        lost = k.stop if not k.frames else None  # nothing unwound: say why, as one frame
        return profile.RawStack(
            pid=k.tgid,
            user=k.frames,
            kernel=k.kernel,
            weight=weight,
            comm=k.comm,
            user_error=_error(lost) if lost else None,
            unwind_stop=k.stop if k.frames else None,
            unwind_scanned=k.scanned,
            unwound=True,
            leaf=k.leaf,
            thread=(k.tid or None) if self.threads else None,  # a frame per thread
            tid=k.tid,
            python=self.python.runs(k.tgid, k.pyframes),
            python_starts=self.python.starts(k.tgid, k.pyframes),
        )


class PythonJoin:
    """Python records held until the stack record of the same thread and time
    stamp, which the program sends right after (another CPU's records may
    come between; a stack record the ring dropped leaves its Python record
    unjoined, never joined to the next sample)."""

    def __init__(self, codes: py.CodeBook | None) -> None:
        self.codes = codes
        self._pending: dict[int, py.PyRecord] = {}  # tid -> its last Python record
        self.records = 0
        self.truncated = 0
        self.versions: dict[int, tuple[int, int]] = {}  # tgid -> the version walked

    def held(self, rec: bytes) -> bool:
        """True for a Python record (kept for its stack record)."""
        if not py.is_python(rec):
            return False
        r = py.parse(rec)
        self.records += 1
        self.truncated += r.truncated
        self.versions[r.tgid] = r.version
        self._pending[r.tid] = r
        if self.codes is not None:
            self.codes.want(r.tgid, r.frames)
        return True

    def frames_of(self, tgid: int, tid: int, ts: int) -> tuple[py.Frame, ...]:
        """The Python frames of the stack record (tgid, tid, entry_ns ts)."""
        r = self._pending.pop(tid, None)
        if r is None or (r.tgid, r.ts) != (tgid, ts):
            return ()
        return r.marked()

    def resolve(self, final: bool = False) -> None:
        if self.codes is not None:
            self.codes.resolve(final)

    def runs(self, tgid: int, frames: tuple[py.Frame, ...]) -> tuple[tuple[str, ...], ...]:
        if not frames or self.codes is None:
            return ()
        codes = self.codes
        return split_runs((codes.name(tgid, f), f[2]) for f in frames)

    def starts(self, tgid: int, frames: tuple[py.Frame, ...]) -> tuple[tuple[str, int], ...]:
        """(frame name, the line its function starts at) of each frame named."""
        if self.codes is None:
            return ()
        codes = self.codes
        return tuple((codes.name(tgid, f), codes.first_line(tgid, f)) for f in frames if f[0])


# A row's Python chain whose copies were all lost (or not read yet): the hash
# says the kernel walked Python frames, no copy says which.
NOT_COPIED = "[Python chain not copied yet]"


def _not_copied(chain_hash: int) -> tuple[tuple[str, ...], ...]:
    return ((NOT_COPIED,),) if chain_hash else ()


def _error(stop: str) -> str:
    """Why a sample has no user frame at all, in the summary's words."""
    if stop == NO_MAPS:
        return NO_MAPS
    return f"{NOT_UNWOUND} ({stop})"


# A row of ustackcopy's calls map: tgid, function, caller, Python chain hash,
# path hash (gfx_pathhash.h; a copy carries its row's in `elapsed`)
Row = tuple[int, int, int, int, int]


def call_weight(value: bytes, weight: str) -> int:
    """A calls-map value (CALL_STATS) weighed as --stacks-at asks: "calls" or "time" (ns)."""
    ncalls, total_ns = CALL_STATS.unpack(value)
    return int(ncalls if weight == "calls" else total_ns)


def rows_of(calls: Iterable[tuple[bytes, Any]], since_ns: int) -> list[tuple[bytes, Any]]:
    """The rows of ustackcopy's calls table counted for one attachment: those
    whose key holds its since_ns (AttachReply.since_ns). An instance the
    broker kept warm still holds the same user's earlier profiles' rows
    (the table is frozen), each with its own start. since_ns 0 (a broker
    that never keeps ustackcopy warm): every row."""
    if not since_ns:
        return list(calls)
    return [
        (k, v) for k, v in calls if len(k) == CALL_KEY.size and CALL_KEY.unpack(k)[5] == since_ns
    ]


class ProbeCopyReader:
    """ustackcopy: the calls map counts every call exactly per (function,
    caller, Python chain, path hash); the copies (a few per row) give each
    row its calling stack, and a copy's Python record its Python frames.
    Rows whose copies unwind to one path are one stack of the profile.

    by_chain (cudakernels: copies taken at a USDT probe inside a callback, no
    function entry, no caller on top of the stack): rows are (tgid, 0, stack
    pointer at the probe, chain hash, kernel name hash) and a copy's whole
    unwound path, from the probe out, is kept: one Python chain launches
    kernels, and even one kernel, through different native paths (a PyTorch
    line's cuBLAS product and elementwise kernel; autograd's thread, which has
    no Python frames, one backward kernel from many backward functions), which
    the stack pointer tells apart."""

    def __init__(
        self,
        stream: EventStream,
        process_maps: MapsOf,
        tables: UnwindTables,
        codes: py.CodeBook | None = None,
        by_chain: bool = False,
    ) -> None:
        self.by_chain = by_chain
        self.python = PythonJoin(codes)
        self.stream = stream
        self.process_maps = process_maps
        self.tables = tables
        self.memo = _memo()
        # row -> the distinct unwound paths, from the caller out
        self.paths: dict[Row, set[tuple[tuple[int, ...], str | None]]] = {}
        # _path's answers until a copy adds a path: every row of one sibling
        # set takes the same (PyTorch: thousands of copy-less rows share a
        # caller, c10::alloc_cpu, and took minutes when each compared them)
        self._answers: dict[object, tuple[tuple[int, ...], str | None]] = {}
        self.pyframes: dict[Row, tuple[py.Frame, ...]] = {}  # row -> its Python frames
        self.scanned: set[Row] = set()  # rows a copy of which needed a stack scan
        # (tgid, function, caller, Python chain) -> its rows with a copy: a row
        # whose copy was lost takes what they show (rows before the path hash)
        self.siblings: dict[tuple[int, int, int, int], set[Row]] = {}
        # (tgid, chain hash) -> the Python frames, unwound or not (watch cuda --by-python)
        self.chains: dict[tuple[int, int], tuple[py.Frame, ...]] = {}
        # by_chain: (tgid, chain hash) -> its rows with a copy, at any stack pointer
        self.chain_rows: dict[tuple[int, int], set[Row]] = {}
        # by_chain: row -> (thread id, thread name) of its copies: a launch stack's
        # root names its thread, as a CPU profile's does (autograd's pt_autograd_N)
        self.threads: dict[Row, set[tuple[int, str]]] = {}
        self.records = 0
        self.largest = 0  # bytes of the largest copy seen (the notes' advice)

    def drain(self, timeout: float = 0.0) -> int:
        records = self.stream.poll_raw(timeout)
        for rec in records:
            self.add(rec)
        self.python.resolve()
        return len(records)

    def add(self, rec: bytes) -> None:
        if self.python.held(rec):
            return
        tgid, tid, _flags, size, ip, sp, bp, ts, path, function, _pad, comm = parse_header(rec)
        self.records += 1
        self.largest = max(self.largest, size)
        pyframes = self.python.frames_of(tgid, tid, ts)
        if pyframes:
            self.chains[(tgid, py.chain_hash(pyframes))] = pyframes
        if size < U64.size:
            return  # not even the return address: nothing to place the row by
        caller = U64.unpack_from(rec, HEADER.size)[0]
        walked = self._walk(rec, tgid, (ip, sp, bp), size, caller)
        if walked is None:
            return
        frames, stop, scanned = walked
        if self.by_chain and frames:  # `path`: the launched kernel's name hash here
            row = (tgid, 0, sp, py.chain_hash(pyframes), path)
            thread = (tid, comm.split(b"\0", 1)[0].decode(errors="replace"))
            self._keep(row, frames, stop, scanned, pyframes, thread)
        elif not self.by_chain and frames and frames[0] == caller:  # the row's caller
            row = (tgid, function, caller, py.chain_hash(pyframes), path)
            self._keep(row, frames, stop, scanned, pyframes)

    def _walk(
        self, rec: bytes, tgid: int, regs: tuple[int, int, int], size: int, caller: int
    ) -> tuple[tuple[int, ...], str | None, bool] | None:
        """The copy's walk (None: the process's maps were never read). A copy
        taken at a function's entry is walked from its caller (the return
        address on top of the stack, the caller's rbp still in rbp), so the
        probed library need not be in the maps: a library loaded and called
        between two snapshots by a process gone before its copy was read."""
        ip, sp, bp = regs
        whole = 2 if self.by_chain else 1  # frames of a walk that reached a caller
        walked: tuple[tuple[int, ...], str | None, bool] = ((), None, False)
        for refresh in (False, True):  # again with newer maps: a library just mapped
            maps = self.process_maps(tgid, refresh)
            if maps is None:
                return None
            if self.by_chain:  # copied inside a function: its own CFI first
                walked = _unwind(rec, ip, sp, bp, size, maps, self.tables, self.memo)
            else:
                walked = _unwind(
                    rec, caller, sp + 8, bp, size, maps, self.tables, self.memo, 8, False
                )
            # A copy is rare (a row's 1st, 2nd, 4th ... call): one that stops
            # early may have met maps from before an exec; look once more.
            if len(walked[0]) >= whole and walked[1] is None:
                break
        return walked

    def _keep(
        self,
        row: Row,
        path: tuple[int, ...],
        stop: str | None,
        scanned: bool,
        pyframes: tuple[py.Frame, ...],
        thread: tuple[int, str] | None = None,
    ) -> None:
        known = self.paths.setdefault(row, set())
        if (path, stop) not in known:
            known.add((path, stop))
            self._answers.clear()
        if thread is not None:  # by_chain: (thread id, name) of the copy
            self.threads.setdefault(row, set()).add(thread)
        self.pyframes[row] = pyframes
        self.siblings.setdefault(row[:4], set()).add(row)
        if self.by_chain:
            self.chain_rows.setdefault((row[0], row[3]), set()).add(row)
        if scanned:
            self.scanned.add(row)

    def chain_stack(
        self, tgid: int, chain: int, kernel: int, sp: int, leaf: str, weight: int
    ) -> profile.RawStack:
        """by_chain: the launch stack of a (process, Python chain, kernel name
        hash, stack pointer at the probe) with this leaf; a row none of whose
        copies came takes those of the chain's other kernels launched at the
        same stack pointer, else those of all the chain's rows (their shared
        frames where they differ)."""
        self.python.resolve(final=True)
        return self._raw((tgid, 0, sp, chain, kernel), leaf, weight, "no launch stack copied yet")

    def row_stack(self, row: Row, leaf: str, weight: int) -> profile.RawStack:
        """A row of another table with the same key (memstacks' sites): its
        stack (after python.resolve(final=True), once for all rows)."""
        return self._raw(row, leaf, weight, "no user stack (unreadable return address)")

    def _raw(self, row: Row, leaf: str, weight: int, error: str) -> profile.RawStack:
        """A row's RawStack: its path, Python frames and leaf."""
        tgid = row[0]
        user, stop = self._path(row)
        thread, tid = self._thread(row) if self.by_chain else ("", 0)
        # A row's Python chain is its siblings' (the same hash), or that of any
        # copy with the hash whose native walk failed (the chain is still known).
        pyframes = (
            self.pyframes.get(row)
            or next((self.pyframes[r] for r in self.siblings.get(row[:4], ())), ())
            or self.chains.get((tgid, row[3]), ())
        )
        return profile.RawStack(
            pid=tgid,
            user=user,
            kernel=False,
            weight=weight,
            comm=thread,
            tid=tid,
            user_error=None if user else error,
            leaf=leaf,
            unwind_stop=stop if user else None,
            unwind_scanned=bool(user) and row in self.scanned,
            unwound=True,
            python=self.python.runs(tgid, pyframes) or _not_copied(row[3]),
            python_starts=self.python.starts(tgid, pyframes),
        )

    def raw_stacks(
        self, calls: Iterable[tuple[bytes, Any]], functions: Sequence[str], weight: str
    ) -> tuple[list[RawStack], int]:
        """One RawStack per row of the calls map, and how many rows had no copy."""
        out, uncopied = [], 0
        self.python.resolve(final=True)
        for key, value in calls:
            if len(key) != CALL_KEY.size or len(value) != CALL_STATS.size:
                raise ProtocolError("ustackcopy's map 'calls': unexpected sizes (update gfxclient)")
            row: Row = CALL_KEY.unpack(key)[:5]
            function = row[1]
            uncopied += not self.paths.get(row)
            leaf = functions[function] if function < len(functions) else f"[function {function}]"
            w = call_weight(value, weight)
            out.append(self._raw(row, leaf, w, "no user stack (unreadable return address)"))
        return out, uncopied

    def _thread(self, row: Row) -> tuple[str, int]:
        """by_chain: the name and id of the thread whose copies give the row its
        path (as _path picks them), where they agree ("", 0: the process's)."""
        seen = set().union(*(self.threads.get(r, set()) for r in self._sources(row)[1]))
        names = {name for _, name in seen}
        tids = {tid for tid, _ in seen}
        name = next(iter(names)) if len(names) == 1 else ""
        return name, next(iter(tids)) if name and len(tids) == 1 else 0

    def _sources(self, row: Row) -> tuple[object, set[Row]]:
        """The rows whose copies give row its path: its own; a row with none
        (lost on a full ring: a path hash met once sends one), its siblings';
        by_chain, failing those, all its chain's. First, what names that set."""
        if row in self.paths:
            return row, {row}
        siblings = self.siblings.get(row[:4])
        if siblings or not self.by_chain:
            return ("siblings", row[:4]), siblings or set()
        return ("chain", row[0], row[3]), self.chain_rows.get((row[0], row[3]), set())

    def _paths_of(self, rows: Iterable[Row]) -> set[tuple[tuple[int, ...], str | None]]:
        return set().union(*(self.paths[r] for r in rows))

    def _same_functions(
        self, tgid: int, paths: set[tuple[tuple[int, ...], str | None]]
    ) -> tuple[tuple[int, ...], str | None] | None:
        """One of the paths when all run through the same functions, call sites
        apart (what a profile shows: CPython 3.13 calls one C function from two
        places of its evaluation loop as an instruction specializes); else None."""
        maps = self.process_maps(tgid, False)
        if maps is None:
            return None

        def functions(path: tuple[int, ...]) -> tuple[object, ...]:
            # a - 1: a return address may lie just past its function's end.
            return tuple(self.tables.function_at(maps, a - 1) or a for a in path)

        ordered = sorted(paths, key=lambda p: (p[0], p[1] or ""))
        if len({functions(p) for p, _ in ordered}) == 1 and len({s for _, s in ordered}) == 1:
            return ordered[0]
        return None

    def _path(self, row: Row) -> tuple[tuple[int, ...], str | None]:
        """The row's calling stack: its copies' unwound path when they agree; where
        they differ, the frames they share and a marker (never one path picked).
        A row with no copy (lost on a full ring: a path hash met once sends
        one) takes its siblings' paths, as one row of theirs would have; by_chain,
        failing those, all its chain's."""
        which, sources = self._sources(row)
        answer = self._answers.get(which)
        if answer is None:
            answer = self._answers[which] = self._path_of(row, sources)
        return answer

    def _path_of(self, row: Row, sources: set[Row]) -> tuple[tuple[int, ...], str | None]:
        caller = 0 if self.by_chain else row[2]  # by_chain: the stack pointer there
        paths = self._paths_of(sources)
        if not paths:
            return ((caller,) if caller else ()), None
        if len(paths) == 1:
            return next(iter(paths))
        same = self._same_functions(row[0], paths)
        if same is not None:
            return same
        stacks = [p for p, _ in paths]
        shared = 0
        while all(len(p) > shared and p[shared] == stacks[0][shared] for p in stacks):
            shared += 1
        return stacks[0][:shared], MERGED
