"""`gfxclient watch cuda --gpu`: the GPU's own time per kernel, per launching Python code.

Program `cudakernels` reads the records of gfxbpf's CUPTI injection library
(gpu/cupti; the process runs with CUDA_INJECTION64_PATH naming it): each
kernel's start and end on the GPU, joined in the kernel to the Python chain
that launched it by CUPTI's correlation id. Its map `kernels` counts kernels
and device nanoseconds per (process, user, chain hash, kernel name hash);
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
import os
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from gfxbpf.client.broker import Broker
from gfxbpf.client.cli.cuda_python import NO_PYTHON
from gfxbpf.client.cli.display import clip, humanize_count, humanize_ns
from gfxbpf.client.errors import BrokerError, ClientError, UsageError
from gfxbpf.client.handle import Attachment
from gfxbpf.client.libcuda import mapped_files
from gfxbpf.client.printable import printable
from gfxbpf.client.profiles.copies import NOT_COPIED
from gfxbpf.client.profiles.read import lost_count
from gfxbpf.proto import gfxbpf_pb2 as pb

PROGRAM = "cudakernels"
LIBRARY_PREFIX = "libgfxcupti"
KERNEL_KEY = struct.Struct("<IIQQII")  # cudakernels.bpf.c struct kernel_key
KERNEL_STATS = struct.Struct("<QQ")
LAUNCH_SEEN = 1  # kernel_key.flags
NOT_SAMPLED = 2  # kernel_key.flags: the library's sampling left its launch out
NO_LAUNCH = "[launch not seen]"  # the kernel's launch came before attaching
_UNCOUNTED = (1).to_bytes(4, "little")  # cudakernels.bpf.c: lost[1], kernels not counted


def find_injection(pid: int) -> str:
    """The injection library process pid loaded (CUDA_INJECTION64_PATH)."""
    for path in mapped_files(pid):
        if os.path.basename(path).startswith(LIBRARY_PREFIX) and ".so" in path:
            return path
    raise UsageError(
        f"process {pid} has not loaded gfxbpf's CUPTI injection library: start it with "
        "CUDA_INJECTION64_PATH=/opt/gfxbpf/cupti/libgfxcupti-cu13.so (-cu12 for CUDA 12; "
        "README.md, GPU time), or give the file with --library PATH"
    )


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


Row = tuple[int, int, int, int, int, int]  # tgid, uid, chain hash, name hash, flags, weight


def estimate(row: Row, n: int, ns: int) -> tuple[int, int]:
    """A row's kernels and device ns for its chain: scaled by its weight."""
    weight = row[5] if row[4] & LAUNCH_SEEN and row[5] > 1 else 1
    return n * weight, ns * weight


def group(rows: list[tuple[Row, int, int]], names: dict[int, str], chains: Chains) -> list[Kernel]:
    """Rows summed per (process, kernel name, innermost Python frame), most
    device time first; kernels whose launch the sampling left out are in their
    sampled peers' estimates, not in rows of their own."""
    out: dict[tuple[int, str, str], Kernel] = {}
    for row, raw_n, raw_ns in rows:
        tgid, uid, chash, nhash, flags, weight = row
        if flags & NOT_SAMPLED:
            continue
        n, ns = estimate(row, raw_n, raw_ns)
        if not flags & LAUNCH_SEEN:
            chain: tuple[str, ...] = (NO_LAUNCH,)
        else:
            got = chains.get((tgid, chash)) if chash else ()
            chain = (NOT_COPIED,) if got is None else got
        leaf = chain[-1] if chain else NO_PYTHON
        name = names.get(nhash, f"[kernel {nhash:#x}]")
        k = out.setdefault((tgid, name, leaf), Kernel(tgid, uid, name, leaf))
        k.estimated |= flags & LAUNCH_SEEN != 0 and weight > 1
        k.kernels += n
        k.device_ns += ns
        acc = k.chains.setdefault(chain, [0, 0])
        acc[0] += n
        acc[1] += ns
    return sorted(out.values(), key=lambda k: (-k.device_ns, k.pid, k.name))


# What names a chain's Python frames: (tgid, chain hash) -> root-first names
Chains = dict[tuple[int, int], tuple[str, ...]]


def named_chains(reader: Any) -> Chains:
    """The Python chains the reader's copies brought (ProbeCopyReader.chains), named root first."""
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
    kw: dict[str, Any] = {"scope": scope, "library": library}
    if scope == "self":
        # Not its children: following them probes every process that maps the
        # library, which raises its semaphores and makes all of them collect.
        kw["pid"] = args.pid
        kw["python_files"] = python_files(find([args.pid], None))
    elif args.pid:
        kw["pid"] = args.pid
    return _attach(broker, library, kw), library


def _attach(broker: Broker, library: str, kw: dict[str, Any]) -> Attachment:
    try:
        return broker.attach(PROGRAM, **kw)
    except BrokerError as e:
        if e.code not in (pb.ERROR_PERMISSION_DENIED, pb.ERROR_NOT_FOUND):
            raise
        why = (
            f"watch cuda --gpu needs program {PROGRAM} on {library} (scope {kw['scope']}), "
            f"which the policy does not grant you: ask the administrator for it "
            f"(gfxbpf-admin approve {PROGRAM} --libraries '.../libgfxcupti-cu*.so').\n  "
            f"broker: {e.message}"
        )
        raise BrokerError(e.code, why, e.rule, operation=e.operation) from None


def read_rows(att: Attachment) -> list[tuple[Row, int, int]]:
    out = []
    for k, v in att.map("kernels").raw_items():
        if len(k) != KERNEL_KEY.size or not isinstance(v, bytes) or len(v) != KERNEL_STATS.size:
            raise ClientError(f"{PROGRAM}'s map 'kernels': unexpected sizes (update gfxclient)")
        n, ns = KERNEL_STATS.unpack(v)
        out.append((KERNEL_KEY.unpack(k), n, ns))
    return out


@dataclass
class Totals:
    """Exact counts over every row, and how many kernels' launches were left out."""

    kernels: int = 0
    device_ns: int = 0
    not_sampled: int = 0

    @classmethod
    def of(cls, rows: list[tuple[Row, int, int]]) -> Totals:
        t = cls()
        for row, n, ns in rows:
            t.kernels += n
            t.device_ns += ns
            t.not_sampled += n if row[4] & NOT_SAMPLED else 0
        return t

    def note(self) -> str | None:
        if not self.not_sampled:
            return None
        return (
            f"launches came too fast to probe each: {self.not_sampled} of {self.kernels} kernels "
            "were launched unprobed, so counts and times per launching function (~) are "
            "estimates from a random sample; the totals are exact"
        )


def read_names(att: Attachment) -> dict[int, str]:
    out = {}
    for k, v in att.map("names").raw_items():
        if len(k) == 8 and isinstance(v, bytes):
            out[struct.unpack("<Q", k)[0]] = v.split(b"\0", 1)[0].decode(errors="replace")
    return out


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

    def sample(self) -> None:
        chains: Chains = {}
        if self.reader is not None:
            while self.reader.drain():  # the copies name the rows' chains
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
        self.lost = lost_count([(k, v) for k, v in counts if k[:4] == _UNCOUNTED])

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
            "by_kernel": [k.as_json() for k in self.kernels],
        }

    def frame(self, width: int, height: int | None, limit: int | None) -> list[str]:
        lines = [
            f"gfxclient watch cuda --gpu · {self.library} · attachment {self.att.id} · "
            f"every {self.interval:g}s · {time.strftime('%H:%M:%S')}",
            f"{self.totals.kernels} kernels, {humanize_ns(self.totals.device_ns)} of GPU time, "
            "by kernel and innermost launching Python function:",
        ]
        if not self.kernels:
            lines.append("  (no kernel seen yet)")
        else:
            lines.append(
                f"  {'pid':>8}  {'kernels':>9}  {'GPU time':>9}  {'busy':>6}  {'mean':>9}  "
                "kernel · python function"
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
                f"  {busy:>6}  {mean:>9}  {printable(k.name)} · {printable(k.function)}"
            )
        if len(shown) < len(self.kernels):
            lines.append(f"  … {len(self.kernels) - len(shown)} more rows")
        if self.lost:
            lines.append(f"note: {self.lost} kernels not counted: the broker's table was full")
        if self.totals.note():
            lines.append(f"note: {self.totals.note()}")
        return clip(lines, width, height)
