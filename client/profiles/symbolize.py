"""Raw stacks (addresses) -> a Profile (function names), in the client.

address -> mapping (/proc/PID/maps snapshot) -> file offset -> ELF virtual
address (PT_LOAD segments) -> function (.symtab, else a separate debug file's,
else .dynsym), or a perf map entry for JIT code (Python 3.12+ -X perf).
Tables come from symtab.py's on-disk cache when the file was seen before.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal

from gfxbpf.client.profiles import fileid, symtab
from gfxbpf.client.profiles.demangle import demangle
from gfxbpf.client.profiles.elfinfo import DEBUG_ROOT, DebugFile, open_debug_file, read_info
from gfxbpf.client.profiles.elfsyms import MAX_NAME_BYTES, function_ranges
from gfxbpf.client.profiles.model import (
    KERNEL_FRAME,
    LOST_FRAME,
    UNITS,
    UNKNOWN_FRAME,
    FrameInfo,
    Profile,
    RawStack,
    Thread,
)
from gfxbpf.client.profiles.procmaps import Mapping, ProcessMaps
from gfxbpf.client.profiles.python.mixed import mix
from gfxbpf.client.profiles.python.records import parse_frame_name
from gfxbpf.client.profiles.stackcheck import MAX_DEPTH, Kind, StackCheck, classify
from gfxbpf.client.profiles.unwind.result import CopySize, marker_frame
from gfxbpf.client.profiles.vdso import own_vdso_table

if TYPE_CHECKING:
    from gfxbpf.client.profiles.unwind.tables import UnwindTables

__all__ = ["Symbolizer"]

# Function names read per run from files neither the caller nor root owns
# (fileid.may_cache); each file's are bounded by elfsyms.MAX_NAME_BYTES.
FOREIGN_NAME_BYTES = 64 << 20
_UNBOUNDED = 1 << 62

# A named frame and the file it lies in (a path; None if unknown), for the notes.
_Frame = tuple[str, str | None]


class Symbolizer:
    def __init__(
        self,
        cache_dir: str | None = None,
        *,
        debug_root: str = DEBUG_ROOT,
        unwind_tables: UnwindTables | None = None,
    ) -> None:
        self.cache_dir = cache_dir or symtab.default_cache_dir()
        self._own_cache = cache_dir is not None  # a caller's folder: unwind tables go in it too
        self.debug_root = debug_root
        # The unwinder's tables (shared with it when given): their FDE ranges
        # group a stripped file's addresses by function. Made on first need.
        self._unwind_tables = unwind_tables
        self._procs: dict[int, ProcessMaps] = {}
        # a file's identity -> its table (None: not usable)
        self._tables: dict[fileid.FileId, symtab.SymbolTable | None] = {}
        self._mapped: dict[tuple[str, int], symtab.SymbolTable | None] = {}  # (path, inode)
        self._frames: dict[tuple[int, int], _Frame] = {}
        # (pid, sampled, user addresses) -> (its StackCheck kind, names root first)
        self._users: dict[tuple[int, bool, tuple[int, ...]], tuple[Kind, tuple[str, ...]]]
        self._users = {}
        self._problems: dict[str, str] = {}  # file -> why its symbols could not be read
        # Native frame name -> the file it was found in (the first, if two hold
        # the name) and whether the name is a symbol of that file; a file's
        # build id by identity and by path: pprof's mappings.
        self._objects: dict[str, tuple[str, bool]] = {}
        self._file_ids: dict[fileid.FileId, str] = {}
        self._build_ids: dict[str, str] = {}
        self.foreign_names = FOREIGN_NAME_BYTES  # left for names from others' files
        self._vdso: symtab.SymbolTable | None | Literal[False] = False  # False: not read yet
        # Frames a stack table keeps (its value size / 8): a stack that long was cut.
        # Set it before the first stack: the kinds cached in _users depend on it.
        self.stack_depth = MAX_DEPTH
        self.parsed = 0  # symbol tables read from ELF files by this symbolizer
        self.cache_hits = 0  # ... and loaded from the on-disk cache instead

    def add_process(self, pid: int, maps: ProcessMaps) -> None:
        """Call while the process lives; calling again adds what a later snapshot saw."""
        if pid not in self._procs:
            self._procs[pid] = maps
        elif not self._procs[pid].merge(maps):
            return  # nothing new: the names found so far still hold
        self._frames = {k: v for k, v in self._frames.items() if k[0] != pid}
        self._users = {k: v for k, v in self._users.items() if k[0] != pid}

    def warm(self, pid: int, stacks: Iterable[tuple[int, ...]]) -> None:
        """Name these user stacks' frames now (while sampling: the symbol tables
        load and the names are cached), so symbolize() after it has less to do."""
        maps = self._procs.get(pid)
        if maps is None:
            return
        for user in stacks:
            self._user(pid, maps, user, True)

    def symbolize(
        self,
        raw: Iterable[RawStack],
        unit: str,
        period_ns: int | None = None,
        duration_s: float | None = None,
        copy: CopySize | None = None,
    ) -> Profile:
        """copy: the size of the stack copies the stacks were unwound from (the
        notes then know what could give more of a cut stack)."""
        if unit not in UNITS:
            raise ValueError(f"unit must be one of {', '.join(UNITS)}, not {unit!r}")
        threads: dict[tuple[Thread, tuple[str, ...]], int] = {}
        check = StackCheck(max_depth=self.stack_depth)
        if copy is not None:
            check.stops.copy = copy
        python: dict[str, int] = {}  # the Python frames' names -> their functions' first lines
        for r in raw:
            key = (self._thread(r), self._stack(r, check))
            threads[key] = threads.get(key, 0) + r.weight
            python.update((n, 0) for run in r.python for n in run if n not in python)
            python.update((n, first) for n, first in r.python_starts if first)
        names = {name for _, frames in threads for name in frames}
        readable = demangle(names)
        if readable:
            named: dict[tuple[Thread, tuple[str, ...]], int] = {}
            for (who, frames), w in threads.items():
                key = (who, tuple(_clean(readable.get(n, n)) for n in frames))
                named[key] = named.get(key, 0) + w
            threads = named
        stacks: dict[tuple[str, ...], int] = {}
        for (_, frames), w in threads.items():
            stacks[frames] = stacks.get(frames, 0) + w
        infos = self._frame_infos(names, readable, {_clean(n): s for n, s in python.items()})
        return Profile(
            stacks=stacks,
            unit=unit,
            period_ns=period_ns,
            duration_s=duration_s,
            notes=check.notes() + self._problem_notes(check.objects),
            threads=threads,
            frames=infos,
            objects={i.obj: self._build_ids.get(i.obj, "") for i in infos.values() if i.obj},
        )

    def _thread(self, r: RawStack) -> Thread:
        maps = self._procs.get(r.pid)
        # The process's name is its main thread's: a sample of that thread names it too.
        process = maps.comm if maps else r.comm if r.tid == r.pid else ""
        return Thread(r.pid, r.tid, _clean(process), _clean(r.comm))

    def _frame_infos(
        self, names: set[str], readable: dict[str, str], python: dict[str, int]
    ) -> dict[str, FrameInfo]:
        """What each frame name (readable: its demangled form) stands for: a
        Python frame's function, file, line and first line (python: name ->
        first line); a native one's symbol and file."""
        out: dict[str, FrameInfo] = {}
        for raw in names:
            name = _clean(readable.get(raw, raw))
            where = parse_frame_name(name) if name in python else None
            if where is not None:
                function, file, line = where
                out[name] = FrameInfo(function, file=file, line=line, start_line=python[name])
            elif raw in self._objects:
                obj, symbol = self._objects[raw]
                out[name] = FrameInfo(name, system_name=raw if symbol else "", obj=obj)
        return out

    def _stack(self, r: RawStack, check: StackCheck) -> tuple[str, ...]:
        maps = self._procs.get(r.pid)
        comm = r.comm or (maps.comm if maps else "") or f"[pid {r.pid}]"
        names: tuple[str, ...] = (_clean(comm),)
        if r.thread is not None:
            names += (f"[thread {r.thread}]",)
        if maps is None and r.user:
            check.unmapped += r.weight
        if r.user_error is not None and not r.user:
            names += (LOST_FRAME,)
            check.add_lost(r.user_error, r.weight)
        elif r.user:
            kind, user_names = self._user(r.pid, maps, r.user, r.leaf is None)
            if maps is not None and r.unwind_scanned:
                check.stops.scanned += r.weight
            if maps is not None and r.unwind_stop is not None:
                check.add_stopped(kind, r.unwind_stop, r.weight)
            elif maps is not None:  # else counted as unmapped, not as a cut stack
                check.add_kind(("complete", *kind[1:]) if r.unwound else kind, r.weight)
            if r.unwind_stop is not None:  # one frame at the root end says why it stops
                names += (marker_frame(r.unwind_stop),)
            names += mix(user_names, _python(r)) if r.python else user_names
        if r.python and not r.user:
            names += mix((), _python(r))
        if r.leaf and names[-1] != _clean(r.leaf):
            names += (_clean(r.leaf),)
        if r.kernel:
            names += (KERNEL_FRAME,)
        return names

    def _user(
        self, pid: int, maps: ProcessMaps | None, user: tuple[int, ...], sampled: bool
    ) -> tuple[Kind, tuple[str, ...]]:
        """A user stack's StackCheck kind, and its frame names root first, made
        safe to write; cached: a stack comes back once per count row naming it."""
        key = (pid, sampled, user)
        got = self._users.get(key)
        if got is None:
            # A return address is looked up at the call before it (a call can be
            # a function's last instruction). All are return addresses but the
            # innermost of a sampled stack; at a probe (leaf) it is one too.
            ip = 0 if sampled else -1
            frames = [self._frame(pid, maps, a if i == ip else a - 1) for i, a in enumerate(user)]
            frames.reverse()
            kind = classify(frames, self.stack_depth)
            got = self._users[key] = (kind, tuple(_clean(n) for n, _ in frames))
            self._note_objects(frames, maps.perf_map_path if maps else None)
        return got

    def _note_objects(self, frames: list[_Frame], perf_map: str | None) -> None:
        for name, path in frames:
            if path is not None and path != perf_map and not path.startswith("["):
                self._objects.setdefault(_clean(name), (path, not name.startswith("[")))

    def _frame(self, pid: int, maps: ProcessMaps | None, addr: int) -> _Frame:
        key = (pid, addr)
        got = self._frames.get(key)
        if got is None:
            got = self._frames[key] = self._name(maps, addr)
        return got

    def _name(self, maps: ProcessMaps | None, addr: int) -> _Frame:
        if maps is None:
            return UNKNOWN_FRAME, None
        m = maps.find(addr)
        if m is None or not m.is_file:
            jit = maps.find_perf(addr)
            if jit is not None:
                return jit.name, maps.perf_map_path
            if m is not None and m.path == "[vdso]":
                return self._vdso_name(addr - m.start), m.path
            if m is not None and m.path.startswith("["):
                return m.path, m.path  # [heap], [stack], ...
            return UNKNOWN_FRAME, None
        off = addr - m.start + m.offset
        table = self._table(m, maps.local_path(m))
        if table is not None:
            vaddr = table.vaddr(off)
            if vaddr is not None:
                name = table.lookup(vaddr)
                if name is not None:
                    return name, m.file_path
        if m.executable:  # no symbol: the FDE's function start, as perf does for stripped code
            found = self._fde_tables().function_at(maps, addr)
            if found is not None:
                off = found[1]
        return f"[{os.path.basename(m.file_path)}+{off:#x}]", m.file_path

    def _fde_tables(self) -> UnwindTables:
        if self._unwind_tables is None:
            from gfxbpf.client.profiles.unwind.tables import UnwindTables

            folder = os.path.join(self.cache_dir, "unwind") if self._own_cache else None
            self._unwind_tables = UnwindTables(folder, debug_root=self.debug_root)
        return self._unwind_tables

    def _vdso_name(self, offset: int) -> str:
        if self._vdso is False:
            self._vdso = own_vdso_table()
        vaddr = self._vdso.vaddr(offset) if self._vdso else None
        name = self._vdso.lookup(vaddr) if self._vdso and vaddr is not None else None
        return name or "[vdso]"

    def _table(self, m: Mapping, path: str) -> symtab.SymbolTable | None:
        key = (path, m.inode)
        if key not in self._mapped:  # one stat per file, not per address
            self._mapped[key] = self._stat_and_load(m, path)
        return self._mapped[key]

    def _stat_and_load(self, m: Mapping, path: str) -> symtab.SymbolTable | None:
        # The path may be another user's: a FIFO there must not hang us, and
        # what is parsed must be the file whose identity names the table.
        try:
            fd, st = fileid.open_regular(path)
        except OSError as e:
            self._problems.setdefault(m.file_path, f"cannot be read ({e.strerror or e})")
            return None
        try:
            if st.st_ino != m.inode:
                # Replaced on disk (an upgrade) since it was mapped: its symbols would lie.
                self._problems.setdefault(m.file_path, "was replaced on disk after it was mapped")
                return None
            local = fileid.FileId.of(st)
            if local not in self._tables:
                self._tables[local] = self._load_or_parse(path, fd, st)
                if self._tables[local] is None:
                    self._problems.setdefault(m.file_path, "is not a readable ELF file")
            if local in self._file_ids:
                self._build_ids[m.file_path] = self._file_ids[local]
            return self._tables[local]
        finally:
            os.close(fd)

    def _load_or_parse(self, path: str, fd: int, st: os.stat_result) -> symtab.SymbolTable | None:
        """The table of the file open as fd (path: where it was found, for its debug file)."""
        opened = fileid.open_regular_path(fd)
        info = read_info(opened)
        if info is None:
            return None
        if info.build_id:
            self._file_ids[fileid.FileId.of(st)] = info.build_id
        # Another user's file is parsed for this profile only: it could be
        # rewritten in place, and its build-id is whatever it claims.
        cached = fileid.may_cache(st)
        key = fileid.cache_key(info.build_id, st)
        debug = None
        if not info.has_symtab:
            # Stripped: a debug file installed later must not be hidden by the
            # table cached without it, so the key says which one this is.
            debug = open_debug_file(path, info, self.debug_root)
            key += ".debug" if debug else ".dynsym"
        # Names kept from another user's files are bounded per file and per
        # run, as the unwinder bounds their tables: her files may be built to
        # fill memory. The caller's own and root's are not: libtorch_cpu.so's
        # .strtab alone is 76 MB.
        limit = _UNBOUNDED if cached else min(MAX_NAME_BYTES, self.foreign_names)
        try:
            table = symtab.load(self.cache_dir, key) if cached else None
            if table is not None:
                self.cache_hits += 1
                return table
            # The debug file's .symtab, plus the exported names it may lack.
            funcs, debug_ok = _debug_ranges(debug, limit) if debug else ([], True)
        finally:
            if debug is not None:
                os.close(debug.fd)
        funcs += function_ranges(opened, limit - _name_bytes(funcs))
        if not cached:
            self.foreign_names -= _name_bytes(funcs)
        self.parsed += 1
        table = symtab.SymbolTable.build(info.segments, funcs)
        if cached and debug_ok:
            symtab.store(self.cache_dir, key, table)
        return table

    def _problem_notes(self, used: set[str]) -> list[str]:
        return [
            f"frames in {path} are named by file offset only: it {why}"
            for path, why in sorted(self._problems.items())
            if path in used
        ]


def _debug_ranges(debug: DebugFile, limit: int) -> tuple[list[tuple[int, int, str]], bool]:
    """A debug file's functions (names up to limit bytes), read through the
    descriptor that was checked, and whether they may be cached (fileid.may_cache)."""
    try:
        st = os.fstat(debug.fd)
    except OSError:
        return [], False
    return function_ranges(fileid.open_regular_path(debug.fd), limit), fileid.may_cache(st)


def _name_bytes(funcs: list[tuple[int, int, str]]) -> int:
    return sum(len(name) for _, _, name in funcs)


def _python(r: RawStack) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(_clean(n) for n in run) for run in r.python)


def _clean(name: str) -> str:
    """Frame names end up in line- and ';'-separated formats."""
    if ";" in name or "\n" in name or "\r" in name:
        return name.replace(";", ":").replace("\n", " ").replace("\r", " ")
    return name
