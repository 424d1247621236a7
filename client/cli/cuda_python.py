"""`gfxclient watch cuda --by-python`: kernel launches per Python function.

Program `cuda` counts per function and process; which Python code made a
launch is a stack question, so this view attaches `ustackcopy` (the
program of `profile --stacks-at`) on the launch entries of the cuda
function table that the target's libcuda defines. ustackcopy counts every
call exactly per (function, caller, Python chain hash) in its map `calls`
and sends a few copies per row, each with the Python frames walked in the
kernel; the profiling engine's copy reader and Python code book turn a chain
hash into `function (file:line)` names. No native unwinding is done here:
the Python frames alone name the row.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from typing import Any

from gfxbpf.catalog import cuda_api
from gfxbpf.client.broker import Broker
from gfxbpf.client.cli.display import clip, humanize_count
from gfxbpf.client.errors import BrokerError, ClientError, UsageError
from gfxbpf.client.handle import Attachment
from gfxbpf.client.printable import printable
from gfxbpf.client.profiles.copies import CALL_KEY, CALL_STATS, ProbeCopyReader, rows_of
from gfxbpf.client.profiles.read import lost_count
from gfxbpf.proto import gfxbpf_pb2 as pb

PROGRAM = "ustackcopy"
STACK_COPIES = "stack_copies"
NO_PYTHON = "[no Python frame]"  # launched from native code (or a Python it cannot read)
NOT_COPIED = "[Python chain not copied yet]"  # a row whose copies the reader has not seen


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
    """ustackcopy on the target's libcuda launch functions, walking its Python."""
    from gfxbpf.client import libcuda
    from gfxbpf.client.profiles.engine.attach import python_files
    from gfxbpf.client.profiles.engine.readers import code_book
    from gfxbpf.client.profiles.python.targets import find

    if not args.pid:
        raise UsageError("watch cuda --by-python needs --pid PID: a Python process of yours")
    if args.scope not in (None, "self"):
        raise UsageError("--by-python copies your process's stacks: scope self only")
    library = args.library or libcuda.find_libcuda_in_tree(args.pid, not args.no_children)
    functions = launch_functions(library)
    pythons = find([args.pid], None)
    att = _attach(broker, args, library, functions, python_files(pythons))
    codes = code_book(att)
    if codes is None:
        att.detach()
        raise ClientError(f"this broker's {PROGRAM} walks no Python frames (update the broker)")
    reader = ProbeCopyReader(
        att.open_events(STACK_COPIES), lambda _pid, _refresh: None, _no_unwind(), codes
    )
    return PythonLaunches(att, reader, library, functions, args.interval)


def _no_unwind() -> Any:
    """The reader's unwind tables: never consulted (no process maps are given)."""
    from gfxbpf.client.profiles.unwind import UnwindTables

    return UnwindTables()


def _attach(
    broker: Broker,
    args: argparse.Namespace,
    library: str,
    functions: list[str],
    files: list[pb.PythonFile],
) -> Attachment:
    try:
        return broker.attach(
            PROGRAM,
            scope="self",
            pid=args.pid,
            library=library,
            functions=functions,
            children=not args.no_children,
            python_files=files,
        )
    except BrokerError as e:
        if e.code not in (pb.ERROR_PERMISSION_DENIED, pb.ERROR_NOT_FOUND):
            raise
        why = (
            f"watch cuda --by-python needs program {PROGRAM} on {library} "
            f"({', '.join(functions)}), which the policy does not grant you: ask the "
            f"administrator to grant {PROGRAM} with that library (scope self); "
            f"`gfxclient watch cuda` without --by-python needs only program cuda.\n  "
            f"broker: {e.message}"
        )
        raise BrokerError(e.code, why, e.rule, operation=e.operation) from None


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


# A row of ustackcopy's map calls: (tgid, function index, caller, chain hash,
# path hash); this view sums rows by their Python chain
Row = tuple[int, int, int, int, int]
# What names a row's Python frames: (tgid, chain hash) -> root-first names, or None
Chains = dict[tuple[int, int], tuple[str, ...]]


def group_rows(
    rows: list[tuple[Row, int, int]], chains: Chains, functions: list[str]
) -> list[Group]:
    """Rows (row, calls, ns) summed per (process, innermost Python frame),
    most launches first."""
    out: dict[tuple[int, str], Group] = {}
    for (tgid, fn, _caller, chash, _path), calls, ns in rows:
        chain = chains.get((tgid, chash)) if chash else ()
        if chain is None:
            chain = (NOT_COPIED,)
        leaf = chain[-1] if chain else NO_PYTHON
        g = out.setdefault((tgid, leaf), Group(tgid, leaf))
        g.calls += calls
        g.time_ns += ns
        name = functions[fn] if fn < len(functions) else f"[function {fn}]"
        g.by_launch[name] = g.by_launch.get(name, 0) + calls
        g.chains[chain] = g.chains.get(chain, 0) + calls
    return sorted(out.values(), key=lambda g: (-g.calls, g.pid, g.function))


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


class PythonLaunches:
    """The watch loop's state for --by-python (the interface of cli.Watch)."""

    def __init__(
        self, att: Attachment, reader: Any, library: str, functions: list[str], interval: float
    ) -> None:
        self.att = att
        self.reader = reader
        self.library = library
        self.functions = functions
        self.interval = interval
        self.maps = [att.map("calls")]
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
        while self.reader.drain():  # the copies name the rows' chains
            pass
        calls = rows_of(self.att.map("calls").raw_items(), self.att.reply.since_ns)
        rows = [_row(k, v) for k, v in calls]
        now = time.monotonic()
        groups = group_rows(rows, self._chains(), self.functions)
        cur = {(g.pid, g.function): g.calls for g in groups}
        if self.prev_t:
            self.dt = now - self.prev_t
            self.rates = {k: (n - self.prev.get(k, 0)) / self.dt for k, n in cur.items()}
        self.groups, self.prev, self.prev_t = groups, cur, now
        self.lost = self._uncounted() - self.uncounted_at_attach

    def _chains(self) -> Chains:
        return named_chains(self.reader)

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


_UNCOUNTED = (1).to_bytes(4, "little")  # ustackcopy.bpf.c: lost[1], calls not counted


def named_chains(reader: ProbeCopyReader) -> Chains:
    """The Python chains the reader's copies brought, named root first."""
    codes = reader.python.codes
    reader.python.resolve(final=True)
    if codes is None:  # the program walks no Python: no chain has a name
        return {}
    return {
        key: tuple(codes.name(key[0], f) for f in reversed(frames))
        for key, frames in reader.chains.items()
    }


def _row(key: bytes, value: Any) -> tuple[Row, int, int]:
    if len(key) != CALL_KEY.size or not isinstance(value, bytes) or len(value) != CALL_STATS.size:
        raise ClientError(f"{PROGRAM}'s map 'calls': unexpected sizes (update gfxclient)")
    calls, ns = CALL_STATS.unpack(value)
    return CALL_KEY.unpack(key)[:5], calls, ns
