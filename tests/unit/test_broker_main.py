"""broker.main (socket activation, sd_notify, the control socket, start errors)
and broker.admin (approve, audit), offline."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gfxbpf.broker import admin, main
from gfxbpf.broker.policy.rules import Policy
from gfxbpf.catalog.entries import load_catalog

ROOT = Path(__file__).resolve().parents[2]
OBJECTS = ROOT / "tests" / "data" / "objects"


def test_listen_fds_checks_the_pid() -> None:
    me = str(os.getpid())
    assert main.listen_fds({"LISTEN_PID": me, "LISTEN_FDS": "2"}) == [3, 4]
    assert main.listen_fds({"LISTEN_PID": "1", "LISTEN_FDS": "2"}) == []
    assert main.listen_fds({"LISTEN_PID": me, "LISTEN_FDS": "0"}) == []
    assert main.listen_fds({"LISTEN_FDS": "1"}) == []
    assert main.listen_fds({"LISTEN_PID": me, "LISTEN_FDS": "x"}) == []


def test_sd_notify(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(path)
        assert main.sd_notify("READY=1", {"NOTIFY_SOCKET": path})
        assert s.recv(100) == b"READY=1"
    assert not main.sd_notify("READY=1", {})
    assert not main.sd_notify("READY=1", {"NOTIFY_SOCKET": str(tmp_path / "gone")})


def test_bind_socket_replaces_a_stale_one(tmp_path: Path) -> None:
    path = str(tmp_path / "control.sock")
    old = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    old.bind(path)
    old.close()  # stale file, nobody listening
    s = main.bind_socket(path)
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o666
        assert s.type == socket.SOCK_SEQPACKET
        with pytest.raises(main.StartError, match="another broker"):
            main.bind_socket(path)
    finally:
        s.close()
    (tmp_path / "file").write_text("x")
    with pytest.raises(main.StartError, match="not a socket"):
        main.bind_socket(str(tmp_path / "file"))
    with pytest.raises(main.StartError, match="does not exist"):
        main.bind_socket(str(tmp_path / "nodir" / "c.sock"))


def test_activated_socket_must_be_seqpacket() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with pytest.raises(main.StartError, match="SOCK_SEQPACKET"):
            main._activated_socket([os.dup(a.fileno())])
    finally:
        a.close()
        b.close()


def run_broker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gfxbpf.broker", *args], capture_output=True, text=True, timeout=60
    )


def test_start_error_is_one_line(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.toml")
    r = run_broker("--policy", missing, "--socket", str(tmp_path / "c.sock"))
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"gfxbpf-broker: invalid policy: {missing}: cannot read")


def test_check_policy_exit_codes(tmp_path: Path) -> None:
    sha = load_catalog().get("syscount").sha256
    good = tmp_path / "good.toml"
    good.write_text(f'[[program]]\nname = "syscount"\nsha256 = "{sha}"\nusers = [1001]\n')
    r = run_broker("--check-policy", "--policy", str(good))
    assert r.returncode == 0 and f"{good}: OK" in r.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text('[[program]]\nname = "syscount"\nscope = "everywhere"\n')
    r = run_broker("--check-policy", "--policy", str(bad))
    assert r.returncode == 1 and "INVALID" in r.stdout and "field 'scope'" in r.stdout


def test_admin_approve_prints_a_valid_entry(capsys: pytest.CaptureFixture[str]) -> None:
    assert admin.main(["approve", "execsnoop", "--users", "alice,1001", "--scope", "self"]) == 0
    text = capsys.readouterr().out
    policy = Policy.parse(text)
    (entry,) = policy.programs
    assert entry.name == "execsnoop"
    assert entry.sha256 == load_catalog().get("execsnoop").sha256
    assert entry.users == ("alice", 1001) and entry.scopes == ("self",)
    assert policy.decide(1001, [], "execsnoop", entry.sha256, "self").allowed


def test_admin_approve_refuses_bad_requests(capsys: pytest.CaptureFixture[str]) -> None:
    assert admin.main(["approve", "vmabind", "--users", "a", "--scope", "self"]) == 2
    assert "supports scope system" in capsys.readouterr().err
    assert admin.main(["approve", "syscount"]) == 2
    assert admin.main(["approve", "nosuch", "--users", "a"]) == 1
    assert "no program 'nosuch'" in capsys.readouterr().err


def test_admin_audit(capsys: pytest.CaptureFixture[str]) -> None:
    assert admin.main(["audit", str(OBJECTS / "probe_write_user.bpf.o")]) == 1
    out = capsys.readouterr().out
    assert "helpers: map_update_elem, probe_write_user" in out
    assert "verdict: refused" in out
    cat = load_catalog().get("syscount")
    assert admin.main(["audit", str(cat.directory / cat.object)]) == 0
    out = capsys.readouterr().out
    assert "type raw_tracepoint" in out and "verdict: accepted" in out
    assert admin.main(["audit", "/nonexistent.bpf.o"]) == 1


def _paranoid_file(tmp_path: Path, level: str) -> str:
    path = tmp_path / "perf_event_paranoid"
    path.write_text(level + "\n")
    return str(path)


@pytest.mark.parametrize("level", ["3", "4"])
def test_debians_paranoid_levels_are_named_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, level: str
) -> None:
    """Level 3 (Debian's default) and Ubuntu's 4 refuse CAP_PERFMON: the start
    line says so and names the programs that cannot attach."""
    from io import StringIO

    from gfxbpf.bpf.link import perf
    from gfxbpf.broker.auditlog import AuditLog

    monkeypatch.setattr(perf, "PARANOID", _paranoid_file(tmp_path, level))
    monkeypatch.setattr(perf, "_holds_cap_sys_admin", lambda: False)  # the broker's caps
    monkeypatch.setattr(perf, "_may_open_perf_events", lambda: False)  # such a kernel's answer
    buf = StringIO()
    main._check_perf_paranoid(AuditLog(buf), load_catalog())
    line = buf.getvalue()
    assert '"op":"host_check"' in line and '"result":"error"' in line, line
    assert f"kernel.perf_event_paranoid is {level}" in line and "CAP_SYS_ADMIN" in line
    for name in ("stackcopy", "profile", "vmabind", "clonecount"):
        assert name in line
    # tp_btf and raw tracepoints need no perf event: not named.
    for name in ("offcpu", "syscount", "execsnoop"):
        assert f" {name}," not in line and not line.endswith(name)


@pytest.mark.parametrize("level", ["-1", "2", "junk"])
def test_upstream_paranoid_levels_say_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, level: str
) -> None:
    from io import StringIO

    from gfxbpf.bpf.link import perf
    from gfxbpf.broker.auditlog import AuditLog

    monkeypatch.setattr(perf, "PARANOID", _paranoid_file(tmp_path, level))
    buf = StringIO()
    main._check_perf_paranoid(AuditLog(buf), load_catalog())
    assert buf.getvalue() == ""


def test_perf_event_programs_are_those_without_another_way() -> None:
    from gfxbpf.catalog.instance import perf_event_programs

    names = perf_event_programs(load_catalog())
    assert {"stackcopy", "profile", "cgroupcpu", "vmabind", "clonecount"} <= set(names)
    assert not {"offcpu", "syscount", "execsnoop", "ucalls", "locks"} & set(names)


def admin_approve(name: str) -> str:
    """What `gfxbpf-admin approve NAME --users 1001 --scope self` prints."""
    from contextlib import redirect_stdout
    from io import StringIO

    out = StringIO()
    with redirect_stdout(out):
        assert admin.main(["approve", name, "--users", "1001", "--scope", "self"]) == 0
    return out.getvalue()


def test_check_policy_warns_of_entries_the_hosts_paranoid_level_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from io import StringIO

    from gfxbpf.bpf.link import perf
    from gfxbpf.broker.config import check_policy

    policy = tmp_path / "policy.toml"
    policy.write_text(
        "".join(admin_approve(name) for name in ("stackcopy", "offcpu", "clonecount"))
    )
    # Debian's kernel refuses the broker's caps at 3, asked from root or not.
    monkeypatch.setattr(perf, "_may_open_without_admin", lambda: False)
    monkeypatch.setattr(perf, "_may_open_perf_events", lambda: False)
    for level, stopped in (("3", ["stackcopy", "clonecount"]), ("2", [])):
        monkeypatch.setattr(perf, "PARANOID", _paranoid_file(tmp_path, level))
        out = StringIO()
        assert check_policy(str(policy), out) == 0
        said = [w for w in out.getvalue().splitlines() if "cannot attach on this host" in w]
        assert [w.split("'")[1] for w in said] == stopped, out.getvalue()
        assert all("kernel.perf_event_paranoid is 3" in w for w in said)
