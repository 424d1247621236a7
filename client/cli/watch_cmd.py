"""gfxclient watch: a live view of a program's maps, redrawn every interval
(Ctrl-C to stop; the last view stays on the screen).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import time
from typing import TYPE_CHECKING, Any, TextIO

from gfxbpf.client.cli import stack_view
from gfxbpf.client.cli.arguments import add_attach_arguments, count, function_names, positive_number
from gfxbpf.client.cli.connecting import CUDA_PROGRAM, attach, connect, sleep_renewing
from gfxbpf.client.cli.stopping import StopSignal
from gfxbpf.client.errors import EXIT_OK, UsageError
from gfxbpf.client.handle import Attachment, ClientMap
from gfxbpf.client.mapdata import MapData

# The view's modules (display, output: json, key names, DRM clients) load in
# prepare(), after the first sample: inside the first interval, which is
# sleep otherwise, not on the way to the attach (issue 37: `watch --once`).

if TYPE_CHECKING:
    from gfxbpf.client.broker import Broker
    from gfxbpf.client.cli.cuda_kernels import KernelTimes
    from gfxbpf.client.cli.cuda_python import PythonLaunches
    from gfxbpf.client.cli.cuda_view import CudaWatch
    from gfxbpf.client.cli.display import Screen


EXAMPLES = """\
examples:
  gfxclient watch syscount                   counters, sorted, with rates
  gfxclient watch cuda --pid 4242            CUDA launches, copies, device memory, sync
  gfxclient watch cuda --pid 4242 --by-python --top 10
                                             launches per Python function, e.g.
                                             train_step (train.py:41), and launches/s
  gfxclient watch cuda --pid 4242 --by-python --once --json
                                             the same once, with each function's chains
  gfxclient watch cuda --pid 4242 --gpu      GPU time per kernel and launching Python
                                             function (CUDA_INJECTION64_PATH, see --gpu)

--by-python counts every launch (cuLaunchKernel, cuLaunchKernelEx, their
_ptsz, cooperative and graph variants) exactly, per Python call chain, with
program ustackcopy on the process's libcuda (the program of `gfxclient
profile --stacks-at`): the policy must grant ustackcopy with that library.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_attach_arguments(p)
    p.add_argument("--interval", type=positive_number, default=1.0, metavar="S", help="default 1")
    p.add_argument("--duration", type=positive_number, metavar="S", help="stop after S seconds")
    p.add_argument("--once", action="store_true", help="one view after one interval, then exit")
    p.add_argument("--map", action="append", metavar="MAP", help="only this map (repeatable)")
    p.add_argument("--top", type=count, metavar="N", help="rows per table (default: fit)")
    p.add_argument(
        "--by-python",
        action="store_true",
        help="cuda only: kernel launches per innermost Python function of --pid PID, "
        "e.g. `train_step (train.py:41)` (--json: each with its whole Python chain); "
        "needs program ustackcopy on the target's libcuda in the policy",
    )
    p.add_argument(
        "--gpu",
        action="store_true",
        help="cuda only: the GPU's own time per kernel, per launching Python function of "
        "--pid PID (scope self) or per process and user (--scope system --library LIB), "
        "and its copies and memsets by kind (and, in scope self, by the Python function "
        "that made them); the process must run with gfxbpf's CUPTI "
        "injection library (CUDA_INJECTION64_PATH) and the policy grant program "
        "cudakernels on it",
    )


def _snapshot(maps: list[ClientMap]) -> dict[str, MapData]:
    return {m.name: MapData.from_client_map(m) for m in maps}


def _now_text() -> str:
    return time.strftime("%H:%M:%S")


class Watch:
    """The watch loop's state: previous snapshot and rendering."""

    def __init__(
        self,
        args: argparse.Namespace,
        att: Attachment,
        maps: list[ClientMap],
        left_out: list[ClientMap] | None = None,
    ) -> None:
        self.args = args
        self.att = att
        self.maps = maps
        self.left_out = left_out or []  # stack tables: a pointer, not rows
        self.functions = function_names(args)
        self.fmts: dict[str, Any] = {}
        self.prev: dict[str, MapData] | None = None
        self.prev_t = 0.0
        self.cur: dict[str, MapData] = {}
        self.rates: dict[str, dict[str, Any]] = {}
        self.dt = 0.0

    def prepare(self) -> None:
        """The view's key formatters (and the modules of the view with them)."""
        if self.fmts:
            return
        from gfxbpf.client.cli.output import key_formatter
        from gfxbpf.client.drmclients import DrmClientNames

        drm_clients = DrmClientNames()
        self.fmts = {
            m.name: key_formatter(self.att, m, self.functions, drm_clients) for m in self.maps
        }

    def sample(self) -> None:
        now = time.monotonic()
        cur = _snapshot(self.maps)
        if self.prev is not None:
            from gfxbpf.client.cli.display import rates

            self.dt = now - self.prev_t
            self.rates = {n: rates(self.prev.get(n), d, self.dt) for n, d in cur.items()}
        self.prev, self.prev_t, self.cur = cur, now, cur

    def frame(self, width: int, height: int | None, limit: int | None) -> list[str]:
        from gfxbpf.client.cli.display import clip, render_map

        self.prepare()
        a = self.att
        head = (
            f"gfxclient watch {a.program} · scope {a.scope} · attachment {a.id} · "
            f"via {a.broker.via} · every {self.args.interval:g}s · {_now_text()}"
        )
        lines = [head]
        if height is not None:
            lines.append("Ctrl-C to quit" + ("" if self.dt else " · rates after one interval"))
        for name, data in self.cur.items():
            lines.append("")
            lines.extend(
                render_map(
                    data,
                    self.rates.get(name),
                    key_format=self.fmts[name],
                    limit=limit,
                    width=width,
                )
            )
        for m in self.left_out:
            lines += ["", stack_view.pointer(m, self.args.name)]
        return clip(lines, width, height)

    def json_line(self) -> dict[str, Any]:
        from gfxbpf.client.cli.display import entries_json

        self.prepare()
        return {
            "timestamp": time.time(),
            "program": self.att.program,
            "attachment": self.att.id,
            "scope": self.att.scope,
            "interval": round(self.dt, 6) if self.dt else None,
            "maps": {
                name: entries_json(data, self.rates.get(name), self.fmts[name])
                for name, data in self.cur.items()
            },
            "stack_tables_left_out": [m.name for m in self.left_out],
        }


def _row_limit(args: argparse.Namespace, nmaps: int, height: int | None) -> int | None:
    if args.top:
        return args.top
    if height is None:
        return None
    return max(3, (height - 2) // max(nmaps, 1) - 4)


def _make_watch(
    broker: Broker, args: argparse.Namespace
) -> Watch | CudaWatch | PythonLaunches | KernelTimes:
    if args.gpu:
        if args.name != CUDA_PROGRAM or args.map or args.by_python:
            raise UsageError("--gpu is for `gfxclient watch cuda` (no --map, no --by-python)")
        from gfxbpf.client.cli import cuda_kernels

        return cuda_kernels.attach(broker, args)
    if args.by_python:
        if args.name != CUDA_PROGRAM or args.map:
            raise UsageError("--by-python is for `gfxclient watch cuda --pid PID` (no --map)")
        from gfxbpf.client.cli import cuda_python

        return cuda_python.attach(broker, args)
    att = attach(broker, args)
    maps = att.table_maps()
    if args.map:
        unknown = [m for m in args.map if m not in att.maps]
        if unknown:
            raise UsageError(
                f"{att.program} has no map {unknown[0]!r} (maps: {', '.join(att.maps)})"
            )
        maps = [m for m in maps if m.name in args.map]
    maps, stack_tables = stack_view.left_out(maps)
    if not maps and stack_tables:
        raise UsageError(stack_view.pointer(stack_tables[0], args.name))
    if not maps:
        raise UsageError(f"{att.program} reports only events: use `gfxclient stream {args.name}`")
    if att.program == CUDA_PROGRAM and not args.map:
        from gfxbpf.client.cli.output import load_cuda_view

        return load_cuda_view().CudaWatch(att, maps, args.interval, args.library or "")
    return Watch(args, att, maps, stack_tables)


def command(args: argparse.Namespace, out: TextIO) -> int:
    tty = out.isatty() and not args.json and not args.once
    with StopSignal() as stop, connect(args) as broker:
        w = _make_watch(broker, args)
        screen = None
        if tty:
            from gfxbpf.client.cli.display import Screen

            screen = Screen(out)
        start = time.monotonic()
        try:
            w.sample()
            if isinstance(w, Watch):
                w.prepare()  # counted in the first interval
            if screen is not None:
                screen.start()
            if not args.once:
                _emit(w, args, out, screen)
            tick = 0
            while not stop.stopped:
                tick += 1
                due = start + tick * args.interval
                if args.duration is not None:
                    due = min(due, start + args.duration)
                if sleep_renewing(stop, due - time.monotonic(), broker):
                    break
                w.sample()
                _emit(w, args, out, screen)
                if args.once:
                    break
                if args.duration is not None and time.monotonic() - start >= args.duration - 1e-3:
                    break
            if stop.stopped and not args.once:
                # Stopped between intervals: what came since the last view is not lost.
                w.sample()
                _emit(w, args, out, screen)
        finally:
            if screen is not None:
                from gfxbpf.client.cli.output import write_lines

                screen.stop()
                # Leave the last view on the normal screen, like bpftrace prints maps at exit.
                width = shutil.get_terminal_size((100, 40)).columns
                limit = args.top or 20
                with contextlib.suppress(OSError, ValueError):
                    write_lines(out, w.frame(width, None, limit))
                    out.flush()
    return EXIT_OK


def _emit(
    w: Watch | CudaWatch | PythonLaunches | KernelTimes,
    args: argparse.Namespace,
    out: TextIO,
    screen: Screen | None,
) -> None:
    from gfxbpf.client.cli.output import dump_json, write_lines

    if args.json:
        dump_json(w.json_line(), out)
        return
    if screen is not None:
        size = shutil.get_terminal_size((100, 40))
        limit = _row_limit(args, len(w.maps), size.lines)
        screen.draw(w.frame(size.columns, size.lines, limit))
        return
    width = shutil.get_terminal_size((100, 40)).columns
    write_lines(out, w.frame(max(width, 60), None, args.top), end="\n\n")
    out.flush()
