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
import gc
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, TextIO

from gfxbpf.client.addresses import DEFAULT_GRPC, DEFAULT_SOCKET
from gfxbpf.client.cli.arguments import PROG, function_names
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
        from gfxbpf.client.broker import client_version

        print(f"{PROG} {client_version()}")
        parser.exit()


# command -> (its module, the one-line help). A command's module, and what it
# imports, loads only when that command runs (or its --help is asked for):
# the start-up a profile of a short command pays for is one command's imports.
COMMANDS: dict[str, tuple[str, str]] = {
    "list": ("list_cmd", "programs you may use, and why one cannot run here"),
    "info": ("info_cmd", "a program's description, attach points, maps, parameters"),
    "watch": ("watch_cmd", "a live view of a program's maps (Ctrl-C to stop)"),
    "stream": ("stream_cmd", "a program's events as lines or JSON lines (Ctrl-C to stop)"),
    "dump": ("dump_cmd", "one snapshot of every visible map, decoded with BTF"),
    "status": ("status_cmd", "broker version, kernel features, your attachments and their stats"),
    # kinds/dispatch: --job, --locks, --gpu, then every other profile in profile_cmd
    "profile": (
        "kinds.dispatch",
        "CPU, off-CPU or wall-clock profile (flame graph) of your processes, "
        "or the stacks that call a function",
    ),
}
# Global options that take a value: what follows them is no command name.
_VALUED = ("--socket", "--grpc", "--via", "--tls-ca", "--tls-cert", "--tls-key")


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"gfxbpf.client.cli.{COMMANDS[name][0]}")


def _more(name: str) -> str:
    """What a command's --help adds to its one line (examples)."""
    if name == "watch":
        return (
            "; with --json, one object {timestamp, program, maps: {name: entries}} per "
            "interval, the first right after attaching (its rates are null)\n\n"
            + _module("watch").EXAMPLES
        )
    if name == "profile":
        return "\n\n" + _module("profile").EXAMPLES
    return ""


def _add_command_arguments(name: str, p: argparse.ArgumentParser) -> None:
    mod = _module(name)
    if hasattr(mod, "add_arguments"):
        mod.add_arguments(p)


def build_parser(only: str | None = None, alone: bool = False) -> argparse.ArgumentParser:
    """The whole parser; with only, every command's arguments and global flags
    but that one's left out (a command line names one command: parse_args).
    The others stay in the list of commands, so every --help reads the same;
    alone leaves them out too (parse_args: when no main help can be printed)."""
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
    for name, (_module_name, help_text) in COMMANDS.items():
        full = only is None or only == name
        if alone and not full:
            continue
        p = sub.add_parser(
            name,
            help=help_text,
            description=help_text + (_more(name) if full else ""),
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if full:  # the others are only named in the list of commands: never parsed
            _add_globals(p, top=False)
            _add_command_arguments(name, p)
    return parser


def command_named(argv: list[str]) -> str:
    """The command argv names: the first command name that is no global
    option's value ("" for none: the parser then reports what is wrong)."""
    words = iter(argv)
    for word in words:
        if word == "--":
            break
        if word in _VALUED:
            next(words, None)
        elif word in COMMANDS:
            return word
    return ""


# ------------------------------------------------------------------ main


def _help_before(argv: list[str], command: str) -> bool:
    """Whether a word before the command may ask for the main help (-h, --help,
    an abbreviation), which lists every command."""
    for word in argv:
        if word == command:
            return False
        if word.startswith(("-h", "--h")):
            return True
    return False


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else argv
    only = command_named(argv)
    # A named command, and no main help to print: its parser is the only one
    # needed (each other one costs ~0.3 ms; issue 37).
    alone = bool(only) and not _help_before(argv, only)
    return build_parser(only=only, alone=alone).parse_args(argv)


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
            run: Callable[[argparse.Namespace, TextIO], int] = _module(args.command).command
            return run(args, out)
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
            import traceback  # only here: ~1 ms of every start otherwise

            traceback.print_exc()
        print(
            f"{PROG}: unexpected error: {type(e).__name__}: {e}\n"
            "  (a gfxclient bug: set GFXBPF_DEBUG=1 for the traceback and report it)",
            file=sys.stderr,
        )
        return EXIT_BROKER


def run() -> None:
    """The gfxclient program (pyproject's script, python -m gfxbpf.client): main,
    then exit without the interpreter's last full garbage collection. The
    objects left are freed with the process anyway; that collection walks all of
    them (protobuf's descriptors, a dump's rows) for 5-15 ms of every command
    (issue 37). atexit handlers and the flush of stdout still run."""
    code = main()
    gc.freeze()
    sys.exit(code)
