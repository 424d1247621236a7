"""gfxbpf-exporter end to end: the broker (gfxbpf, two capabilities), the exporter as
another unprivileged user, and a real Prometheus scraping it every second.

The workload runs as the exporter's own user, and the programs are attached
with scope "self", so the kernel counts exactly the workload's events (other
users' processes on a shared host cannot add to them): N getppid calls must
show as exactly +N in syscount's counter and ucalls' call counter, N in
ucalls' latency histogram's _count, and M execs as +M in execsnoop's events.
Then the broker is killed and restarted: gfxbpf_up goes 0, then 1, and the
counters count again. /metrics is served over HTTPS with required client
certificates ([listen_tls]), as Prometheus scrapes it; another local user
without one reads nothing.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.procs import stop as stop_process
from tests.kernel.brokerenv import (
    BASE_ENV,
    BROKER_USER,
    MALLORY,
    ROOT,
    VENV,
    VENV_PYTHON,
    BrokerProcess,
    ensure_user,
    policy_for,
    run_as,
    shared_dir,
    wait_until,
)
from tests.kernel.promenv import PrometheusServer, free_port, get_or_empty, http_get
from tests.tlscerts import make_ca, strict_client_context

sys.path.insert(0, str(ROOT / "tools"))
from unit_exec import setpriv_argv, unit_exec  # noqa: E402

pytestmark = pytest.mark.kernel

# The test's own user in place of the unit's User=gfxbpf-exporter, created
# here as brokerenv creates `gfxbpf` (a system user, no home, no shell): the
# counts are exact, and an exporter the host already runs as gfxbpf-exporter
# would add its own system calls and execs to them.
EXPORTER_USER = "gfxtest-exporter"
EXPORTER_UNIT = ROOT / "deploy" / "gfxbpf-exporter.service"
LIBC = os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")
SYSCALLS = 'gfxbpf_syscount_counts_total{syscall="getppid"}'
CALLS = 'gfxbpf_ucalls_calls_total{function="getppid"}'
LATENCY_COUNT = 'gfxbpf_ucalls_latency_seconds_count{function="getppid"}'
EXECS = "gfxbpf_execsnoop_events_total"

WORKLOAD = """
import os, sys
print(os.getpid(), flush=True)
for line in sys.stdin:
    cmd, n = line.split()
    for _ in range(int(n)):
        if cmd == "getppid":
            os.getppid()
        else:
            pid = os.fork()
            if pid == 0:
                try:
                    os.execv("/bin/true", ["true"])
                finally:
                    os._exit(127)
            os.waitpid(pid, 0)
    print("done", flush=True)
"""


def policy() -> str:
    user = [EXPORTER_USER]
    return policy_for(
        {
            "syscount": {"users": user, "scope": "self"},
            "execsnoop": {"users": user, "scope": "self"},
            "ucalls": {"users": user, "scope": "self", "libraries": [LIBC]},
            "vmabind": {"users": user, "scope": "system"},
        }
    )


def exporter_config(socket_path: str, port: int, pid: int, tls: Path) -> str:
    return f"""
listen = "127.0.0.1:{port}"
[listen_tls]
cert = "{tls / "server.crt"}"
key = "{tls / "server.key"}"
client_ca = "{tls / "ca.crt"}"
[broker]
socket = "{socket_path}"
via = "fd"
[[program]]
name = "syscount"
scope = "self"
[[program]]
name = "execsnoop"
scope = "self"
[[program]]
name = "ucalls"
scope = "self"
pid = {pid}
library = "{LIBC}"
functions = ["getppid"]
[[program]]
name = "vmabind"
"""


class Workload:
    """A process of the exporter's user that makes getppid calls and execs on request."""

    def __init__(self) -> None:
        self.proc = run_as(
            EXPORTER_USER,
            [VENV_PYTHON, "-c", WORKLOAD],
            background=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.pid = int(self.proc.stdout.readline())

    def run(self, cmd: str, n: int) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{cmd} {n}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "done"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@dataclass
class Stack:
    base: Path
    socket: str
    port: int
    broker: BrokerProcess
    exporter: subprocess.Popen[bytes]
    workload: Workload
    prom: PrometheusServer
    tls: Path

    def start_broker(self) -> BrokerProcess:
        self.broker = BrokerProcess.start(
            policy(), self.base, grpc=False, overrides={"--socket": self.socket}
        )
        return self.broker

    def scrape(self) -> str:
        """/metrics as Prometheus gets it (its client certificate)."""
        ctx = strict_client_context(str(self.tls / "ca.crt"))
        ctx.load_cert_chain(self.tls / "prometheus.crt", self.tls / "prometheus.key")
        return http_get(f"https://127.0.0.1:{self.port}/metrics", context=ctx)

    def prometheus_tls(self) -> dict[str, str]:
        files = (
            ("ca_file", "ca.crt"),
            ("cert_file", "prometheus.crt"),
            ("key_file", "prometheus.key"),
        )
        return {key: str(self.tls / name) for key, name in files}


@pytest.fixture
def stack() -> Iterator[Stack]:
    ensure_user(EXPORTER_USER)
    base = shared_dir(None, prefix="gfxbpf-exporter-test-")
    sockdir = base / "run"
    sockdir.mkdir()
    uid, gid = ensure_user(BROKER_USER)
    os.chown(sockdir, uid, gid)
    os.chmod(sockdir, 0o755)
    socket_path = str(sockdir / "control.sock")
    workload = Workload()
    tls = make_pki(base / "tls")
    s = Stack(base, socket_path, free_port(), None, None, workload, None, tls)  # type: ignore[arg-type]
    try:
        s.start_broker()
        config = base / "exporter.toml"
        config.write_text(exporter_config(socket_path, s.port, workload.pid, tls))
        os.chmod(config, 0o644)
        s.exporter = start_exporter(config, base / "exporter.log")
        assert wait_until(lambda: _serving(s), 30), (base / "exporter.log").read_text()
        s.prom = PrometheusServer.start([f"127.0.0.1:{s.port}"], tls=s.prometheus_tls())
        yield s
    finally:
        for stop in (
            lambda: s.prom.stop(),
            lambda: stop_process(s.exporter, timeout=10),
            lambda: s.broker.stop(),
            workload.stop,
        ):
            try:
                stop()
            except Exception as e:  # noqa: BLE001 - tear everything down, report below
                print(f"teardown: {e}", file=sys.stderr)
        shutil.rmtree(base, ignore_errors=True)


def make_pki(directory: Path) -> Path:
    """A CA, the exporter's server certificate (its key readable by the exporter's
    user only) and Prometheus' client certificate (root's only)."""
    directory.mkdir(mode=0o755)
    ca = make_ca("gfxbpf test scrapers")
    uid, gid = ensure_user(EXPORTER_USER)
    for name, issued, owner in (
        ("server", ca.issue("localhost", server=True), (uid, gid)),
        ("prometheus", ca.issue("prometheus"), (0, 0)),
    ):
        (directory / f"{name}.crt").write_bytes(issued.cert_pem)
        key = directory / f"{name}.key"
        key.write_bytes(issued.key_pem)
        os.chmod(key, 0o600)
        os.chown(key, *owner)
        os.chmod(directory / f"{name}.crt", 0o644)
    (directory / "ca.crt").write_bytes(ca.cert_pem)
    os.chmod(directory / "ca.crt", 0o644)
    return directory


def start_exporter(config: Path, log: Path) -> subprocess.Popen[bytes]:
    """The unit's ExecStart through setpriv, as systemd would run it (its User=,
    no capability, no_new_privs, its Environment=), with the test's config."""
    flags = {
        "--config": str(config),
        "program": f"{VENV}/bin/gfxbpf-exporter",
        "User": EXPORTER_USER,
        "Group": EXPORTER_USER,
    }
    env = dict(BASE_ENV)
    env.update(unit_exec(EXPORTER_UNIT).environment)
    with open(log, "wb") as err:
        return subprocess.Popen(
            setpriv_argv(EXPORTER_UNIT, flags),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
            cwd="/",
            start_new_session=True,
        )


def _serving(s: Stack) -> bool:
    try:
        return "gfxbpf_up 1.0" in s.scrape()
    except OSError:
        return False


def _grows_by(s: Stack, expr: str, before: float | None, n: int) -> float | None:
    """Wait for the series to reach before + n, then check it stays there."""
    want = (before or 0.0) + n
    got = s.prom.wait_value(expr, lambda v: v is not None and v >= want)
    assert got == want, f"{expr}: {got}, expected {before} + {n}"
    return got


def test_counts_reach_prometheus_exactly_and_survive_a_broker_restart(stack: Stack) -> None:
    s, prom = stack, stack.prom
    assert prom.wait_value("gfxbpf_up", lambda v: v == 1) == 1
    assert prom.value('gfxbpf_program_available{program="vmabind"}') == 0
    assert prom.value('gfxbpf_program_available{program="ucalls"}') == 1
    n, m = 137, 9
    before = {e: prom.value(e) for e in (SYSCALLS, CALLS, LATENCY_COUNT, EXECS)}
    s.workload.run("getppid", n)
    s.workload.run("exec", m)
    for expr in (SYSCALLS, CALLS, LATENCY_COUNT):
        _grows_by(s, expr, before[expr], n)
    execs = _grows_by(s, EXECS, before[EXECS], m)
    # Exactly: three more scrapes later, nothing else was counted.
    after = prom.wait_value("count_over_time(gfxbpf_up[1h])", lambda v: False, timeout=3)
    assert after is not None
    for expr, extra in ((SYSCALLS, n), (CALLS, n), (LATENCY_COUNT, n), (EXECS, m)):
        assert prom.value(expr) == (before[expr] or 0) + extra, expr

    # The broker dies: the exporter says so, then reconnects to the restarted one.
    s.broker.proc.kill()
    s.broker.stop()
    assert prom.wait_value("gfxbpf_up", lambda v: v == 0) == 0
    errors = prom.query("gfxbpf_last_error_info")
    assert errors and "lost the broker session" in errors[0]["metric"]["error"], errors
    assert "Traceback" not in s.scrape()
    s.start_broker()
    assert prom.wait_value("gfxbpf_up", lambda v: v == 1, timeout=90) == 1
    assert prom.value("gfxbpf_reconnects_total") == 1
    # New kernel instances count from 0 (a counter reset to Prometheus); events are
    # counted by the exporter and carry on from where they were.
    s.workload.run("getppid", 11)
    s.workload.run("exec", 3)
    _grows_by(s, SYSCALLS, 0, 11)
    _grows_by(s, CALLS, 0, 11)
    _grows_by(s, EXECS, execs, 3)
    assert prom.value(f"resets({SYSCALLS}[1h])") == 1


def test_a_scrape_passes_promtool_and_the_exporter_has_no_privilege(stack: Stack) -> None:
    stack.workload.run("getppid", 5)
    text = stack.scrape()
    assert "gfxbpf_ucalls_latency_seconds_bucket" in text
    r = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout + r.stderr
    status = Path(f"/proc/{stack.exporter.pid}/status").read_text()
    # setpriv execs the exporter: the same pid.
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    uid = ensure_user(EXPORTER_USER)[0]
    assert fields["Uid"].split() == [str(uid)] * 4
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[cap], 16) == 0, (cap, fields[cap])
    assert fields["NoNewPrivs"].strip() == "1"


STRANGER = """
import ssl, sys, urllib.request
port = sys.argv[1]
insecure = ssl.create_default_context()
insecure.check_hostname = False
insecure.verify_mode = ssl.CERT_NONE  # trusts anything: only the client certificate is missing
for url, ctx in ((f"https://127.0.0.1:{port}/metrics", insecure),
                 (f"http://127.0.0.1:{port}/metrics", None)):
    try:
        body = urllib.request.urlopen(url, context=ctx, timeout=5).read().decode()
        print("READ", url, body[:200])
    except Exception as e:
        print("refused", url, type(e).__name__, e)
"""


def test_another_local_user_cannot_read_the_metrics(stack: Stack) -> None:
    r = run_as(MALLORY, [VENV_PYTHON, "-c", STRANGER, str(stack.port)])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all(ln.startswith("refused ") for ln in lines), r.stdout
    assert "gfxbpf_" not in r.stdout
    # The exporter's key is its own, and the server still serves Prometheus.
    assert run_as(MALLORY, ["cat", str(stack.tls / "server.key")]).returncode != 0
    assert "gfxbpf_up 1.0" in stack.scrape()


def _metric(text: str, name: str) -> float:
    values = [float(ln.rpartition(" ")[2]) for ln in text.splitlines() if ln.startswith(name + " ")]
    return values[0] if values else 0.0


def test_over_grpc_the_counts_are_exact_too() -> None:
    """via = "grpc": maps read with ReadMap, events through StreamEvents, leases
    renewed by each scrape's Stats call."""
    ensure_user(EXPORTER_USER)
    policy_text = policy_for(
        {p: {"users": [EXPORTER_USER], "scope": "self"} for p in ("syscount", "execsnoop")}
    )
    workload = Workload()
    port = free_port()
    exporter = None
    with BrokerProcess.start(policy_text, grpc=True) as broker:
        try:
            assert broker.grpc is not None
            config = broker.directory / "exporter-grpc.toml"
            config.write_text(
                f'listen = "127.0.0.1:{port}"\n[broker]\nsocket = "{broker.socket}"\n'
                f'grpc = "{broker.grpc}"\nvia = "grpc"\n'
                '[[program]]\nname = "syscount"\nscope = "self"\n'
                '[[program]]\nname = "execsnoop"\nscope = "self"\n'
            )
            os.chmod(config, 0o644)
            exporter = start_exporter(config, broker.directory / "exporter-grpc.log")
            scrape = functools.partial(get_or_empty, f"http://127.0.0.1:{port}/metrics")

            assert wait_until(lambda: "gfxbpf_up 1.0" in scrape(), 30), broker.stderr()
            before = scrape()
            workload.run("getppid", 64)
            workload.run("exec", 5)
            after = scrape()
            assert _metric(after, SYSCALLS) - _metric(before, SYSCALLS) == 64
            assert wait_until(lambda: _metric(scrape(), EXECS) - _metric(before, EXECS) == 5, 10)
            audit = [r for r in broker.audit_records() if r.get("op") == "read_map"]
            assert audit, "maps were not read through the broker"
            once = run_as(
                EXPORTER_USER, [f"{VENV}/bin/gfxbpf-exporter", "--config", str(config), "--once"]
            )
            assert once.returncode == 0 and "gfxbpf_up 1.0" in once.stdout, once.stderr
            assert stop_process(exporter, timeout=10) == 0  # SIGTERM, as systemctl stop
        finally:
            if exporter is not None:
                stop_process(exporter, timeout=10)
            workload.stop()


# long: one remote scenario: certificates, a TCP listener, the exporter's config, counts.
def test_a_remote_broker_over_grpc_with_mtls() -> None:
    """[broker] grpc = "host:port" with tls_*: no Unix socket at all; the broker maps
    the exporter's certificate to the exporter's user ([[tls_client]])."""
    uid, gid = ensure_user(EXPORTER_USER)
    broker_uid, broker_gid = ensure_user(BROKER_USER)
    base = shared_dir(None, prefix="gfxbpf-exporter-mtls-")
    ca = make_ca("gfxbpf test broker CA")
    server = ca.issue("localhost", server=True)
    client = ca.issue("gpu-host-exporter")
    for name, data, owner in (
        ("server.crt", server.cert_pem, (broker_uid, broker_gid)),
        ("server.key", server.key_pem, (broker_uid, broker_gid)),
        ("ca.crt", ca.cert_pem, (0, 0)),
        ("exporter.crt", client.cert_pem, (uid, gid)),
        ("exporter.key", client.key_pem, (uid, gid)),
    ):
        (base / name).write_bytes(data)
        os.chown(base / name, *owner)
        os.chmod(base / name, 0o644 if name.endswith(".crt") else 0o600)
    grpc_port, port = free_port(), free_port()
    extra = f'[[tls_client]]\nsubject_cn = "gpu-host-exporter"\nuser = "{EXPORTER_USER}"\n'
    text = policy_for({"syscount": {"users": [EXPORTER_USER], "scope": "self"}}, extra=extra)
    tls_flags = {
        "--grpc": f"127.0.0.1:{grpc_port}",
        "--tls-cert": str(base / "server.crt"),
        "--tls-key": str(base / "server.key"),
        "--tls-client-ca": str(base / "ca.crt"),
    }
    workload = Workload()
    exporter = None
    broker = BrokerProcess.start(text, base, grpc=False, overrides=tls_flags)
    try:
        config = base / "exporter-remote.toml"
        config.write_text(
            f'listen = "127.0.0.1:{port}"\n[broker]\nsocket = "{base / "no-such.sock"}"\n'
            f'grpc = "127.0.0.1:{grpc_port}"\nvia = "grpc"\ntls_ca = "{base / "ca.crt"}"\n'
            f'tls_cert = "{base / "exporter.crt"}"\ntls_key = "{base / "exporter.key"}"\n'
            '[[program]]\nname = "syscount"\nscope = "self"\n'
        )
        os.chmod(config, 0o644)
        exporter = start_exporter(config, base / "exporter-remote.log")
        scrape = functools.partial(get_or_empty, f"http://127.0.0.1:{port}/metrics")

        up = wait_until(lambda: "gfxbpf_up 1.0" in scrape(), 30)
        assert up, (base / "exporter-remote.log").read_text() + scrape()
        before = scrape()
        workload.run("getppid", 42)
        assert _metric(scrape(), SYSCALLS) - _metric(before, SYSCALLS) == 42
        hellos = [r for r in broker.audit_records() if r.get("op") == "hello"]
        assert hellos and all(r["uid"] == uid for r in hellos)
    finally:
        if exporter is not None:
            stop_process(exporter, timeout=10)
        workload.stop()
        broker.stop()
        shutil.rmtree(base, ignore_errors=True)
