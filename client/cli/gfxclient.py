"""gfxclient: the command line over the client library. This module builds the
parser and dispatches; each command is a module of its own (list_cmd.py ...).

Errors are printed for people (never a traceback; GFXBPF_DEBUG=1 adds one
for unexpected errors) and mapped to the exit codes listed in --help.
watch and stream end normally on Ctrl-C (exit 0): the screen is restored,
the cursor shown, and the session closed (the broker detaches).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from gfxbpf.client.broker import client_version
from gfxbpf.client.cli import (
    dump_cmd,
    gpu_profile,
    info_cmd,
    list_cmd,
    profile_cmd,
    status_cmd,
    stream_cmd,
    watch_cmd,
)
from gfxbpf.client.cli.arguments import function_names
from gfxbpf.client.cli.kinds import locks as lock_profile
from gfxbpf.client.cli.kinds import memory as memory_args
from gfxbpf.client.cli.output import PROG
from gfxbpf.client.connection import DEFAULT_SOCKET
from gfxbpf.client.errors import (
    EXIT_BROKER,
    EXIT_DENIED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    ClientError,
    UsageError,
)
from gfxbpf.client.grpc_config import DEFAULT_GRPC
from gfxbpf.client.slurm import profile_job

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


class _VersionAction(argparse.Action):
    """--version, looked up only when asked for (not on every start)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "show gfxclient's version and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(f"{PROG} {client_version()}")
        parser.exit()


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
    info_cmd.add_arguments(
        command("info", "a program's description, attach points, maps, parameters")
    )
    p = command(
        "watch",
        "a live view of a program's maps (Ctrl-C to stop)",
        "; with --json, one object {timestamp, program, maps: {name: entries}} per "
        "interval, the first right after attaching (its rates are null)\n\n" + watch_cmd.EXAMPLES,
    )
    watch_cmd.add_arguments(p)
    stream_cmd.add_arguments(
        command("stream", "a program's events as lines or JSON lines (Ctrl-C to stop)")
    )
    dump_cmd.add_arguments(command("dump", "one snapshot of every visible map, decoded with BTF"))
    status_cmd.add_arguments(
        command("status", "broker version, kernel features, your attachments and their stats")
    )
    p = command(
        "profile",
        "CPU, off-CPU or wall-clock profile (flame graph) of your processes, "
        "or the stacks that call a function",
        "\n\n" + profile_cmd.EXAMPLES + "\n" + profile_job.EXAMPLES,
    )
    profile_cmd.add_arguments(p)
    gpu_profile.add_arguments(p)
    profile_job.add_arguments(p)
    lock_profile.add_arguments(p)
    memory_args.add_arguments(p)
    return parser


COMMANDS: dict[str, Callable[[argparse.Namespace, TextIO], int]] = {
    "list": list_cmd.command,
    "info": info_cmd.command,
    "watch": watch_cmd.command,
    "stream": stream_cmd.command,
    "dump": dump_cmd.command,
    "status": status_cmd.command,
    # --job there, --locks in kinds/locks, --gpu in gpu_profile, the others in profile_cmd
    "profile": profile_job.command,
}


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    """Combinations argparse cannot express; checked before connecting."""
    if getattr(args, "once", False) and getattr(args, "duration", None):
        raise UsageError("--once and --duration do not go together")
    if function_names(args) and not getattr(args, "library", None):
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
