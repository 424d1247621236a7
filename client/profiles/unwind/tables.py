"""Unwind tables per mapped file, shared by every process that maps it, in
memory and on disk, and the per-process lookup pc -> (table, delta).

A file is read through the process's root (/proc/PID/root for a process in
another mount namespace, as ProcessMaps records it), and only if it is still
the file that was mapped (same inode). Its table is keyed in memory by
its identity (fileid.FileId: device, inode, size, mtime, ctime) and on disk
by build-id plus that identity (fileid.cache_key: a build-id alone is a
claim any file can make); files owned by neither root nor the caller are
parsed but never written to nor read from the disk cache (fileid.may_cache).
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Literal

from gfxbpf.client.profiles.elfinfo import DEBUG_ROOT, ElfInfo
from gfxbpf.client.profiles.fileid import (
    FileId,
    cache_key,
    may_cache,
    open_regular,
    open_regular_path,
)
from gfxbpf.client.profiles.procmaps import Mapping, ProcessMaps
from gfxbpf.client.profiles.unwind import build, cache
from gfxbpf.client.profiles.unwind.compiled import NO_RULE, FileTable, Rule, Table
from gfxbpf.client.profiles.unwind.lazy import LAZY_MAX_BYTES, open_lazy
from gfxbpf.client.profiles.unwind.result import Stop

__all__ = ["Located", "UnwindTables"]

# Where a pc lies: its file's table (None: none usable), what to add to the pc
# to get the file's virtual address, and why there is no table (JIT, no file).
Located = tuple[Table | None, int, Stop | None]
# The tables kept in memory, by their arrays' size (libLLVM's is about 10 MB).
MEMORY_LIMIT = 512 << 20
# Code reads kept for the stack scan before the cache starts over.
_CODE_CACHE = 1 << 16

# Call-frame information parsed per run from files neither the caller nor
# root owns (fileid.may_cache): another user's files are built as she likes,
# and each of her files may hold up to build.MAX_CFI_BYTES.
FOREIGN_CFI_BYTES = 16 << 20

_UNSET: Located = (None, 0, Stop.NO_FILE)
STEP_LIMIT = 1 << 16  # remembered steps per process


class _ProcIndex:
    """One process's executable mappings, each resolved to its table on first use."""

    def __init__(self, tables: UnwindTables, maps: ProcessMaps) -> None:
        self.maps, self.mappings, self.tables = maps, maps.mappings, tables
        self.starts = [m.start for m in maps.mappings]
        self.ends = [m.end for m in maps.mappings]
        self.entries: list[Located | None] = [
            _UNSET if m.executable else None for m in maps.mappings
        ]
        # (pc << 1 | exact) -> where pc lies and its rule: samples of one
        # process meet the same few hundred pcs thousands of times.
        self.steps: dict[int, tuple[Located | None, Rule]] = {}

    def step(self, pc: int, exact: bool) -> tuple[Located | None, Rule]:
        """Where pc lies (None: not code) and the rule for the step from it; a
        return address (not exact) is looked up at the call, pc - 1."""
        key = pc << 1 | exact
        got = self.steps.get(key)
        if got is None:
            where, rule = self.resolve(pc), NO_RULE
            if where is not None and where[0] is not None:
                rule = where[0].rule(pc + where[1] - (not exact))
            if len(self.steps) >= STEP_LIMIT:
                self.steps.clear()
            got = self.steps[key] = where, rule
        return got

    def resolve(self, pc: int) -> Located | None:
        """None if pc is in no executable mapping."""
        i = bisect.bisect_right(self.starts, pc) - 1
        if i < 0 or pc >= self.ends[i]:
            return None
        got = self.entries[i]
        if got is _UNSET:
            got = self.entries[i] = self.tables.locate(self.maps, self.mappings[i])
        return got


class UnwindTables:
    """Compiled tables of every file the unwound processes map. One per client
    run (or longer: tables stay valid as long as their files are unchanged)."""

    def __init__(
        self,
        cache_dir: str | None = None,
        *,
        debug_root: str = DEBUG_ROOT,
        memory_limit: int = MEMORY_LIMIT,
        lazy: bool = True,
    ) -> None:
        self.cache_dir = cache_dir or cache.default_cache_dir()
        self.debug_root = debug_root
        self.memory_limit = memory_limit
        self._files: OrderedDict[FileId, Table | None] = OrderedDict()
        self._procs: dict[int, _ProcIndex] = {}
        self._vdso: Table | None | Literal[False] = False  # False: not read yet
        self.problems: dict[str, str] = {}  # file -> why it has no table
        self.bad: set[str] = set()  # files whose table was refused (build.BadTable)
        self.foreign = build.Budget(FOREIGN_CFI_BYTES)
        self.parsed = 0  # files whose CFI was parsed by this object
        self.cache_hits = 0  # ... and tables loaded from the disk cache instead
        self.parse_seconds = 0.0
        # Large files are served by their .eh_frame_hdr while compiled aside.
        self.lazy = lazy
        self.compiling: list[threading.Thread] = []
        # Code bytes read for the stack scan, by (path, inode, file offset, n).
        self._code: dict[tuple[str, int, int, int], bytes | None] = {}

    def resolver(self, maps: ProcessMaps) -> Callable[[int], Located | None]:
        """pc -> where it lies (Located), or None if it is not code. Rebuilt
        when the snapshot's mappings change (ProcessMaps.merge)."""
        idx = self._procs.get(maps.pid)
        if idx is None or idx.maps is not maps or idx.mappings is not maps.mappings:
            idx = self._procs[maps.pid] = _ProcIndex(self, maps)
        return idx.resolve

    def stepper(self, maps: ProcessMaps) -> Callable[[int, bool], tuple[Located | None, Rule]]:
        """(pc, exact) -> (where pc lies, or None if not code; the rule for the
        step from it), remembered while the snapshot's mappings stay the same."""
        self.resolver(maps)
        return self._procs[maps.pid].step

    def prepare(self, maps: ProcessMaps) -> None:
        """Build (or load) the tables of every executable mapping now: call it
        while sampling (e.g. in a thread), so a large library's first parse
        does not stall the end of a profile."""
        resolve = self.resolver(maps)
        for m in maps.mappings:
            if m.executable:
                resolve(m.start)

    def locate(self, maps: ProcessMaps, m: Mapping) -> Located:
        """The table of the executable mapping m, and the pc -> vaddr delta."""
        if m.path == "[vdso]":
            vdso = self._vdso_table()
            seg = vdso.vaddr_delta(m.offset, m.offset + m.end - m.start) if vdso else None
            if vdso is None or seg is None:
                return None, 0, Stop.NO_CFI
            return vdso, m.offset - m.start + seg, None
        if not m.is_file:
            return None, 0, (Stop.NO_CFI if m.path.startswith("[") else Stop.JIT)
        local = maps.local_path(m)
        table = self.file_table(local, m.inode)
        if table is None:
            return None, 0, (Stop.BAD_TABLE if local in self.bad else Stop.NO_FILE)
        seg = table.vaddr_delta(m.offset, m.offset + m.end - m.start)
        if seg is None:
            self.problems.setdefault(m.file_path, "maps code outside its load segments")
            return None, 0, Stop.NO_FILE
        return table, m.offset - m.start + seg, None

    def _vdso_table(self) -> Table | None:
        """The vDSO's table, from the client's own copy: every process on the
        machine maps the same image (clock_gettime and friends have CFI)."""
        if self._vdso is False:
            from gfxbpf.client.profiles.vdso import own_vdso_image  # only when a stack needs it

            self._vdso = None
            image = own_vdso_image()
            if image:
                fd = os.memfd_create("gfxbpf-vdso", os.MFD_CLOEXEC)
                try:
                    os.write(fd, image)
                    path = open_regular_path(fd)
                    info = build.file_facts(path)
                    self._vdso = build.compile_file(path, info, "") if info else None
                finally:
                    os.close(fd)
        return self._vdso

    def function_at(self, maps: ProcessMaps, pc: int) -> tuple[str, int] | None:
        """(file path, file offset of the function's start) of the FDE holding
        pc: how a stripped file's frames are grouped by function."""
        m = maps.find(pc)
        if m is None or not m.executable or not m.is_file:
            return None
        table, delta, _ = self.locate(maps, m)
        found = table.function(pc + delta) if table is not None else None
        if table is None or found is None:
            return None
        start = table.file_offset(found[0])
        return (m.file_path, start) if start is not None else None

    def code_before(self, maps: ProcessMaps, addr: int, n: int) -> bytes | None:
        """The n bytes of code that end at addr, read from the file mapped
        there (None: not one file mapping, unreadable, or replaced)."""
        m = maps.find(addr - 1)
        if m is None or not m.executable or not m.is_file or addr - n < m.start:
            return None
        key = (m.path, m.inode, m.offset + addr - n - m.start, n)
        if key not in self._code:
            if len(self._code) >= _CODE_CACHE:
                self._code.clear()
            self._code[key] = _read_at(maps.local_path(m), m.inode, key[2], n)
        return self._code[key]

    def file_table(self, path: str, inode: int | None = None) -> Table | None:
        """The table of the file at path (None if unreadable, not ELF, or no
        longer the inode that was mapped). The file is opened once without
        blocking (fileid.open_regular) and parsed through that descriptor."""
        try:
            fd, st = open_regular(path)
        except OSError as e:
            self.problems.setdefault(path, f"cannot be read ({e.strerror or e})")
            return None
        try:
            if inode is not None and st.st_ino != inode:
                self.problems.setdefault(path, "was replaced on disk after it was mapped")
                return None
            key = FileId.of(st)
            if key in self._files:
                self._files.move_to_end(key)
                return self._files[key]
            table = self._load_or_build(open_regular_path(fd), path, st)
        finally:
            os.close(fd)
        self._files[key] = table
        self._trim()
        return table

    def _load_or_build(self, fd_path: str, path: str, st: os.stat_result) -> Table | None:
        trusted = may_cache(st)
        info = build.file_facts(fd_path)
        if info is None:
            self.problems.setdefault(path, "is not a readable ELF file")
            return None
        key = cache_key(info.build_id, st)
        if trusted:
            table = cache.load(self.cache_dir, key)
            if table is not None:
                self.cache_hits += 1
                return table
        if self.lazy:
            # Past build's limits only files root or the caller owns: another
            # user's draws on self.foreign, whole.
            most = LAZY_MAX_BYTES if trusted else build.MAX_CFI_BYTES
            lazy = open_lazy(fd_path, info.segments, most)
            if lazy is not None:  # serve it now, compile the whole table aside
                if lazy.whole():
                    self._compile_aside(fd_path, path, st, info, key)
                return lazy
        table = self._compile(fd_path, path, info, trusted)
        if table is None:
            self.problems.setdefault(path, "is not a readable ELF file")
            return None
        if not table.starts:
            self.problems.setdefault(path, "has no call-frame information")
        if trusted:
            cache.store(self.cache_dir, key, table)
        return table

    def _compile(self, fd_path: str, path: str, info: ElfInfo, trusted: bool) -> FileTable | None:
        """The file's whole table; None (path in self.bad) if it is refused.
        Another user's file draws on self.foreign. Never raises: the file
        may be built to make a parser fail."""
        began = time.perf_counter()
        budget = None if trusted else self.foreign
        try:
            return build.compile_file(fd_path, info, self.debug_root, path, budget)
        except Exception as e:  # BadTable, or whatever else a crafted file reaches
            why = str(e) if isinstance(e, build.BadTable) else f"{type(e).__name__}: {e}"
            self.problems.setdefault(path, f"has a call-frame table refused: {why}")
            self.bad.add(path)
            return None
        finally:
            self.parse_seconds += time.perf_counter() - began
            self.parsed += 1

    def _compile_aside(
        self, fd_path: str, path: str, st: os.stat_result, info: ElfInfo, key: str
    ) -> None:
        """Compile a large file's whole table in a thread (the walk meanwhile
        parses FDEs one at a time), then keep it in memory and on disk."""
        fd = os.dup(int(fd_path.rsplit("/", 1)[1]))

        def work() -> None:
            try:
                table = self._compile(open_regular_path(fd), path, info, may_cache(st))
            finally:
                os.close(fd)
            if table is not None:
                self._files[FileId.of(st)] = table  # later lookups of this file use it
                if may_cache(st):
                    cache.store(self.cache_dir, key, table)

        worker = threading.Thread(target=work, name="gfxbpf-unwind-compile", daemon=True)
        self.compiling.append(worker)
        worker.start()

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the tables being compiled aside (tests, benchmarks)."""
        for worker in self.compiling:
            worker.join(timeout)

    def _trim(self) -> None:
        total = sum(t.nbytes() for t in self._files.values() if t is not None)
        while total > self.memory_limit and len(self._files) > 1:
            _, old = self._files.popitem(last=False)
            total -= old.nbytes() if old is not None else 0


def _read_at(path: str, inode: int, offset: int, n: int) -> bytes | None:
    """n bytes at offset of the file at path, if it is still that inode."""
    try:
        fd, st = open_regular(path)
    except OSError:
        return None
    try:
        return os.pread(fd, n, offset) if st.st_ino == inode else None
    except OSError:
        return None
    finally:
        os.close(fd)
