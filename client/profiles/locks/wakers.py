"""`profile --off-cpu --wakers` (program `offwake`): each wait joined with
the stack of the thread that woke it, as offwaketime shows them.

The program sends a waker record just before the wait's own record, keyed by
the woken thread and the wait's entry_ns. A waker of the caller's own
processes comes with its registers and a stack copy, unwound here like the
wait's; another user's process or the kernel (an interrupt, a kernel thread)
comes as its kind alone, shown as one marker frame, never a stack. In the
profile, the waker's frames sit above the wait's leaf frame after a `--`
frame, innermost first (the waking function, then its callers, then the
waker's process name):

    app;main;wait_for_work;pthread_cond_wait;...;[wait: futex];--;
        __futex_wake;...;signal_work;worker;start_thread;app    (one line)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gfxbpf.client.profiles.copies import CopyReader, StackKey, parse_header
from gfxbpf.client.profiles.locks.shape import rekey

if TYPE_CHECKING:
    from gfxbpf.client.events import EventStream
    from gfxbpf.client.profiles.copies import MapsOf
    from gfxbpf.client.profiles.engine.run import Run
    from gfxbpf.client.profiles.model import Profile
    from gfxbpf.client.profiles.python import records as py
    from gfxbpf.client.profiles.symbolize import Symbolizer
    from gfxbpf.client.profiles.unwind import UnwindTables

# Waker records' flags (catalog/programs/offwake.bpf.c).
FLAG_WAKER = 8192
FLAG_WAKER_OTHER = 16384
FLAG_WAKER_KERNEL = 32768
OTHER_FRAME = "[woken by another user's process]"
KERNEL_FRAME = "[woken by the kernel]"
SEPARATOR = "--"  # between a wait's frames and its waker's, as offwaketime writes it
# The wait's leaf, tagged with its waker's index until join_wakers() names it.
_TAGGED = re.compile(r"^(.*) \[woken by #(\d+)\]$")


class WakerReader(CopyReader):
    """An off-CPU profile's records, each wait keyed by its waker too."""

    def __init__(
        self,
        stream: EventStream,
        process_maps: MapsOf,
        tables: UnwindTables,
        pids: Sequence[int] = (),
        codes: py.CodeBook | None = None,
    ) -> None:
        super().__init__(stream, process_maps, tables, pids, codes, waits=True)
        self.wakers: list[StackKey | str] = []  # a waker's stack, or a marker frame
        self._index: dict[StackKey | str, int] = {}
        self._pending: dict[int, tuple[int, int]] = {}  # woken tid -> (entry_ns, waker)
        self._waker: int | None = None  # the waker of the wait being added
        self.woken_ns = {"yours": 0, "other": 0, "kernel": 0, "unknown": 0}

    def add(self, rec: bytes) -> None:
        """A waker record is held for its wait; a wait is keyed by its waker."""
        if self.python.held(rec):
            return
        _tgid, tid, flags, _s, _ip, _sp, _bp, ts, elapsed, function, _pad, _c = parse_header(rec)
        if flags & FLAG_WAKER:
            self._pending[function] = (ts, self._waker_index(rec, flags))
            return
        joined = self._pending.pop(tid, None)
        self._waker = joined[1] if joined is not None and joined[0] == ts else None
        before = self.samples
        super().add(rec)
        if self.samples > before:  # kept (a wanted process)
            self.woken_ns[self._kind(self._waker)] += elapsed

    def key_of(self, rec: bytes, pyframes: tuple[py.Frame, ...], leaf: str | None) -> StackKey:
        if self._waker is not None and leaf is not None:
            leaf = f"{leaf} [woken by #{self._waker}]"
        return super().key_of(rec, pyframes, leaf)

    def _waker_index(self, rec: bytes, flags: int) -> int:
        waker: StackKey | str
        if flags & FLAG_WAKER_KERNEL:
            waker = KERNEL_FRAME
        elif flags & FLAG_WAKER_OTHER:
            waker = OTHER_FRAME
        else:
            waker = super().key_of(rec, (), None)
        i = self._index.get(waker)
        if i is None:
            i = self._index[waker] = len(self.wakers)
            self.wakers.append(waker)
        return i

    def _kind(self, i: int | None) -> str:
        if i is None:
            return "unknown"
        waker = self.wakers[i]
        return "kernel" if waker == KERNEL_FRAME else "other" if waker == OTHER_FRAME else "yours"


def join_wakers(symbolizer: Symbolizer, r: Run, prof: Profile) -> None:
    """Name the wakers' stacks and put each above its waits' leaf frames."""
    reader = r.copies
    if not isinstance(reader, WakerReader):
        return
    own = {i: k for i, k in enumerate(reader.wakers) if isinstance(k, StackKey)}
    r.maps.capture({k.tgid for k in own.values()} - r.maps.seen)
    raw = [reader.raw_stack(k._replace(leaf=f"[waker #{i}]", tid=0), 1) for i, k in own.items()]
    named = symbolizer.symbolize(raw, "nanoseconds")
    frames: dict[int, tuple[str, ...]] = {
        i: (w,) for i, w in enumerate(reader.wakers) if isinstance(w, str)
    }
    for stack in named.stacks:
        m = re.match(r"^\[waker #(\d+)\]$", stack[-1])
        if m:  # root first, the leaf dropped: innermost first above the wait
            frames[int(m.group(1))] = tuple(reversed(stack[:-1]))
    prof.frames.update(named.frames)
    prof.objects.update(named.objects)
    rekey(prof, lambda stack: _join(stack, frames))
    total = sum(reader.woken_ns.values())
    if total:
        woken = reader.woken_ns.items()
        shares = ", ".join(f"{100 * ns / total:.1f}% {kind}" for kind, ns in woken)
        prof.notes.append(f"waits by waker: {shares} (unknown: no wake-up seen, e.g. preempted)")


def _join(stack: tuple[str, ...], frames: dict[int, tuple[str, ...]]) -> tuple[str, ...]:
    m = _TAGGED.match(stack[-1]) if stack else None
    if m is None:
        return stack
    waker = frames.get(int(m.group(2)), ("[waker not unwound]",))
    return (*stack[:-1], m.group(1), SEPARATOR, *waker)
