"""gfxclient argument parsing, --help and exit codes (no broker needed)."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from gfxbpf.client.cli import connecting, dump_cmd
from gfxbpf.client.cli import gfxclient as cli
from gfxbpf.client.cli.arguments import function_names
from gfxbpf.client.cli.stopping import StopSignal
from gfxbpf.client.errors import EXIT_DENIED, EXIT_UNREACHABLE, EXIT_USAGE, BrokerError
from gfxbpf.proto import gfxbpf_pb2 as pb


def test_global_flags_before_or_after_the_command() -> None:
    a = cli.parse_args(["--json", "--socket", "/s", "watch", "syscount"])
    b = cli.parse_args(["watch", "syscount", "--json", "--socket", "/s"])
    for args in (a, b):
        assert args.json is True
        assert args.socket == "/s"
        assert args.via == "auto"
        assert args.command == "watch" and args.name == "syscount"
        assert args.interval == 1.0 and args.duration is None and not args.once


def test_watch_options() -> None:
    args = cli.parse_args(
        [
            "--via",
            "grpc",
            "watch",
            "ucalls",
            "--pid",
            "123",
            "--library",
            "/usr/lib/libvulkan.so.1",
            "--function",
            "vkQueueSubmit,vkQueuePresentKHR",
            "--function",
            "vkAllocateMemory",
            "--interval",
            "0.5",
            "--duration",
            "3",
            "--scope",
            "self",
        ]
    )
    assert args.via == "grpc"
    assert args.pid == 123 and args.scope == "self"
    assert function_names(args) == ["vkQueueSubmit", "vkQueuePresentKHR", "vkAllocateMemory"]
    assert args.interval == 0.5 and args.duration == 3.0


def test_other_commands() -> None:
    assert cli.parse_args(["dump", "fence", "fence_latency"]).map == "fence_latency"
    assert cli.parse_args(["dump", "fence"]).map is None
    s = cli.parse_args(["stream", "execsnoop", "--max", "5", "--duration", "2"])
    assert (s.max, s.duration) == (5, 2.0)
    st = cli.parse_args(["status", "--attach", "syscount", "--attach", "execsnoop"])
    assert st.attach == ["syscount", "execsnoop"] and st.wait == 1.0
    assert cli.parse_args(["info", "vmabind"]).name == "vmabind"
    assert cli.parse_args(["list"]).command == "list"


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["watch"],
        ["watch", "x", "--interval", "0"],
        ["watch", "x", "--interval", "-1"],
        ["watch", "x", "--interval", "nan"],
        ["watch", "x", "--pid", "0"],
        ["watch", "x", "--pid", "abc"],
        ["stream", "x", "--max", "0"],
        ["--via", "pigeon", "list"],
        ["watch", "x", "--once", "--duration", "2"],
        ["watch", "x", "--function", "f"],  # needs --library
    ],
)
def test_usage_errors_exit_1(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # A usage error is found before any connection (the socket here does not exist).
    # Found before any connection: the socket named here does not exist.
    full = [*argv, "--socket", "/nonexistent/gfxbpf.sock"] if argv else argv
    code = cli.main(full, out=io.StringIO())
    err = capsys.readouterr().err
    assert code == EXIT_USAGE, err
    assert "Traceback" not in err
    assert "not running" not in err


def test_help_documents_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"], out=io.StringIO()) == 0
    text = capsys.readouterr().out
    for line in (
        "0    success",
        "1    usage error",
        "2    the broker is not running",
        "3    permission denied",
        "4    the program cannot run on this host",
        "5    any other error",
        "130  interrupted",
    ):
        assert line in text
    assert "watch" in text and "stream" in text and "status" in text


def test_unreachable_broker_message(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["--socket", "/nonexistent/control.sock", "status"], out=io.StringIO())
    assert code == EXIT_UNREACHABLE
    err = capsys.readouterr().err
    assert "broker is not running" in err
    assert "systemctl start gfxbpf.socket" in err
    assert "Traceback" not in err


def test_python_dash_m_entry_point() -> None:
    env = dict(os.environ, GFXBPF_SOCKET="/nonexistent/control.sock")
    r = subprocess.run(
        [sys.executable, "-m", "gfxbpf.client", "list"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == EXIT_UNREACHABLE
    assert "/nonexistent/control.sock" in r.stderr
    assert "Traceback" not in r.stderr


def test_stop_signal_turns_ctrl_c_into_a_flag() -> None:
    import signal
    import time

    before = signal.getsignal(signal.SIGINT)
    stop = StopSignal()
    with stop:
        t0 = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.wait(5) is True  # woken by the signal, not the timeout
        assert time.monotonic() - t0 < 2
        assert stop.stopped and stop.signum == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C insists
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    assert signal.getsignal(signal.SIGINT) is before


def test_dump_orders_by_value() -> None:
    entries = [(1, 5), (2, 50), (3, {"a": 7}), (4, [1, 2])]
    assert [k for k, _ in dump_cmd._by_value(entries)] == [2, 3, 1, 4]


def test_long_sleeps_renew_grpc_leases(monkeypatch: pytest.MonkeyPatch) -> None:
    renewed: list[int] = []

    class Att:
        def renew(self) -> None:
            renewed.append(1)

    class FakeBroker:
        via = "grpc"
        attachments = [Att()]

    monkeypatch.setattr(connecting, "RENEW_EVERY", 0.05)
    with StopSignal() as stop:
        assert connecting.sleep_renewing(stop, 0.3, FakeBroker()) is False  # type: ignore[arg-type]
    assert len(renewed) >= 3
    FakeBroker.via = "fd"
    renewed.clear()
    with StopSignal() as stop:
        connecting.sleep_renewing(stop, 0.2, FakeBroker())  # type: ignore[arg-type]
    assert renewed == []  # Unix sessions have no lease


def test_broker_error_texts_name_the_rule_once_and_hint_only_for_the_policy() -> None:
    rule = 'p.toml [[program]] #1 "syscount": scope = ["self"]'
    policy = BrokerError(pb.ERROR_PERMISSION_DENIED, f"you may not run it: {rule}", rule)
    assert str(policy).count(rule) == 1
    assert str(policy).endswith("ask your administrator to change the policy for you")
    apart = BrokerError(pb.ERROR_PERMISSION_DENIED, "you may not", rule)
    assert f"\n  policy rule: {rule}\n" in str(apart)
    # Not a policy decision (another user's process): no advice to ask the admin.
    owner = BrokerError(pb.ERROR_PERMISSION_DENIED, "process 1 belongs to uid 0, not to you")
    assert str(owner) == "permission denied: process 1 belongs to uid 0, not to you"
    assert owner.exit_code == EXIT_DENIED
    missing = BrokerError(pb.ERROR_NOT_FOUND, "no process 999999")
    assert str(missing) == "no process 999999" and missing.exit_code == EXIT_USAGE


def test_client_version_without_importlib_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    # Read from the dist-info directory's name at start-up; must agree with
    # what importlib.metadata (the slow way) says.
    from importlib import metadata

    from gfxbpf.client.broker import client_version
    from gfxbpf.client.cli import gfxclient as cli

    assert client_version() == metadata.version("gfxbpf")
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"gfxclient {client_version()}\n"
