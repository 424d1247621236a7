"""`gfxclient watch cuda --gpu`: the GPU's own time per kernel, per launching Python code,
and in copies and memsets (map `copies`, per process and kind; in scope self
also per innermost Python function that made them, from `copy_stacks`).

Program `cudakernels` reads the records of gfxbpf's CUPTI injection library
(gpu/cupti; the process runs with CUDA_INJECTION64_PATH naming it): each
kernel's start and end on the GPU, joined in the kernel to the Python chain
that launched it by CUPTI's correlation id. Its map `kernels` counts kernels
and device nanoseconds per (process, user, chain hash, kernel name hash,
launch stack pointer: the native path, summed over here);
`names` holds the names; the stack copies sent at a few launches per chain
carry the Python records that name the chains (the reader and code book of
`watch cuda --by-python`). In scope system (administrators) there is no
chain: rows are per process, user and kernel.

When launches come faster than the library's launch rate (GFX_CUPTI_LAUNCH_RATE,
2000 per second), it probes 1 launch in N at random: a row then holds its
sampled kernels and their weight N, and the rows per launching function show
the estimate (count and time times N, marked `~`); the kernels of launches left
out have their own rows, so the totals per kernel stay exact.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from gfxbpf.client.broker import Broker
from gfxbpf.client.cli.cuda_python import NO_PYTHON
from gfxbpf.client.cli.display import clip
from gfxbpf.client.errors import UsageError
from gfxbpf.client.handle import Attachment
from gfxbpf.client.humanize import humanize_bytes, humanize_count, humanize_ns, user_name
from gfxbpf.client.printable import printable
from gfxbpf.client.profiles.copies import NOT_COPIED
from gfxbpf.client.profiles.gpu.kernels import (
    PROGRAM,
    UNCOUNTED,
    Row,
    Totals,
    attach_kernels,
    estimate,
    find_injection,
    read_names,
    read_rows,
)
from gfxbpf.client.profiles.gpu.maprows import LAUNCH_SEEN, NOT_SAMPLED, sample_weight
from gfxbpf.client.profiles.gpu.refusals import Refusal, read_refusals
from gfxbpf.client.profiles.gpu.transfers import (
    LaunchedCopies,
    Transfer,
    read_launched,
    read_transfers,
)
from gfxbpf.client.profiles.python.records import MAIN_FRAME
from gfxbpf.client.profiles.read import lost_count

if TYPE_CHECKING:
    from gfxbpf.client.profiles.copies import ProbeCopyReader

NO_LAUNCH = "[launch not seen]"  # the kernel's launch came before attaching
# Before the innermost frame of a launch from a thread with no Python of its
# own (autograd's): the main thread's frame at the launch.
MAIN_THREAD = "[main thread]"


@dataclass
class Kernel:
    """Kernels of one name launched by one innermost Python frame of one process."""

    pid: int
    uid: int
    name: str
    function: str  # `function (file:line)`, NO_PYTHON, NOT_COPIED or NO_LAUNCH
    kernels: int = 0
    device_ns: int = 0
    chains: dict[tuple[str, ...], list[int]] = field(default_factory=dict)  # -> [kernels, ns]
    estimated: bool = False  # scaled up from sampled launches

    def as_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "uid": self.uid,
            "kernel": self.name,
            "function": self.function,
            "kernels": self.kernels,
            "device_ns": self.device_ns,
            "mean_ns": self.device_ns // self.kernels if self.kernels else 0,
            "estimated": self.estimated,
            "chains": [
                {"chain": list(c), "kernels": n, "device_ns": ns}
                for c, (n, ns) in sorted(self.chains.items(), key=lambda t: -t[1][1])
            ],
        }


def group(rows: list[tuple[Row, int, int]], names: dict[int, str], chains: Chains) -> list[Kernel]:
    """Rows summed per (process, kernel name, innermost Python frame), most
    device time first; kernels whose launch the sampling left out are in their
    sampled peers' estimates, not in rows of their own."""
    out: dict[tuple[int, str, str], Kernel] = {}
    for row, raw_n, raw_ns in rows:
        tgid, uid, chash, nhash, flags, weight, _sp = row
        if flags & NOT_SAMPLED:
            continue
        n, ns = estimate(row, raw_n, raw_ns)
        chain, leaf = _function(tgid, chash, flags, chains)
        name = names.get(nhash, f"[kernel {nhash:#x}]")
        k = out.setdefault((tgid, name, leaf), Kernel(tgid, uid, name, leaf))
        k.estimated |= sample_weight(flags, weight) > 1
        k.kernels += n
        k.device_ns += ns
        acc = k.chains.setdefault(chain, [0, 0])
        acc[0] += n
        acc[1] += ns
    return sorted(out.values(), key=lambda k: (-k.device_ns, k.pid, k.name))


# What names a chain's Python frames: (tgid, chain hash) -> root-first names
Chains = dict[tuple[int, int], tuple[str, ...]]


def _function(tgid: int, chash: int, flags: int, chains: Chains) -> tuple[tuple[str, ...], str]:
    """A row's Python chain, and the innermost function the view names it by."""
    if not flags & LAUNCH_SEEN:
        chain: tuple[str, ...] = (NO_LAUNCH,)
    else:
        got = chains.get((tgid, chash)) if chash else ()
        chain = (NOT_COPIED,) if got is None else got
    leaf = chain[-1] if chain else NO_PYTHON
    if len(chain) > 1 and chain[0] == MAIN_FRAME:  # what the main thread ran, not a caller
        leaf = f"{MAIN_THREAD} {leaf}"
    return chain, leaf


@dataclass
class CopySite:
    """Copies of one kind made by one innermost Python function of one process."""

    pid: int
    uid: int
    kind: str
    function: str  # as Kernel's; NO_LAUNCH: made before the attach
    copies: int = 0
    bytes: int = 0
    device_ns: int = 0
    estimated: bool = False  # scaled up from sampled calls

    def add(self, copies: int, nbytes: int, ns: int) -> None:
        self.copies += copies
        self.bytes += nbytes
        self.device_ns += ns

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def group_copies(
    transfers: list[Transfer], launched: list[LaunchedCopies], chains: Chains
) -> list[CopySite]:
    """Copies per (process, kind, innermost Python function), most device time
    first: the rows whose call was seen, scaled by their sampling weight, and
    per (process, kind) what the exact totals hold beyond all rows (calls made
    before the attach) under NO_LAUNCH."""
    out: dict[tuple[int, str, str], CopySite] = {}
    rowed: dict[tuple[int, str], list[int]] = {}
    for c in launched:
        acc = rowed.setdefault((c.pid, c.kind), [0, 0, 0])
        acc[0], acc[1], acc[2] = acc[0] + c.copies, acc[1] + c.bytes, acc[2] + c.device_ns
        if not c.flags & LAUNCH_SEEN:
            continue  # the sampled rows' weights stand for it
        function = _function(c.pid, c.chain, c.flags, chains)[1]
        site = out.setdefault((c.pid, c.kind, function), CopySite(c.pid, c.uid, c.kind, function))
        site.estimated |= c.scale() > 1
        site.add(c.copies * c.scale(), c.bytes * c.scale(), c.estimated_ns())
    for t in transfers:
        n, nbytes, ns = rowed.get((t.pid, t.kind), (0, 0, 0))
        if t.copies > n:  # (read after the rows: a copy counted since is in neither)
            site = out.setdefault(
                (t.pid, t.kind, NO_LAUNCH), CopySite(t.pid, t.uid, t.kind, NO_LAUNCH)
            )
            site.add(t.copies - n, max(t.bytes - nbytes, 0), max(t.device_ns - ns, 0))
    return sorted(out.values(), key=lambda s: (-s.device_ns, s.pid, s.kind, s.function))


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


def _no_unwind() -> Any:
    """The reader's unwind tables: never consulted (no process maps are given:
    the Python frames alone name a chain)."""
    from gfxbpf.client.profiles.unwind import UnwindTables

    return UnwindTables()


def attach(broker: Broker, args: argparse.Namespace) -> KernelTimes:
    """cudakernels on the injection library; in scope self, walking the Python frames."""
    from gfxbpf.client.profiles.copies import ProbeCopyReader
    from gfxbpf.client.profiles.engine.readers import code_book

    att, library = attach_program(broker, args)
    reader = None
    codes = code_book(att)
    if att.scope == "self" and codes is not None:
        stream = att.open_events("stack_copies")
        reader = ProbeCopyReader(stream, lambda _pid, _refresh: None, _no_unwind(), codes)
    return KernelTimes(att, reader, library, args.interval)


# The least copy the program sends with each launch's Python record: one word.
WATCH_STACK_BYTES = 8


def attach_program(broker: Broker, args: argparse.Namespace) -> tuple[Attachment, str]:
    """The attachment (scope self: --pid's Python walked) and the library it probes."""
    from gfxbpf.client.profiles.engine.attach import python_files
    from gfxbpf.client.profiles.python.targets import find

    scope = args.scope or "self"
    if scope == "self" and not args.pid:
        raise UsageError("watch cuda --gpu needs --pid PID (a process of yours), or --scope system")
    if scope != "self" and not args.library:
        raise UsageError("watch cuda --gpu --scope system needs --library (the injection library)")
    library = args.library or find_injection(args.pid)
    kw: dict[str, Any] = {}
    if scope == "self":
        # Not its children: following them probes every process that maps the
        # library, which raises its semaphores and makes all of them collect.
        kw["pid"] = args.pid
        kw["python_files"] = python_files(find([args.pid], None))
        # The view names a row by its Python record; the launch's native copy
        # (up to 72 KiB where the policy allows) is never unwound here.
        kw["stack_bytes"] = WATCH_STACK_BYTES
    elif args.pid:
        kw["pid"] = args.pid
    kw["scope"] = scope
    return attach_kernels(broker, "watch cuda --gpu", library, kw), library


class KernelTimes:
    """The watch loop's state for --gpu (the interface of cli.Watch)."""

    def __init__(self, att: Attachment, reader: Any, library: str, interval: float) -> None:
        self.att = att
        self.reader = reader
        self.library = library
        self.interval = interval
        self.maps = [att.map("kernels")]  # one table on the screen
        self.kernels: list[Kernel] = []
        self.prev: dict[tuple[int, str, str], int] = {}
        self.rates: dict[tuple[int, str, str], float] = {}  # device ns per second
        self.prev_t = self.dt = 0.0
        self.lost = 0
        self.totals = Totals()
        self.refused: list[Refusal] = []  # processes whose library another CUPTI client blocks
        self.transfers: list[Transfer] = []  # copies and memsets per process and kind
        self.sites: list[CopySite] = []  # scope self: the same per Python function

    def sample(self) -> None:
        chains: Chains = {}
        if self.reader is not None:
            # The copies name the rows' chains: take all the ring holds now, so
            # a row read below finds the copy its launch sent before it.
            self.reader.stream.flush()
            while self.reader.drain():
                pass
            chains = named_chains(self.reader)
        now = time.monotonic()
        rows = read_rows(self.att)
        kernels = group(rows, read_names(self.att), chains)
        self.totals = Totals.of(rows)
        cur = {(k.pid, k.name, k.function): k.device_ns for k in kernels}
        if self.prev_t:
            self.dt = now - self.prev_t
            self.rates = {key: (ns - self.prev.get(key, 0)) / self.dt for key, ns in cur.items()}
        self.kernels, self.prev, self.prev_t = kernels, cur, now
        counts = self.att.map("lost").raw_items()  # [0] copies dropped, [1] kernels
        self.lost = lost_count([(k, v) for k, v in counts if k[:4] == UNCOUNTED])
        self.refused = read_refusals(self.att)
        launched = read_launched(self.att)  # before the totals, which count first
        self.transfers = read_transfers(self.att)
        self.sites = group_copies(self.transfers, launched, chains) if launched else []

    def json_line(self) -> dict[str, Any]:
        return {
            "timestamp": time.time(),
            "program": PROGRAM,
            "view": "gpu",
            "attachment": self.att.id,
            "scope": self.att.scope,
            "library": self.library,
            "interval": round(self.dt, 6) if self.dt else None,
            "kernels": self.totals.kernels,
            "device_ns": self.totals.device_ns,
            "kernels_launched_unprobed": self.totals.not_sampled,
            "lost": self.lost,
            "refused": [r.as_json(time.monotonic_ns()) for r in self.refused],
            "by_kernel": [k.as_json() for k in self.kernels],
            "copies": [t.as_json() for t in self.transfers],
            "copies_by_function": [s.as_json() for s in self.sites],
        }

    def frame(self, width: int, height: int | None, limit: int | None) -> list[str]:
        # Scope system walks no Python: each row's user says whose GPU time it is.
        by_user = self.att.scope != "self"
        lines = [
            f"gfxclient watch cuda --gpu · {self.library} · attachment {self.att.id} · "
            f"every {self.interval:g}s · {time.strftime('%H:%M:%S')}",
            f"{self.totals.kernels} kernels, {humanize_ns(self.totals.device_ns)} of GPU time, "
            + ("by process, kernel and user:" if by_user else
               "by kernel and innermost launching Python function:"),
        ]  # fmt: skip
        if not self.kernels:
            lines.append("  (no kernel seen yet)")
        else:
            lines.append(
                f"  {'pid':>8}  {'kernels':>9}  {'GPU time':>9}  {'busy':>6}  {'mean':>9}  "
                f"kernel · {'user' if by_user else 'python function'}"
            )
        shown = self.kernels if limit is None else self.kernels[:limit]
        for k in shown:
            rate = self.rates.get((k.pid, k.name, k.function))
            busy = "" if rate is None else f"{rate / 1e7:.1f}%"  # ns/s -> % of one GPU
            mean = humanize_ns(k.device_ns // k.kernels) if k.kernels else "-"
            approx = "~" if k.estimated else ""
            lines.append(
                f"  {k.pid:>8}  {approx + humanize_count(k.kernels):>9}  "
                f"{approx + humanize_ns(k.device_ns):>9}"
                f"  {busy:>6}  {mean:>9}  {printable(k.name)} · "
                f"{user_name(k.uid) if by_user else printable(k.function)}"
            )
        if len(shown) < len(self.kernels):
            lines.append(f"  … {len(self.kernels) - len(shown)} more rows")
        lines += transfer_lines(self.transfers, limit, by_user, self.sites)
        if self.lost:
            lines.append(f"note: {self.lost} kernels not counted: the broker's table was full")
        if self.totals.note():
            lines.append(f"note: {self.totals.note()}")
        now = time.monotonic_ns()
        lines += [f"note: {r.note(now)}" for r in self.refused]
        return clip(lines, width, height)


def transfer_lines(
    transfers: list[Transfer], limit: int | None, by_user: bool, sites: list[CopySite] | None = None
) -> list[str]:
    """Copies and memsets per process and kind, with their rate on the device
    (by_user: and whose they are, in scope system; sites: per Python function
    that made them instead, in scope self)."""
    if not transfers:
        return []
    # (pid, count, bytes, ns, estimated, what)
    rows = [
        (s.pid, s.copies, s.bytes, s.device_ns, s.estimated, f"{s.kind} · {printable(s.function)}")
        for s in sites or ()
    ] or [
        (
            t.pid,
            t.copies,
            t.bytes,
            t.device_ns,
            False,
            t.kind + (f" · {user_name(t.uid)}" if by_user else ""),
        )
        for t in transfers
    ]
    what = "kind · python function" if sites else "kind · user" if by_user else "kind"
    lines = [
        f"copies and memsets, by process, {what} (GPU time, and bytes per second of it):",
        f"  {'pid':>8}  {'count':>9}  {'bytes':>9}  {'GPU time':>9}  {'rate':>10}  {what}",
    ]
    shown = rows if limit is None else rows[:limit]
    for pid, n, nbytes, ns, estimated, label in shown:
        per_s = "-" if not ns else humanize_bytes(nbytes * 1e9 / ns) + "/s"
        approx = "~" if estimated else ""
        lines.append(
            f"  {pid:>8}  {approx + humanize_count(n):>9}  {approx + humanize_bytes(nbytes):>9}  "
            f"{approx + humanize_ns(ns):>9}  {per_s:>10}  {label}"
        )
    if len(shown) < len(rows):
        lines.append(f"  … {len(rows) - len(shown)} more rows")
    return lines
