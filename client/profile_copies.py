"""Stack copies (program `stackcopy`) read while sampling and unwound here.

Each record of the `stack_copies` ring buffer (bpf/programs/gfx_ucopy.h,
struct ustack_rec) holds a sample's user registers and the top of its user
stack. They are read as they come, so the 2 MiB ring keeps up at 999 Hz, and
each is unwound at once by the call-frame information of the files the
process maps (gfxbpf.client.profile.unwind), so memory holds one tuple of
return addresses per distinct stack, not the copies.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from gfxbpf.client import profile
from gfxbpf.client.errors import ProtocolError

if TYPE_CHECKING:
    from gfxbpf.client.events import EventStream
    from gfxbpf.client.profile.model import RawStack
    from gfxbpf.client.profile.procmaps import ProcessMaps
    from gfxbpf.client.profile.unwind import UnwindTables

# struct ustack_rec's header: tgid, tid, flags, size, ip, sp, bp, entry_ns,
# elapsed, function, pad, comm[16]; the stack bytes follow.
HEADER = struct.Struct("<4I3QQQII16s")
FLAG_KERNEL = 1  # sampled in kernel mode: the registers are the user ones it entered with
FLAG_SHORT = 2  # the stack ended (an unreadable page) before the copy's size

# Where a sample's process maps could not be read (it exited before the
# first snapshot, or is not the caller's): the reason shown as its one frame.
NO_MAPS = "process gone before its maps were read"

# (tgid, kernel mode, comm, frames innermost first, why the unwind stopped)
StackKey = tuple[int, bool, str, tuple[int, ...], str | None]


class CopyReader:
    """Drains a stackcopy attachment's ring buffer and unwinds every record."""

    def __init__(
        self,
        stream: EventStream,
        process_maps: Callable[[int], ProcessMaps | None],
        tables: UnwindTables,
        pids: Sequence[int] = (),
    ) -> None:
        self.stream = stream
        self.process_maps = process_maps  # tgid -> its maps (captured on first sight)
        self.tables = tables
        self.wanted = set(pids)
        self.counts: dict[StackKey, int] = {}
        self.records = 0  # every record read, those of unwanted pids included
        self.samples = 0  # records kept
        self.short = 0  # records whose stack ended before the copy's size
        self._comms: dict[bytes, str] = {}

    def drain(self, timeout: float = 0.0) -> int:
        """Read what the ring holds (waiting up to timeout for the first); the count."""
        records = self.stream.poll_raw(timeout)
        for rec in records:
            self.add(rec)
        return len(records)

    def add(self, rec: bytes) -> None:
        """Unwind one record into the counts."""
        from gfxbpf.client.profile.unwind import UserRegs, unwind

        if len(rec) < HEADER.size:
            raise ProtocolError(
                f"a {len(rec)}-byte stack copy record: this gfxclient expects at least "
                f"{HEADER.size} (the broker runs another version of stackcopy: update gfxclient)"
            )
        tgid, _tid, flags, size, ip, sp, bp, _t, _e, _f, _pad, comm = HEADER.unpack_from(rec)
        self.records += 1
        if self.wanted and tgid not in self.wanted:
            return
        self.samples += 1
        self.short += bool(flags & FLAG_SHORT)
        name = self._comms.get(comm)
        if name is None:
            name = self._comms[comm] = comm.split(b"\0", 1)[0].decode("utf-8", "replace")
        maps = self.process_maps(tgid)
        if maps is None:
            key: StackKey = (tgid, bool(flags & FLAG_KERNEL), name, (), NO_MAPS)
        else:
            stack = rec[HEADER.size : HEADER.size + size]
            result = unwind(UserRegs(ip, sp, bp), stack, maps, self.tables)
            stop = None if result.stop is None else str(result.stop)
            key = (tgid, bool(flags & FLAG_KERNEL), name, result.frames, stop)
        self.counts[key] = self.counts.get(key, 0) + 1

    def raw_stacks(self) -> list[RawStack]:
        """The samples as the symbolizer takes them, one RawStack per distinct stack."""
        out = []
        for (tgid, kernel, comm, frames, stop), weight in self.counts.items():
            lost = stop if not frames else None  # nothing unwound: say why, as one frame
            out.append(
                profile.RawStack(
                    pid=tgid,
                    user=frames,
                    kernel=kernel,
                    weight=weight,
                    comm=comm,
                    user_error=_error(lost) if lost else None,
                    unwind_stop=stop if frames else None,
                )
            )
        return out


def _error(stop: str) -> str:
    """Why a sample has no user frame at all, in the summary's words."""
    if stop == NO_MAPS:
        return NO_MAPS
    return f"no user frame unwound ({stop})"
