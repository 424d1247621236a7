"""`gfxclient watch cuda --by-python`: kernel launches per Python function.

Program `cuda` counts per function and process; which Python code made a
launch is a stack question, so this view takes a --stacks-at profile
(`ustackcopy`) on the launch entries of the cuda function table that the
target's libcuda defines, through the profiling engine's live profile
(client/profiles/engine/live.py): one attachment for the whole watch, read
every interval, so the counts stay exact. ustackcopy counts every call
exactly per (function, caller, Python chain hash) and sends a few copies per
row with the Python frames walked in the kernel; this view sums the rows per
innermost Python frame.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gfxbpf.catalog import cuda_api
from gfxbpf.client.cli.display import clip, humanize_count
from gfxbpf.client.errors import BrokerError, ClientError, UsageError
from gfxbpf.client.printable import printable
from gfxbpf.client.profiles.read import lost_count

if TYPE_CHECKING:
    from gfxbpf.client.broker import Broker
    from gfxbpf.client.profiles.engine.live import LiveProfile
    from gfxbpf.client.profiles.engine.request import ProfileRequest
    from gfxbpf.client.profiles.model import RawStack

PROGRAM = "ustackcopy"
NO_PYTHON = "[no Python frame]"  # launched from native code (or a Python it cannot read)


def launch_functions(library: str) -> list[str]:
    """The cuda table's launch functions that the library defines (ustackcopy
    attaches to each name it is given: one missing would fail the attach)."""
    from gfxbpf.client.profiles.elfsyms import function_ranges

    defined = {name for _, _, name in function_ranges(library)}
    names = [cuda_api.FUNCTIONS[i].name for i in cuda_api.by_role("launch")]
    found = [n for n in names if n in defined]
    if not found:
        raise UsageError(f"{library} defines none of the launch functions ({', '.join(names)})")
    return found


def attach(broker: Broker, args: argparse.Namespace) -> PythonLaunches:
    """A live --stacks-at profile of the target's libcuda launch functions."""
    from gfxbpf.client import libcuda
    from gfxbpf.client.profiles.engine.request import ProfileRequest

    if not args.pid:
        raise UsageError("watch cuda --by-python needs --pid PID: a Python process of yours")
    if args.scope not in (None, "self"):
        raise UsageError("--by-python copies your process's stacks: scope self only")
    library = args.library or libcuda.find_libcuda_in_tree(args.pid, not args.no_children)
    functions = launch_functions(library)
    req = ProfileRequest(
        pids=[args.pid],
        command=[],
        library=library,
        functions=functions,
        children=not args.no_children,
        scope="self",
    )
    live = _open(broker, req)
    return PythonLaunches(live, library, functions, args.interval)


def _open(broker: Broker, req: ProfileRequest) -> LiveProfile:
    """The engine's live profile, with ustackcopy's copies (ustacks' frame-pointer
    stacks carry no Python frames) walking Python."""
    from gfxbpf.client.profiles.copies import ProbeCopyReader
    from gfxbpf.client.profiles.engine.live import open_profile

    try:
        live = open_profile(req, lambda: broker)
    except BrokerError as e:
        if not e.refuses_program:
            raise  # the process's fault (not yours, gone), not the grant's
        raise BrokerError(e.code, _refused(req, e.message), e.rule, operation=e.operation) from None
    copies = live.run.copies
    if not isinstance(copies, ProbeCopyReader):
        live.close()
        raise ClientError(_refused(req, f"it granted {live.run.att.program} instead"))
    if copies.python.codes is None:
        live.close()
        raise ClientError(f"this broker's {PROGRAM} walks no Python frames (update the broker)")
    return live


def _refused(req: ProfileRequest, broker_says: str) -> str:
    return (
        f"watch cuda --by-python needs program {PROGRAM} on {req.library} "
        f"({', '.join(req.functions)}), which the policy does not grant you: ask the "
        f"administrator to grant {PROGRAM} with that library (scope self); "
        f"`gfxclient watch cuda` without --by-python needs only program cuda.\n  "
        f"broker: {broker_says}"
    )


@dataclass
class Group:
    """Launches made by one innermost Python frame of one process."""

    pid: int
    function: str  # `function (file:line)`, or NO_PYTHON / NOT_COPIED
    calls: int = 0
    time_ns: int = 0
    by_launch: dict[str, int] = field(default_factory=dict)  # cuLaunchKernel -> calls
    chains: dict[tuple[str, ...], int] = field(default_factory=dict)  # root first -> calls

    def as_json(self, per_s: float | None) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "function": self.function,
            "launches": self.calls,
            "launches_per_s": None if per_s is None else round(per_s, 3),
            "time_ns": self.time_ns,
            "by_launch_function": dict(sorted(self.by_launch.items())),
            "chains": [
                {"chain": list(c), "launches": n}
                for c, n in sorted(self.chains.items(), key=lambda t: (-t[1], t[0]))
            ],
        }


def group_stacks(stacks: list[RawStack], times: list[RawStack]) -> list[Group]:
    """The live profile's stacks (weighed in calls, and the same rows in
    nanoseconds) summed per (process, innermost Python frame), most launches first."""
    out: dict[tuple[int, str], Group] = {}
    for s, t in zip(stacks, times, strict=True):
        chain = python_chain(s)
        leaf = chain[-1] if chain else NO_PYTHON
        g = out.setdefault((s.pid, leaf), Group(s.pid, leaf))
        g.calls += s.weight
        g.time_ns += t.weight
        name = s.leaf or "[function]"
        g.by_launch[name] = g.by_launch.get(name, 0) + s.weight
        g.chains[chain] = g.chains.get(chain, 0) + s.weight
    return sorted(out.values(), key=lambda g: (-g.calls, g.pid, g.function))


def python_chain(s: RawStack) -> tuple[str, ...]:
    """A stack's Python frames root first (NOT_COPIED: a chain no copy named)."""
    return tuple(name for run in reversed(s.python) for name in run)


def table_lines(
    groups: list[Group], rates: dict[tuple[int, str], float], limit: int | None
) -> list[str]:
    """The view's table: launches, rate and mean time per innermost frame."""
    if not groups:
        return ["  (no launches seen yet)"]
    lines = [f"  {'pid':>8}  {'launches':>10}  {'/s':>8}  {'mean':>9}  python function"]
    shown = groups if limit is None else groups[:limit]
    for g in shown:
        rate = rates.get((g.pid, g.function))
        mean = f"{g.time_ns / g.calls / 1000:.1f}µs" if g.calls else "-"
        lines.append(
            f"  {g.pid:>8}  {g.calls:>10}  {'' if rate is None else humanize_count(rate):>8}"
            f"  {mean:>9}  {printable(g.function)}"
        )
    if len(shown) < len(groups):
        rest = sum(g.calls for g in groups[len(shown) :])
        lines.append(f"  … {len(groups) - len(shown)} more functions with {rest} launches")
    return lines


_UNCOUNTED = (1).to_bytes(4, "little")  # ustackcopy.bpf.c: lost[1], calls not counted


class PythonLaunches:
    """The watch loop's state for --by-python (the interface of cli.Watch)."""

    def __init__(
        self, live: LiveProfile, library: str, functions: list[str], interval: float
    ) -> None:
        self.live = live
        self.att = live.run.att
        self.library = library
        self.functions = functions
        self.interval = interval
        self.maps = [self.att.map("calls")]
        self.groups: list[Group] = []
        self.prev: dict[tuple[int, str], int] = {}
        self.rates: dict[tuple[int, str], float] = {}
        self.prev_t = self.dt = 0.0
        self.lost = 0  # launches the broker's table had no room to count
        # A warm instance holds the same user's earlier rows (copies.rows_of)
        # and counts: lost is read as a difference from now.
        self.uncounted_at_attach = self._uncounted()

    def _uncounted(self) -> int:
        if "lost" not in self.att.maps:
            return 0
        counts = self.att.map("lost").raw_items()  # [0] copies dropped, [1] calls
        return lost_count([(k, v) for k, v in counts if k[:4] == _UNCOUNTED])

    def sample(self) -> None:
        self.live.poll()  # the targets' maps, and the copies that name the rows
        calls, times = self.live.probe_stacks("calls", "time")
        now = time.monotonic()
        groups = group_stacks(calls, times)
        cur = {(g.pid, g.function): g.calls for g in groups}
        if self.prev_t:
            self.dt = now - self.prev_t
            self.rates = {k: (n - self.prev.get(k, 0)) / self.dt for k, n in cur.items()}
        self.groups, self.prev, self.prev_t = groups, cur, now
        self.lost = self._uncounted() - self.uncounted_at_attach

    def json_line(self) -> dict[str, Any]:
        return {
            "timestamp": time.time(),
            "program": PROGRAM,
            "view": "by-python",
            "attachment": self.att.id,
            "library": self.library,
            "interval": round(self.dt, 6) if self.dt else None,
            "functions": self.functions,
            "launches": sum(g.calls for g in self.groups),
            "lost": self.lost,
            "python_functions": [
                g.as_json(self.rates.get((g.pid, g.function))) for g in self.groups
            ],
        }

    def frame(self, width: int, height: int | None, limit: int | None) -> list[str]:
        total = sum(g.calls for g in self.groups)
        lines = [
            f"gfxclient watch cuda --by-python · {self.library} · attachment {self.att.id} · "
            f"every {self.interval:g}s · {time.strftime('%H:%M:%S')}",
            f"{total} launches by innermost Python function "
            f"({len(self.functions)} launch functions probed; --json names them):",
        ]
        lines.extend(table_lines(self.groups, self.rates, limit))
        if self.lost:
            lines.append(f"note: {self.lost} launches not counted: the broker's table was full")
        return clip(lines, width, height)
