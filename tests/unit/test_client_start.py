"""What a gfxclient command imports before it works (issue 37: the fixed cost of
a short command is mostly its imports). A command loads its own module and the
library it uses, not the other commands, not grpc unless it connects over
gRPC, not dataclasses/inspect, and not protobuf's pure-Python message module
(the upb backend never reads it). Checked by what lands in sys.modules of a
fresh interpreter, not by timing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gfxbpf.client.cli.gfxclient import COMMANDS

# Loaded by nothing on the fd path of dump or watch (each was, before issue 37).
NEVER_ON_THE_FD_PATH = (
    "grpc",
    "gfxbpf.client.grpc_transport",
    "gfxbpf.client.tokens",
    "dataclasses",
    "inspect",
    "traceback",
    "google.protobuf.text_format",
    "google.protobuf.internal.decoder",
)


# watch loads the modules of its view after the first sample, inside the first
# interval (`watch --once`: that interval is sleep otherwise).
LOADED_LATER = {
    "dump": (),
    "watch": (
        "gfxbpf.client.cli.display",
        "gfxbpf.client.cli.output",
        "gfxbpf.client.drmclients",
        "json",
    ),
}


# The list is taken before json is imported to print it.
_PRINT_MODULES = "\nimport sys\nmods = sorted(sys.modules)\nimport json\nprint(json.dumps(mods))"


def _modules_after(code: str) -> list[str]:
    r = subprocess.run(
        [sys.executable, "-c", code + _PRINT_MODULES],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def _command_module(name: str) -> str:
    return f"gfxbpf.client.cli.{COMMANDS[name][0]}"


@pytest.mark.parametrize(
    "argv",
    [
        ["--json", "dump", "clonecount", "counts"],
        ["--json", "watch", "syscount", "--once", "--interval", "0.1"],
    ],
    ids=["dump", "watch"],
)
def test_a_command_loads_its_module_and_no_other(argv: list[str]) -> None:
    """Parse the command line and load the command's module, as main() does
    before it connects (the connection's own modules come with it)."""
    command = argv[1]
    loaded = _modules_after(
        "from gfxbpf.client.cli import gfxclient\n"
        f"args = gfxclient.parse_args({argv!r})\n"
        "gfxclient._module(args.command)\n"
        "import gfxbpf.client.broker, gfxbpf.client.connection\n"
    )
    assert _command_module(command) in loaded
    others = [_command_module(n) for n in COMMANDS if n != command]
    assert [m for m in others if m in loaded] == []
    assert [m for m in NEVER_ON_THE_FD_PATH if m in loaded] == []
    assert [m for m in LOADED_LATER[command] if m in loaded] == []


def test_the_list_of_commands_loads_no_command_module() -> None:
    loaded = _modules_after(
        "import contextlib, io\n"
        "from gfxbpf.client.cli import gfxclient\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    gfxclient.parse_args(['--help'])\n"
    )
    assert [m for m in (_command_module(n) for n in COMMANDS) if m in loaded] == []
    assert "grpc" not in loaded
    # Nor protobuf (the broker's messages): the package and the errors load it
    # where a broker is reached, not at the start of every command.
    assert [m for m in loaded if m.startswith(("google.protobuf", "gfxbpf.proto."))] == []


def test_the_package_names_still_resolve_on_first_use() -> None:
    import gfxbpf.client as client

    for name in client.__all__:
        assert getattr(client, name).__name__ == name


def test_protobufs_pure_python_module_still_loads_when_used() -> None:
    """Deferred, not removed: the messages work, and whoever reads the pure
    Python module gets the real one."""
    code = (
        "import sys\n"
        "from gfxbpf.proto import gfxbpf_pb2 as pb\n"
        "req = pb.Request(id=7)\n"
        "req.detach.CopyFrom(pb.DetachRequest(attachment_id=3))\n"
        "back = pb.Request.FromString(req.SerializeToString())\n"
        "assert back.detach.attachment_id == 3 and back.id == 7, back\n"
        "unread = 'google.protobuf.text_format' not in sys.modules\n"
        "from google.protobuf.internal import python_message\n"
        "assert callable(python_message.GeneratedProtocolMessageType)\n"
        "print(unread, 'google.protobuf.text_format' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True"]


@pytest.mark.parametrize("argv", [["--help", "dump"], ["-h", "watch"], ["--he", "list"]])
def test_the_main_help_before_a_command_still_lists_every_command(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A named command's parser is built alone, unless a help flag before it
    prints the main help: that lists them all."""
    from gfxbpf.client.cli.gfxclient import parse_args

    with pytest.raises(SystemExit):
        parse_args(argv)
    listed = capsys.readouterr().out.split("COMMAND", 2)[-1]
    assert [n for n in COMMANDS if f"    {n} " not in listed] == []
