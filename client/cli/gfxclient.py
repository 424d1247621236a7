"""gfxclient: the command line over the client library.

Errors are printed for people (never a traceback; GFXBPF_DEBUG=1 adds one
for unexpected errors) and mapped to the exit codes listed in --help.
watch and stream end normally on Ctrl-C (exit 0): the screen is restored,
the cursor shown, and the session closed (the broker detaches).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import select
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any, TextIO

from gfxbpf.bpf.consts import SCOPES
from gfxbpf.client.broker import Broker, client_version
from gfxbpf.client.cli import profile_cmd, stack_view
from gfxbpf.client.cli.display import (
    Screen,
    clip,
    entries_json,
    format_event,
    format_key,
    format_plain,
    format_value,
    histogram_lines,
    humanize_ns,
    json_line,
    jsonable,
    rates,
    render_map,
)
from gfxbpf.client.connection import DEFAULT_SOCKET
from gfxbpf.client.drmclients import DrmClientNames
from gfxbpf.client.errors import (
    EXIT_BROKER,
    EXIT_DENIED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    BrokerError,
    ClientError,
    UsageError,
)
from gfxbpf.client.grpc_config import DEFAULT_GRPC, TlsFiles
from gfxbpf.client.handle import Attachment, ClientMap, scope_name
from gfxbpf.client.mapdata import MapData, sum_cpus
from gfxbpf.client.printable import json_printable, printable
from gfxbpf.client.syscalls import syscall_name
from gfxbpf.proto import gfxbpf_pb2 as pb

if TYPE_CHECKING:
    from gfxbpf.client.cli.cuda_view import CudaWatch

PROG = "gfxclient"
# `watch cuda`'s view (with the CUDA function table) is imported only for
# that program (issue #15); test_cuda_table checks the name against it.
CUDA_PROGRAM = "cuda"


def _cuda_view() -> ModuleType:
    from gfxbpf.client.cli import cuda_view

    return cuda_view


EPILOG = f"""\
transport:
  --via fd    the Unix-socket session; map fds the broker passes are read
              directly (when the kernel allows unprivileged reads)
  --via grpc  everything over gRPC, with a token the Unix socket issues
              (cached per user) or GFXBPF_TOKEN, or an mTLS certificate
  --via auto  fd when the broker says direct map reads work, else grpc
environment:
  GFXBPF_SOCKET (default {DEFAULT_SOCKET}), GFXBPF_GRPC (default
  {DEFAULT_GRPC}), GFXBPF_TOKEN, GFXBPF_TOKEN_CACHE=0, GFXBPF_DEBUG=1
exit codes:
  {EXIT_OK}    success (watch and stream: also when stopped with Ctrl-C)
  {EXIT_USAGE}    usage error or bad input
  {EXIT_UNREACHABLE}    the broker is not running or cannot be reached
  {EXIT_DENIED}    permission denied (the policy, or the socket's permissions)
  {EXIT_UNAVAILABLE}    the program cannot run on this host (e.g. a missing tracepoint)
  {EXIT_BROKER}    any other error reported by the broker
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C) outside watch and stream
"""


# ------------------------------------------------------------------ arguments


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # usage errors exit 1, not argparse's 2
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text!r}")
    return value


def _nonnegative(text: str) -> float:
    if text.strip() in ("0", "0.0"):
        return 0.0
    return _positive(text)


def _pid(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a process id: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"not a process id: {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def _add_globals(p: argparse.ArgumentParser, top: bool) -> None:
    """Global flags: on the main parser with defaults, and on every subcommand
    (without defaults) so they may come before or after the command."""

    def d(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    g = p.add_argument_group("global options")
    g.add_argument(
        "--socket", metavar="PATH", default=d(None), help="the broker's Unix control socket"
    )
    g.add_argument("--grpc", metavar="ADDR", default=d(None), help="the broker's gRPC address")
    g.add_argument(
        "--via", choices=("auto", "fd", "grpc"), default=d("auto"), help="transport (default auto)"
    )
    g.add_argument("--json", action="store_true", default=d(False), help="machine-readable output")
    g.add_argument("--tls-ca", metavar="FILE", default=d(None), help="gRPC over TCP: server CA")
    g.add_argument(
        "--tls-cert", metavar="FILE", default=d(None), help="gRPC over TCP: client certificate"
    )
    g.add_argument("--tls-key", metavar="FILE", default=d(None), help="gRPC over TCP: client key")


def _add_attach(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help="program name (see `gfxclient list`)")
    p.add_argument("--scope", choices=SCOPES, help="default: the policy's scope")
    p.add_argument(
        "--pid",
        type=_pid,
        help="target process (per-process programs), with the processes it starts",
    )
    p.add_argument(
        "--no-children",
        action="store_true",
        help="with --pid: that process only, not its child processes",
    )
    p.add_argument(
        "--library", metavar="PATH", help="uprobe target (ucalls); a file you can read yourself"
    )
    p.add_argument(
        "--function",
        dest="functions",
        metavar="F",
        action="append",
        default=[],
        help="function in --library to trace; repeat or comma-separate",
    )


def build_parser() -> argparse.ArgumentParser:
    # long: a flat list of declarations, so that one place reads as the --help.
    parser = _Parser(
        prog=PROG,
        description="Profile the GPU stack and your processes with eBPF through the "
        "gfxbpf broker: no root, no capabilities, reviewed programs only.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_VersionAction)
    _add_globals(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, help_text: str, more: str = "") -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            help=help_text,
            description=help_text + more,
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        _add_globals(p, top=False)
        return p

    command("list", "programs you may use, and why one cannot run here")

    p = command("info", "a program's description, attach points, maps, parameters")
    p.add_argument("name", metavar="NAME")

    p = command(
        "watch",
        "a live view of a program's maps (Ctrl-C to stop)",
        "; with --json, one object {timestamp, program, maps: {name: entries}} per "
        "interval, the first right after attaching (its rates are null)",
    )
    _add_attach(p)
    p.add_argument("--interval", type=_positive, default=1.0, metavar="S", help="default 1")
    p.add_argument("--duration", type=_positive, metavar="S", help="stop after S seconds")
    p.add_argument("--once", action="store_true", help="one view after one interval, then exit")
    p.add_argument("--map", action="append", metavar="MAP", help="only this map (repeatable)")
    p.add_argument("--top", type=_count, metavar="N", help="rows per table (default: fit)")

    p = command("stream", "a program's events as lines or JSON lines (Ctrl-C to stop)")
    _add_attach(p)
    p.add_argument("--duration", type=_positive, metavar="S", help="stop after S seconds")
    p.add_argument("--max", type=_count, metavar="N", help="stop after N events")
    p.add_argument("--map", metavar="MAP", help="the ring buffer (default: the only one)")

    p = command("dump", "one snapshot of every visible map, decoded with BTF")
    _add_attach(p)
    p.add_argument("map", metavar="MAP", nargs="?", help="only this map")
    p.add_argument(
        "--wait", type=_nonnegative, default=0.0, metavar="S", help="collect S seconds first"
    )

    p = command("status", "broker version, kernel features, your attachments and their stats")
    p.add_argument(
        "--attach",
        action="append",
        default=[],
        metavar="NAME",
        help="attach NAME for the report (repeatable)",
    )
    p.add_argument("--scope", choices=SCOPES, help="scope for --attach")
    p.add_argument(
        "--wait", type=_nonnegative, default=1.0, metavar="S", help="after --attach (default 1)"
    )

    p = command(
        "profile",
        "CPU, off-CPU or wall-clock profile (flame graph) of your processes, "
        "or the stacks that call a function",
        "\n\n" + profile_cmd.EXAMPLES,
    )
    profile_cmd.add_arguments(p)
    return parser


def _functions(args: argparse.Namespace) -> list[str]:
    out: list[str] = []
    for item in getattr(args, "functions", []) or []:
        out.extend(f.strip() for f in item.split(",") if f.strip())
    return out


# ------------------------------------------------------------------ stopping


class StopSignal:
    """SIGINT/SIGTERM/SIGHUP set a flag (and wake wait()) instead of raising.

    Nothing is interrupted half-way (a frame, a reply), so the terminal and
    the session are left in order; a second Ctrl-C raises KeyboardInterrupt.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.stopped = False
        self.signum: int | None = None
        self._old: dict[int, Any] = {}
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def _handler(self, signum: int, frame: object) -> None:
        if self.stopped and signum == signal.SIGINT:
            # A second Ctrl-C: the user insists (e.g. a broker that does not
            # answer); give up now. Callers' finally blocks still restore the
            # terminal, and the kernel closes the session with the process.
            raise KeyboardInterrupt
        self.stopped = True
        self.signum = signum
        with contextlib.suppress(OSError):
            os.write(self._w, b"x")

    def install(self) -> None:
        for sig in self.SIGNALS:
            try:
                self._old[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread: Ctrl-C stays KeyboardInterrupt
                return

    def restore(self) -> None:
        for sig, old in self._old.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, old)
        self._old.clear()
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._r = self._w = -1

    def wait(self, timeout: float) -> bool:
        """Sleep up to timeout seconds; True (early) when a stop signal came."""
        if self.stopped:
            return True
        if timeout > 0:
            with contextlib.suppress(InterruptedError, OSError, ValueError):
                select.select([self._r], [], [], timeout)
        return self.stopped

    def __enter__(self) -> StopSignal:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()


# ------------------------------------------------------------------ helpers


def _connect(args: argparse.Namespace) -> Broker:
    tls = None
    if args.tls_ca or args.tls_cert or args.tls_key:
        tls = TlsFiles(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key)
    return Broker.connect(socket=args.socket, grpc=args.grpc, via=args.via, tls=tls)


def _attach(broker: Broker, args: argparse.Namespace) -> Attachment:
    if args.name == CUDA_PROGRAM and not args.library:
        if not args.pid:
            raise UsageError("cuda needs --pid PID: a process of yours that uses CUDA")
        from gfxbpf.client import libcuda  # only for watch cuda: start-up stays light

        args.library = libcuda.find_libcuda_in_tree(args.pid, not args.no_children)
    try:
        return broker.attach(
            args.name,
            scope=args.scope,
            pid=args.pid,
            library=args.library,
            functions=_functions(args),
            children=bool(args.pid) and not args.no_children,
        )
    except BrokerError as e:
        if e.code != pb.ERROR_INVALID_ARGUMENT:
            raise
        # The broker names AttachParams fields; say which flags carry them.
        hint = (
            f"`gfxclient info {args.name}` lists its parameters; they are the flags "
            "--pid PID, --library PATH and --function NAME (--no-children: a program "
            "that follows no child processes)"
        )
        raise BrokerError(e.code, f"{e.message}\n  {hint}", e.rule, operation=e.operation) from None


def key_formatter(
    att: Attachment,
    cmap: ClientMap | MapData,
    functions: list[str],
    drm_clients: DrmClientNames | None = None,
) -> Any:
    """Keys as people know them: syscall numbers as names, function indexes as
    names, DRM client ids with the caller's own processes that hold them."""
    label = cmap.key_label
    if att.program == CUDA_PROGRAM:
        return _cuda_view().key_text

    def fmt(key: Any) -> str:
        if label == DRM_CLIENT_LABEL and drm_clients is not None:
            if isinstance(key, str) and key.isdigit():  # a histogram's group label
                key = int(key)
            if isinstance(key, int):
                return drm_clients.label(key)
        if isinstance(key, int) and not isinstance(key, bool):
            if label == "syscall":
                return syscall_name(key)
            if label == "function" and 0 <= key < len(functions):
                return functions[key]
        return format_key(key)

    return fmt


# The catalog's key_label of maps keyed by a DRM client id (drmsched).
DRM_CLIENT_LABEL = "DRM client id"

# gRPC attachments live on a lease (policy default 300 s) that any call naming
# them renews; a long sleep renews it on the way.
RENEW_EVERY = 60.0


def _sleep(stop: StopSignal, seconds: float, broker: Broker) -> bool:
    """Sleep (True early on a stop signal), renewing gRPC leases meanwhile."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return stop.stopped
        if broker.via != "grpc" or left <= RENEW_EVERY:
            return stop.wait(left)
        if stop.wait(RENEW_EVERY):
            return True
        for att in broker.attachments:
            att.renew()


def _snapshot(maps: list[ClientMap]) -> dict[str, MapData]:
    return {m.name: MapData.from_client_map(m) for m in maps}


def _now_text() -> str:
    return time.strftime("%H:%M:%S")


class _VersionAction(argparse.Action):
    """--version, looked up only when asked for (not on every start)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "show gfxclient's version and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(f"{PROG} {client_version()}")
        parser.exit()


def _dump_json(obj: Any, out: TextIO) -> None:
    out.write(json_line(obj) + "\n")
    out.flush()


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


# ------------------------------------------------------------------ list / info


def _listing_json(p: pb.ProgramListing) -> dict[str, Any]:
    return {
        "name": p.name,
        "description": p.description,
        "sha256": p.sha256,
        "scopes": [scope_name(s) for s in p.scopes],
        "available": p.available,
        "unavailable_reason": p.unavailable_reason or None,
        "requires": p.requires or None,
        "attach_points": list(p.attach_points),
        "libraries": list(p.libraries),
        "parameters": [
            {"name": x.name, "type": x.type, "required": x.required, "description": x.description}
            for x in p.parameters
        ],
        "maps": [
            {
                "name": m.name,
                "show": m.show,
                "unit": m.unit or None,
                "key_label": m.key_label or None,
                "description": m.description,
                "event_type": m.event_type or None,
            }
            for m in p.maps
        ],
    }


def cmd_list(args: argparse.Namespace, out: TextIO) -> int:
    with _connect(args) as broker:
        programs = broker.list_programs()
    if args.json:
        _dump_json({"programs": [_listing_json(p) for p in programs]}, out)
        return EXIT_OK
    if not programs:
        out.write(
            "No programs: the policy names none for you. Ask your administrator to add "
            "you to the policy.\n"
        )
        return EXIT_OK
    rows = [
        [
            p.name,
            ",".join(scope_name(s) for s in p.scopes) or "-",
            "ok" if p.available else "unavailable",
            p.description,
        ]
        for p in programs
    ]
    widths = [max(len(r[i]) for r in [["NAME", "SCOPES", "HERE", ""], *rows]) for i in range(3)]
    header = ["NAME", "SCOPES", "HERE", "DESCRIPTION"]
    for r in [header, *rows]:
        out.write("  ".join(c.ljust(widths[i]) for i, c in enumerate(r[:3])) + "  " + r[3] + "\n")
    unavailable = [p for p in programs if not p.available]
    if unavailable:
        out.write("\nCannot run on this host:\n")
        for p in unavailable:
            out.write(f"  {p.name}: {p.unavailable_reason or 'unavailable (no reason given)'}\n")
    return EXIT_OK


def cmd_info(args: argparse.Namespace, out: TextIO) -> int:
    with _connect(args) as broker:
        p = broker.program(args.name)
    if args.json:
        _dump_json(_listing_json(p), out)
        return EXIT_OK
    lines = [
        f"{p.name}: {p.description}",
        f"  sha256        {p.sha256}",
        f"  scopes        {', '.join(scope_name(s) for s in p.scopes) or '-'}",
        "  here          "
        + ("available" if p.available else f"unavailable: {p.unavailable_reason}"),
        "  attach points " + (", ".join(p.attach_points) or "-"),
    ]
    if p.requires:
        lines.insert(4, f"  needs         {p.requires}")
    if p.libraries:
        lines.append("  libraries     " + ", ".join(p.libraries))
    if p.parameters:
        lines.append("  parameters:")
        for x in p.parameters:
            req = "required" if x.required else "optional"
            lines.append(f"    --{x.name} ({x.type}, {req}): {x.description}")
    if p.maps:
        lines.append("  maps:")
        for m in p.maps:
            extra = ", ".join(x for x in (m.show, m.unit, m.key_label) if x)
            lines.append(f"    {m.name} ({extra}): {m.description}")
    else:
        lines.append("  maps          none a client can see")
    out.write("\n".join(lines) + "\n")
    return EXIT_OK


# ------------------------------------------------------------------ watch


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
        self.functions = _functions(args)
        drm_clients = DrmClientNames()
        self.fmts = {m.name: key_formatter(att, m, self.functions, drm_clients) for m in maps}
        self.prev: dict[str, MapData] | None = None
        self.prev_t = 0.0
        self.cur: dict[str, MapData] = {}
        self.rates: dict[str, dict[str, Any]] = {}
        self.dt = 0.0

    def sample(self) -> None:
        now = time.monotonic()
        cur = _snapshot(self.maps)
        if self.prev is not None:
            self.dt = now - self.prev_t
            self.rates = {n: rates(self.prev.get(n), d, self.dt) for n, d in cur.items()}
        self.prev, self.prev_t, self.cur = cur, now, cur

    def frame(self, width: int, height: int | None, limit: int | None) -> list[str]:
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


def cmd_watch(args: argparse.Namespace, out: TextIO) -> int:
    tty = out.isatty() and not args.json and not args.once
    with StopSignal() as stop, _connect(args) as broker:
        att = _attach(broker, args)
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
            raise UsageError(
                f"{att.program} reports only events: use `gfxclient stream {args.name}`"
            )
        w: Watch | CudaWatch = Watch(args, att, maps, stack_tables)
        if att.program == CUDA_PROGRAM and not args.map:
            w = _cuda_view().CudaWatch(att, maps, args.interval, args.library or "")
        screen = Screen(out) if tty else None
        start = time.monotonic()
        try:
            w.sample()
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
                if _sleep(stop, due - time.monotonic(), broker):
                    break
                w.sample()
                _emit(w, args, out, screen)
                if args.once:
                    break
                if args.duration is not None and time.monotonic() - start >= args.duration - 1e-3:
                    break
        finally:
            if screen is not None:
                screen.stop()
                # Leave the last view on the normal screen, like bpftrace prints maps at exit.
                width = shutil.get_terminal_size((100, 40)).columns
                limit = args.top or 20
                with contextlib.suppress(OSError, ValueError):
                    _write_lines(out, w.frame(width, None, limit))
                    out.flush()
    return EXIT_OK


def _emit(
    w: Watch | CudaWatch, args: argparse.Namespace, out: TextIO, screen: Screen | None
) -> None:
    if args.json:
        _dump_json(w.json_line(), out)
        return
    if screen is not None:
        size = shutil.get_terminal_size((100, 40))
        limit = _row_limit(args, len(w.maps), size.lines)
        screen.draw(w.frame(size.columns, size.lines, limit))
        return
    width = shutil.get_terminal_size((100, 40)).columns
    _write_lines(out, w.frame(max(width, 60), None, args.top), end="\n\n")
    out.flush()


def _write_lines(out: TextIO, lines: list[str], end: str = "\n") -> None:
    """Text for a terminal, escaped where it leaves (printable): other users'
    strings in it were escaped where they were formatted, this holds for all."""
    out.write("\n".join(printable(ln) for ln in lines) + end)


# ------------------------------------------------------------------ stream


def cmd_stream(args: argparse.Namespace, out: TextIO) -> int:
    with StopSignal() as stop, _connect(args) as broker:
        att = _attach(broker, args)
        stream = att.open_events(args.map, args.max or 0)
        ring = stream.map.name
        print(
            f"{PROG}: streaming {att.program} events from {ring} (attachment {att.id}, "
            f"via {broker.via}); Ctrl-C to stop",
            file=sys.stderr,
            flush=True,
        )
        deadline = None if args.duration is None else time.monotonic() + args.duration
        reported_lost = 0
        try:
            while not stop.stopped and not stream.ended:
                timeout = 0.25
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    timeout = min(timeout, left)
                records = stream.poll(timeout)
                if records:
                    stamp = time.time()
                    for rec in records:
                        out.write(_event_text(args, att.program, ring, rec, stamp) + "\n")
                    out.flush()
                if stream.lost > reported_lost:
                    print(
                        f"{PROG}: {stream.lost - reported_lost} events lost "
                        "(the consumer fell behind)",
                        file=sys.stderr,
                    )
                    reported_lost = stream.lost
        finally:
            stream.close()
    return EXIT_OK


def _event_text(args: argparse.Namespace, program: str, ring: str, rec: Any, stamp: float) -> str:
    if args.json:
        obj = {"timestamp": stamp, "program": program, "map": ring, "event": jsonable(rec)}
        return json_printable(json.dumps(obj, ensure_ascii=False))
    ms = int((stamp % 1) * 1000)
    line = format_event(rec, time.strftime("%H:%M:%S", time.localtime(stamp)) + f".{ms:03d}")
    return printable(line)


# ------------------------------------------------------------------ dump


def cmd_dump(args: argparse.Namespace, out: TextIO) -> int:
    with StopSignal() as stop, _connect(args) as broker:
        att = _attach(broker, args)
        if args.map is not None:
            cmap = att.map(args.map)
            if cmap.is_events:
                raise UsageError(
                    f"{args.map} is a ring buffer of events: use `gfxclient stream {args.name}`"
                )
            maps = [cmap]
        else:
            maps = att.table_maps()
        if args.wait:
            _sleep(stop, args.wait, broker)
        functions = _functions(args)
        stamp = time.time()
        maps, stack_tables = stack_view.left_out(maps)
        snaps = [(m, m.read()) for m in maps]
        # Named on the command line: its stacks; else a pointer in place of its rows.
        stacks = [(m, stack_view.read(m)) for m in stack_tables] if args.map else []
        left_out = [] if args.map else stack_tables
        events_only = [m.name for m in att.event_maps()] if args.map is None else []
    if args.json:
        doc = _dump_doc(att, snaps, events_only, stamp)
        doc["maps"].update({m.name: stack_view.as_json(m, s) for m, s in stacks})
        doc["stack_tables_left_out"] = [m.name for m in left_out]
        _dump_json(doc, out)
        return EXIT_OK
    lines = _dump_lines(att, snaps, functions)
    for m, s in stacks:
        lines += ["", *stack_view.lines(m, s)]
    for m in left_out:
        lines += ["", stack_view.pointer(m, args.name)]
    for name in events_only:
        lines.append("")
        lines.append(f"{name}: ring buffer of events (gfxclient stream {args.name})")
    _write_lines(out, lines)
    return EXIT_OK


Snapshot = list[tuple[ClientMap, list[tuple[Any, Any]]]]


def _dump_doc(
    att: Attachment, snaps: Snapshot, events_only: list[str], stamp: float
) -> dict[str, Any]:
    """gfxclient dump --json: the maps' decoded entries."""
    return {
        "timestamp": stamp,
        "program": att.program,
        "sha256": att.sha256,
        "scope": att.scope,
        "maps": {
            m.name: {
                "show": m.show,
                "unit": m.unit,
                "key_label": m.key_label,
                "description": m.description,
                "per_cpu": m.per_cpu,
                # Decoded values as they are: _dump_json writes them (json_line).
                "entries": [{"key": k, "value": v} for k, v in entries],
            }
            for m, entries in snaps
        },
        "event_maps": events_only,
    }


def _dump_lines(att: Attachment, snaps: Snapshot, functions: list[str]) -> list[str]:
    """gfxclient dump: each table map's entries, largest first (histograms drawn)."""
    lines = [f"{att.program} (sha256 {att.sha256[:16]}…, scope {att.scope})"]
    for m, entries in snaps:
        what = ", ".join(x for x in (m.show, m.unit, m.key_label and f"key {m.key_label}") if x)
        lines.append("")
        lines.append(f"{m.name} ({what}): {m.description}" if m.description else m.name)
        fmt = key_formatter(att, m, functions)
        if m.show == "log2_histogram":
            # From the snapshot: the attachment (and its map fds) is gone by now.
            data = MapData(m.name, m.show, m.unit, m.key_label, m.description)
            data.entries = [(k, sum_cpus(v)) for k, v in entries]
            lines.extend(histogram_lines(data, key_format=fmt))
            continue
        if not entries:
            lines.append("  (empty)")
        for k, v in _by_value(entries):
            shown = fmt(k)
            if shown != format_key(k):
                shown = f"{shown} ({format_key(k)})"
            value = format_value(v, m.unit) if not isinstance(v, dict | list) else format_plain(v)
            lines.append(f"  {shown}: {value}")
    return lines


def _by_value(entries: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Largest first: ints by value, structs by their first numeric member."""

    def weight(v: Any) -> float:
        v = sum_cpus(v)
        if isinstance(v, dict):
            v = next((x for x in v.values() if isinstance(x, int | float)), 0)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0

    return sorted(entries, key=lambda kv: -weight(kv[1]))


# ------------------------------------------------------------------ status


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    with StopSignal() as stop, _connect(args) as broker:
        hello = broker.hello()
        for name in args.attach:
            broker.attach(name, scope=args.scope)
        if args.attach and args.wait:
            _sleep(stop, args.wait, broker)
        stats = broker.stats(0)
        atts = broker.attachments
        where = broker.socket_path if broker.via == "fd" else broker.grpc_address
    programs = _program_stats(stats)
    if args.json:
        doc = _status_doc(hello, broker.via, where, atts, stats, programs)
        _dump_json(doc, out)
        return EXIT_OK
    yn = {True: "yes", False: "no"}
    lines = [
        f"broker      {hello.broker_version or '?'} (protocol {hello.protocol})",
        f"kernel      {hello.kernel_release or '?'}, {hello.possible_cpus} possible CPUs",
        f"features    direct map reads: {yn[hello.features.direct_map_reads]}, "
        f"bpf stats: {yn[hello.features.bpf_stats]}",
        f"you         uid {hello.uid} ({_user_name(hello.uid)}), gid {hello.gid}"
        + (f", pid {hello.pid}" if hello.pid else ""),
        f"transport   {broker.via} ({where}), gfxclient {client_version()}",
    ]
    if atts:
        lines.append("attachments (this session):")
        for a in atts:
            lines.append(
                f"  #{a.id} {a.program}  scope {a.scope}  shared {yn[a.shared]}  "
                f"maps {', '.join(a.maps) or '-'}"
            )
    if programs:
        lines.append("programs:")
        lines.extend(_program_table(programs))
        if not stats.stats_enabled:
            lines.append("  (run counts stay 0: kernel.bpf_stats_enabled is off)")
    else:
        lines.append(
            "programs    none attached"
            + ("" if args.attach else " (gfxclient status --attach NAME reports one)")
        )
    out.write("\n".join(lines) + "\n")
    return EXIT_OK


def _program_stats(stats: pb.StatsReply) -> list[dict[str, Any]]:
    """One dict per attached program: run counts and times (avg_ns None before a run)."""
    programs = []
    for s in stats.programs:
        avg = s.run_time_ns / s.run_cnt if s.run_cnt else None
        programs.append(
            {
                "attachment_id": s.attachment_id,
                "program": s.program,
                "function": s.function,
                "prog_id": s.prog_id,
                "run_cnt": s.run_cnt,
                "run_time_ns": s.run_time_ns,
                "avg_ns": avg,
                "recursion_misses": s.recursion_misses,
            }
        )
    return programs


def _status_doc(
    hello: pb.HelloReply,
    via: str,
    where: str | None,
    atts: list[Attachment],
    stats: pb.StatsReply,
    programs: list[dict[str, Any]],
) -> dict[str, Any]:
    """gfxclient status --json."""
    return {
        "broker_version": hello.broker_version,
        "protocol": hello.protocol,
        "kernel_release": hello.kernel_release,
        "features": {
            "direct_map_reads": hello.features.direct_map_reads,
            "bpf_stats": hello.features.bpf_stats,
        },
        "possible_cpus": hello.possible_cpus,
        "caller": {"uid": hello.uid, "gid": hello.gid, "pid": hello.pid},
        "via": via,
        "address": where,
        "client_version": client_version(),
        "attachments": [
            {
                "attachment_id": a.id,
                "program": a.program,
                "scope": a.scope,
                "shared": a.shared,
                "maps": list(a.maps),
            }
            for a in atts
        ],
        "stats_enabled": stats.stats_enabled,
        "programs": programs,
    }


def _program_table(programs: list[dict[str, Any]]) -> list[str]:
    """The programs' run counts as aligned text rows, with a header."""
    rows = [
        [
            str(p["attachment_id"]),
            p["program"],
            p["function"],
            str(p["prog_id"]),
            f"{p['run_cnt']:,}",
            humanize_ns(p["avg_ns"]) if p["avg_ns"] is not None else "-",
        ]
        for p in programs
    ]
    header = ["ATTACHMENT", "PROGRAM", "FUNCTION", "PROG ID", "RUNS", "AVG/RUN"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  "
        + "  ".join(c.ljust(widths[i]) if i < 3 else c.rjust(widths[i]) for i, c in enumerate(r))
        for r in [header, *rows]
    ]


def cmd_profile(args: argparse.Namespace, out: TextIO) -> int:
    """The body is in profile_cmd.py; Ctrl-C ends the sampling, not the command."""
    with StopSignal() as stop:
        return profile_cmd.run(args, out, _connect, stop)


COMMANDS: dict[str, Callable[[argparse.Namespace, TextIO], int]] = {
    "list": cmd_list,
    "info": cmd_info,
    "watch": cmd_watch,
    "stream": cmd_stream,
    "dump": cmd_dump,
    "status": cmd_status,
    "profile": cmd_profile,
}


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    """Combinations argparse cannot express; checked before connecting."""
    if getattr(args, "once", False) and getattr(args, "duration", None):
        raise UsageError("--once and --duration do not go together")
    if _functions(args) and not getattr(args, "library", None):
        raise UsageError("--function needs --library (the file that holds the functions)")


@contextlib.contextmanager
def _quiet_broken_pipe() -> Iterator[None]:
    try:
        yield
    except BrokenPipeError:
        # `gfxclient ... | head`: stop quietly; point stdout at /dev/null so the
        # interpreter's final flush does not complain.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        raise


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    out = out or sys.stdout
    try:
        check_args(args)
        with _quiet_broken_pipe():
            return COMMANDS[args.command](args, out)
    except BrokenPipeError:
        return EXIT_OK
    except ClientError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - people get a sentence, not a traceback
        if os.environ.get("GFXBPF_DEBUG"):
            traceback.print_exc()
        print(
            f"{PROG}: unexpected error: {type(e).__name__}: {e}\n"
            "  (a gfxclient bug: set GFXBPF_DEBUG=1 for the traceback and report it)",
            file=sys.stderr,
        )
        return EXIT_BROKER
