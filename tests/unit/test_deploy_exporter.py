"""deploy/ for the exporter: its hardened unit, its user, its example config and policy,
the Prometheus scrape config. Offline, like tests/unit/test_deploy.py for the broker."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from gfxbpf.exporter.config import load_config
from tests.unit.test_deploy import (
    allowed_syscalls,
    need,
    need_root,
    run,
    security_report,
    syscall_groups,
)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SERVICE = DEPLOY / "gfxbpf-exporter.service"
SYSUSERS = DEPLOY / "sysusers.d" / "gfxbpf-exporter.conf"
TMPFILES = DEPLOY / "tmpfiles.d" / "gfxbpf-exporter.conf"
BROKER_TMPFILES = DEPLOY / "tmpfiles.d" / "gfxbpf.conf"
EXAMPLE = DEPLOY / "exporter.example.toml"
POLICY = DEPLOY / "policy.example.toml"
SCRAPE = DEPLOY / "grafana" / "prometheus.yml"
USER = "gfxbpf-exporter"

sys.path.insert(0, str(ROOT / "tools"))
from unit_exec import read_unit, unit_exec  # noqa: E402

MAX_EXPOSURE = 2.0
# What `systemd-analyze security` may still count against the unit, each
# explained in the unit file: Prometheus must reach it, and reading the map
# fds the broker passes is a bpf(2) call.
ACCEPTED_FINDINGS = {
    "SystemCallFilter=~@privileged",  # bpf (map reads on passed fds)
    "RootDirectory=/RootImage=",
    "RestrictAddressFamilies=~AF_UNIX",
    "RestrictAddressFamilies=~AF_(INET|INET6)",
    "PrivateNetwork=",
    "IPAddressDeny=",
    "PrivateUsers=",
    "DeviceAllow=",  # char-rtc:r, added by ProtectClock=yes
}
# What the exporter does: connect to the broker, read map fds (bpf), map ring
# buffers, serve HTTP (CPython, prometheus-client's threads).
EXPORTER_SYSCALLS = (
    "bpf",
    "mmap",
    "munmap",
    "epoll_create1",
    "epoll_ctl",
    "epoll_wait",
    "socket",
    "connect",
    "bind",
    "listen",
    "accept4",
    "sendmsg",
    "recvmsg",
    "clone3",
    "futex",
    "openat",
    "read",
    "close",
)


def test_security_exposure_at_most_2(tmp_path: Path) -> None:
    exposure, failing, out = security_report(SERVICE, tmp_path, "gfxbpf-exporter.service")
    assert exposure <= MAX_EXPOSURE, f"exposure {exposure} > {MAX_EXPOSURE}:\n{out}"
    unexpected = failing - ACCEPTED_FINDINGS
    assert not unexpected, f"hardening regressed on {sorted(unexpected)}:\n{out}"


def test_no_privilege_at_all() -> None:
    info = unit_exec(SERVICE)
    assert info.user == USER and info.group == USER
    assert info.ambient_caps == frozenset()
    assert info.bounding_caps == frozenset()  # CapabilityBoundingSet= (empty)
    assert info.no_new_privileges
    assert info.argv == [
        "/opt/gfxbpf/venv/bin/gfxbpf-exporter",
        "--config",
        "/etc/gfxbpf-exporter/exporter.toml",
    ]
    svc = {k: v[-1] for k, v in read_unit(SERVICE)["Service"].items()}
    assert svc["ProtectSystem"] == "strict" and svc["ProtectHome"] == "yes"
    assert svc["RestartPreventExitStatus"] == "2"  # a bad config is not retried in a loop


def test_syscall_filter_lets_the_exporter_work() -> None:
    groups = syscall_groups()
    allowed = allowed_syscalls(read_unit(SERVICE)["Service"]["SystemCallFilter"], groups)
    missing = [s for s in EXPORTER_SYSCALLS if s not in allowed]
    assert not missing, f"SystemCallFilter refuses syscalls the exporter needs: {missing}"
    for bad in ("perf_event_open", "ptrace", "setuid", "mount", "init_module", "capset"):
        assert bad not in allowed, bad


def test_sysusers_creates_the_exporter_user(tmp_path: Path) -> None:
    need_root()
    need("systemd-sysusers")
    (tmp_path / "etc").mkdir()
    r = run(["systemd-sysusers", f"--root={tmp_path}", str(SYSUSERS)])
    assert r.returncode == 0, r.stderr
    passwd = [ln.split(":") for ln in (tmp_path / "etc/passwd").read_text().splitlines()]
    (fields,) = [f for f in passwd if f[0] == USER]
    assert 0 < int(fields[2]) < 1000 and fields[6].endswith("nologin")
    groups = [ln.split(":") for ln in (tmp_path / "etc/group").read_text().splitlines()]
    assert not [g for g in groups if g[0] == "gfxbpf" and USER in g[3].split(",")]


def test_example_config_is_valid_and_the_example_policy_allows_it() -> None:
    config = load_config(EXAMPLE)
    assert config.broker.socket == "/run/gfxbpf/control.sock"
    policy = tomllib.loads(POLICY.read_text())["program"]
    catalog = {
        p["name"] for p in tomllib.loads((ROOT / "catalog/catalog.toml").read_text())["program"]
    }
    for p in config.programs:
        assert p.name in catalog, p.name
        entries = [e for e in policy if e["name"] == p.name and USER in e.get("users", [])]
        scopes = {
            s
            for e in entries
            for s in ([e["scope"]] if isinstance(e["scope"], str) else e["scope"])
        }
        assert p.scope in scopes, f"no policy entry lets {USER} run {p.name} with {p.scope}"


def test_check_config_command_on_the_example() -> None:
    exe = shutil.which("gfxbpf-exporter") or str(Path(sys.executable).with_name("gfxbpf-exporter"))
    r = subprocess.run(
        [exe, "--check-config", str(EXAMPLE)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "valid" in r.stdout, r.stderr


def test_prometheus_scrape_config_passes_promtool() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        need("promtool")
        return
    r = subprocess.run(
        [promtool, "check", "config", "--syntax-only", str(SCRAPE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def tmpfiles_dirs(path: Path) -> dict[str, tuple[str, str, str]]:
    """d lines of a tmpfiles.d file: path -> (mode, user, group)."""
    out = {}
    for ln in path.read_text().splitlines():
        f = ln.split()
        if f and f[0] == "d":
            out[f[1]] = (f[2], f[3], f[4])
    return out


def test_the_unit_can_read_its_config() -> None:
    """The config's directory is one the exporter's user may enter: not /etc/gfxbpf
    (0750 root:gfxbpf, the policy), whose group it is deliberately not in."""
    config = Path(unit_exec(SERVICE).argv[2])
    dirs = tmpfiles_dirs(TMPFILES)
    assert str(config.parent) in dirs, f"{config.parent} is not created by {TMPFILES.name}"
    mode, _, group = dirs[str(config.parent)]
    assert group == USER and int(mode, 8) & 0o050 == 0o050 and int(mode, 8) & 0o007 == 0
    broker_dirs = tmpfiles_dirs(BROKER_TMPFILES)
    for parent in config.parents:
        if str(parent) in broker_dirs:
            mode, _, group = broker_dirs[str(parent)]
            assert int(mode, 8) & 0o001 or group == USER, f"{parent} keeps {USER} out"


def test_tmpfiles_creates_the_config_directory(tmp_path: Path) -> None:
    need_root()
    need("systemd-tmpfiles")
    (tmp_path / "etc").mkdir()
    assert run(["systemd-sysusers", f"--root={tmp_path}", str(SYSUSERS)]).returncode == 0
    r = run(["systemd-tmpfiles", f"--root={tmp_path}", "--create", str(TMPFILES)])
    assert r.returncode == 0, r.stderr
    st = (tmp_path / "etc/gfxbpf-exporter").stat()
    groups = [ln.split(":") for ln in (tmp_path / "etc/group").read_text().splitlines()]
    (gid,) = [int(g[2]) for g in groups if g[0] == USER]
    assert st.st_uid == 0 and st.st_gid == gid and st.st_mode & 0o777 == 0o750
