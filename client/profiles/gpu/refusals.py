"""Why a process's CUPTI injection library collects nothing: program
`cudakernels`' map `refused`, which the library's probe gfxcupti:refused
fills at each of its polls while another CUPTI client (torch.profiler,
Nsight Systems) holds CUPTI. The library says so on the process's stderr
too, but the user watching is often in another terminal."""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gfxbpf.client.profiles.gpu.maprows import struct_rows

if TYPE_CHECKING:
    from gfxbpf.client.handle import Attachment

MAP = "refused"
KEY = struct.Struct("<I")  # tgid
REFUSAL = struct.Struct("<QQiI")  # cudakernels.bpf.c struct refusal
# CUPTI's CUptiResult for what cuptiSubscribe answers while another client subscribes.
_RESULTS = {39: "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"}


@dataclass(frozen=True)
class Refusal:
    pid: int
    polls: int  # the library's polls refused while attached
    last_ns: int  # the last one, CLOCK_MONOTONIC
    result: int  # the last try's CUptiResult (0: it subscribed at last, collects now)
    poll_ms: int  # the library's poll period

    def current(self, now_ns: int) -> bool:
        """Still refused: the last try refused, within two polls (and a second) of now."""
        return bool(self.result) and now_ns - self.last_ns <= (2 * self.poll_ms + 1000) * 1_000_000

    def seconds(self) -> float:
        """About how long the library was kept from collecting."""
        return self.polls * self.poll_ms / 1000

    def note(self, now_ns: int) -> str:
        if self.current(now_ns):
            when = "collects nothing now"
            then = "; it retries at each poll and collects once that client lets go"
        else:
            when = "collected nothing for a while"
            then = "; it collects again since that client let go" if not self.result else ""
        why = _RESULTS.get(self.result, f"CUptiResult {self.result}") if self.result else ""
        return (
            f"pid {self.pid}: its CUPTI injection library {when} (about {self.seconds():.1f} s "
            f"while attached): another CUPTI client in that process (torch.profiler, Nsight "
            f"Systems) held CUPTI{f' ({why})' if why else ''}{then}"
        )

    def as_json(self, now_ns: int) -> dict[str, object]:
        return {
            "pid": self.pid,
            "polls": self.polls,
            "seconds": round(self.seconds(), 3),
            "result": self.result,
            "current": self.current(now_ns),
        }


def read_refusals(att: Attachment) -> list[Refusal]:
    """The map's rows, by pid ([] from a broker whose program has no such map)."""
    rows = struct_rows(att, MAP, KEY, REFUSAL)
    return sorted((Refusal(k[0], *v) for k, v in rows), key=lambda r: r.pid)


def notes(att: Attachment) -> list[str]:
    """One note per process whose library was refused while attached."""
    now = time.monotonic_ns()
    return [r.note(now) for r in read_refusals(att)]
