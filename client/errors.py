"""Client-side errors, with messages written for the person at the terminal.

Every error the library raises is a ClientError; `exit_code` is what
gfxclient exits with (documented in `gfxclient --help`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where a broker's error is read: gfxclient --help needs no protobuf
    from gfxbpf.proto import gfxbpf_pb2 as pb

# Exit codes of gfxclient (cli/gfxclient.py documents them in --help).
EXIT_OK = 0
EXIT_USAGE = 1  # bad arguments or input
EXIT_UNREACHABLE = 2  # the broker is not running or cannot be reached
EXIT_DENIED = 3  # the policy (or the socket's permissions) said no
EXIT_UNAVAILABLE = 4  # the program cannot run on this host
EXIT_BROKER = 5  # any other error the broker reported
EXIT_INTERRUPTED = 130  # Ctrl-C outside watch/stream (where Ctrl-C is the normal stop)

START_HINT = (
    "an administrator starts it (as root) with `systemctl start gfxbpf.socket` where "
    "systemd runs, else with `tools/broker.sh start` from the gfxbpf checkout (see "
    "deploy/README.md); or point --socket / GFXBPF_SOCKET at a running broker"
)


class ClientError(Exception):
    """Base of every client error; str() is the message for people."""

    exit_code = EXIT_BROKER


class UsageError(ClientError):
    """The caller asked for something malformed (bad flag value, unknown map ...)."""

    exit_code = EXIT_USAGE


class BrokerUnreachable(ClientError):
    """No broker answers at the socket or gRPC address."""

    exit_code = EXIT_UNREACHABLE


class ProtocolError(ClientError):
    """The broker answered with something the client cannot understand."""

    exit_code = EXIT_BROKER


class BrokerError(ClientError):
    """An Error reply from the broker: code (pb.ErrorCode), message, rule."""

    def __init__(self, code: int, message: str, rule: str = "", *, operation: str = "") -> None:
        self.code = code
        self.message = message
        self.rule = rule
        self.operation = operation
        super().__init__(self._text())

    @property
    def code_name(self) -> str:
        from gfxbpf.proto import gfxbpf_pb2 as pb

        try:
            return pb.ErrorCode.Name(self.code)
        except ValueError:
            return f"ERROR_{self.code}"

    @property
    def refuses_program(self) -> bool:
        """The program is not this caller's to run here: the policy's refusal (it
        names its rule) or a catalog without it. False for a refusal of the
        request itself (another user's process, one that is gone), which a
        fallback to another program would only hide behind that one's refusal."""
        from gfxbpf.proto import gfxbpf_pb2 as pb

        if self.code == pb.ERROR_PERMISSION_DENIED:
            return bool(self.rule)
        return self.code == pb.ERROR_NOT_FOUND and self.message.startswith("no program ")

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        from gfxbpf.proto import gfxbpf_pb2 as pb

        if self.code in (pb.ERROR_PERMISSION_DENIED, pb.ERROR_UNAUTHENTICATED):
            return EXIT_DENIED
        if self.code == pb.ERROR_UNAVAILABLE:
            return EXIT_UNAVAILABLE
        if self.code in (pb.ERROR_INVALID_ARGUMENT, pb.ERROR_NOT_FOUND):
            return EXIT_USAGE
        return EXIT_BROKER

    def _text(self) -> str:
        from gfxbpf.proto import gfxbpf_pb2 as pb

        message = self.message or self.code_name
        if self.code == pb.ERROR_PERMISSION_DENIED:
            text = f"permission denied: {message}"
            if not self.rule:  # not the policy's doing (e.g. someone else's process)
                return text
            if self.rule not in message:
                text += f"\n  policy rule: {self.rule}"
            return text + "\n  ask your administrator to change the policy for you"
        if self.code == pb.ERROR_UNAUTHENTICATED:
            return (
                f"not authenticated: {message}\n  a gRPC token comes from the Unix socket "
                "(gfxclient gets one itself when it can reach the socket); remote users need "
                "a client certificate the policy maps to them"
            )
        if self.code == pb.ERROR_UNAVAILABLE:
            return f"not available on this host: {message}"
        if self.code == pb.ERROR_RESOURCE_EXHAUSTED:
            text = f"limit reached: {message}"
            if self.rule and self.rule not in message:
                text += f"\n  policy rule: {self.rule}"
            return text + "\n  detach something (end other gfxclient sessions) and retry"
        if self.rule and self.rule not in message:
            return f"{message}\n  policy rule: {self.rule}"
        return message


def from_pb(err: pb.Error, operation: str = "") -> BrokerError:
    return BrokerError(err.code, err.message, err.rule, operation=operation)
