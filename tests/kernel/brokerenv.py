"""A real broker for integration tests: run as the unit runs it, clients as real users.

    from tests.kernel.brokerenv import BrokerProcess, policy_for, run_as

    text = policy_for({"syscount": {"users": ["gfxtest-alice"], "scope": ["self"]}})
    with BrokerProcess.start(text, tmp_path) as broker:
        r = run_as("gfxtest-alice", [VENV_PYTHON, "-c", "..."], env={"SOCK": broker.socket})

The broker is started from deploy/gfxbpf.service's own ExecStart line through
tools/unit_exec.setpriv_argv (User=gfxbpf, exactly CAP_BPF + CAP_PERFMON,
NoNewPrivileges, the unit's Environment= and UMask=), with only --policy,
--socket and --grpc (and, if asked, --catalog) pointed at a temporary
directory. Readiness is the broker's own sd_notify READY=1.

Users: gfxbpf (the broker), gfxtest-alice and gfxtest-bob (named by test
policies), gfxtest-mallory (named by none); created on first use as system
users without a home or a login shell. Every helper here needs root.
"""

from __future__ import annotations

import contextlib
import grp
import importlib.util
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.procs import stop as stop_process

ROOT = Path(__file__).resolve().parents[2]
RAWCLIENT = Path(__file__).with_name("rawclient.py")
SERVICE = ROOT / "deploy" / "gfxbpf.service"
SOCKET_UNIT = ROOT / "deploy" / "gfxbpf.socket"
MOUNT_DROPIN = ROOT / "deploy" / "sys-kernel-tracing.mount.d" / "gfxbpf.conf"
TRACEFS = "/sys/kernel/tracing"
# tools/setup.sh installs here (GFXBPF_VENV moves it, e.g. for a CI dry run).
DEFAULT_VENV = "/opt/gfxbpf/venv"
VENV = os.environ.get("GFXBPF_VENV", DEFAULT_VENV)
VENV_PYTHON = f"{VENV}/bin/python"
BROKER_USER = "gfxbpf"
ALICE = "gfxtest-alice"
BOB = "gfxtest-bob"
MALLORY = "gfxtest-mallory"
TEST_USERS = (ALICE, BOB, MALLORY)
BROKER_CAPS_MASK = (1 << 39) | (1 << 38)  # CAP_BPF | CAP_PERFMON
# A plain environment for processes that switched user (no root paths in it).
BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
}

_user_lock = threading.Lock()


def _unit_exec_module() -> Any:
    """tools/unit_exec.py, loaded by path (tools/ is not a package)."""
    name = "gfxbpf_tools_unit_exec"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "unit_exec.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def ensure_user(name: str) -> tuple[int, int]:
    """(uid, gid) of a system user, created (useradd --system --user-group) if missing."""
    with _user_lock:
        try:
            pw = pwd.getpwnam(name)
            return pw.pw_uid, pw.pw_gid
        except KeyError:
            pass
        r = subprocess.run(
            [
                "useradd",
                "--system",
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/",
                "--shell",
                "/usr/sbin/nologin",
                name,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        try:  # another test process may have created it at the same time
            pw = pwd.getpwnam(name)
        except KeyError:
            raise RuntimeError(f"useradd {name} failed: {r.stderr.strip()}") from None
        return pw.pw_uid, pw.pw_gid


def uid_of(name: str) -> int:
    return ensure_user(name)[0]


def ensure_tracefs_for_broker() -> None:
    """tracefs mounted the way the deploy drop-in mounts it (group gfxbpf may read).

    Only gid and mode change (root is unaffected), so this stays in place
    for other tests and concurrently running brokers.
    """
    ensure_user(BROKER_USER)
    if not os.path.exists(os.path.join(TRACEFS, "events")):
        subprocess.run(["mount", "-t", "tracefs", "nodev", TRACEFS], check=True, timeout=30)
    opts = _unit_exec_module().mount_options(MOUNT_DROPIN)
    gid = grp.getgrnam(BROKER_USER).gr_gid
    # gid= as a number: util-linux 2.41 (Debian 13) hands a remount's
    # options to the kernel unresolved, and tracefs refuses a group name.
    keep = [f"gid={gid}" if o.startswith("gid=") else o for o in opts]
    keep = [o for o in keep if o.split("=", 1)[0] in ("gid", "mode")]
    st = os.stat(TRACEFS)
    want_mode = int(dict(o.split("=", 1) for o in keep).get("mode", "0750"), 8)
    if st.st_gid == gid and (st.st_mode & 0o7777) == want_mode:
        return
    subprocess.run(
        ["mount", "-o", "remount," + ",".join(keep), TRACEFS],
        check=True,
        capture_output=True,
        timeout=30,
    )


def _world_traversable(path: Path) -> bool:
    for p in [path, *path.parents]:
        try:
            if not os.stat(p).st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


def shared_dir(tmpdir: str | os.PathLike[str] | None = None, prefix: str = "gfxbpf-test-") -> Path:
    """A directory every test user can enter and read (mode 0755, all parents traversable).

    pytest's tmp_path lives under /tmp/pytest-of-root (0700), which other
    users cannot enter; then a fresh directory under /tmp is made instead.
    """
    if tmpdir is not None:
        p = Path(tmpdir)
        p.mkdir(parents=True, exist_ok=True)
        os.chmod(p, 0o755)
        if _world_traversable(p):
            return p
    p = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(p, 0o755)
    return p


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def catalog_sha256(name: str) -> str:
    from gfxbpf.catalog.entries import load_catalog

    return load_catalog().get(name).sha256


def policy_for(
    programs: Mapping[str, Mapping[str, Any] | Sequence[Mapping[str, Any]]],
    limits: Mapping[str, int] | None = None,
    extra: str = "",
) -> str:
    """Policy TOML: one [[program]] per entry (a list gives several for one name).

    sha256 defaults to the catalog object's; give it explicitly for objects
    outside the catalog. limits becomes [limits]; extra is appended verbatim.
    """
    out: list[str] = []
    for name, spec in programs.items():
        entries = [spec] if isinstance(spec, Mapping) else list(spec)
        for entry in entries:
            fields = dict(entry)
            if "sha256" not in fields:
                fields["sha256"] = catalog_sha256(name)
            out.append("[[program]]")
            out.append(f"name = {_toml_value(name)}")
            for key, value in fields.items():
                out.append(f"{key} = {_toml_value(value)}")
            out.append("")
    if limits:
        out.append("[limits]")
        out.extend(f"{k} = {_toml_value(v)}" for k, v in limits.items())
        out.append("")
    if extra:
        out.append(extra)
    return "\n".join(out) + "\n"


def _prepare(
    tmpdir: str | os.PathLike[str] | None, policy_text: str
) -> tuple[Path, Path, Path, bool]:
    """Users, tracefs and a run directory for one broker: (base, run dir,
    policy file, whether base is ours to remove)."""
    ensure_user(BROKER_USER)
    for u in TEST_USERS:
        ensure_user(u)
    ensure_tracefs_for_broker()
    owns = tmpdir is None
    base = shared_dir(tmpdir)
    if tmpdir is not None and base != Path(tmpdir):
        owns = True
    run = Path(tempfile.mkdtemp(prefix="broker-", dir=base))
    uid, gid = ensure_user(BROKER_USER)
    os.chown(run, uid, gid)
    os.chmod(run, 0o755)
    policy_path = base / f"policy-{run.name}.toml"
    policy_path.write_text(policy_text)
    os.chmod(policy_path, 0o644)
    return base, run, policy_path, owns


def venv_program() -> dict[str, str]:
    """The unit override that starts GFXBPF_VENV's broker: the unit's ExecStart
    names the default venv, so none is needed there."""
    if VENV == DEFAULT_VENV:
        return {}
    return {"program": f"{VENV}/bin/gfxbpf-broker"}


def broker_program() -> str:
    """The gfxbpf-broker script a test's broker runs."""
    return venv_program().get("program") or _unit_exec_module().unit_exec(SERVICE).argv[0]


def _unit_argv(
    flags: dict[str, str], overrides: Mapping[str, str] | None, as_root_with_user: bool
) -> list[str]:
    """The unit's ExecStart with flags: through setpriv as User=gfxbpf with the
    unit's capabilities, or run as root with --user (the broker drops itself)."""
    ue = _unit_exec_module()
    flags.update(venv_program())
    flags.update(overrides or {})
    if as_root_with_user:
        flags["--user"] = BROKER_USER
        return list(ue.apply_overrides(ue.unit_exec(SERVICE), flags).argv)
    return list(ue.setpriv_argv(SERVICE, flags))


def _socket_activated(argv: list[str], socket_path: str, env: Mapping[str, str]) -> list[str]:
    """argv under systemd-socket-activate holding the control socket, as
    gfxbpf.socket would. It passes on no environment of its own accord:
    each variable goes by --setenv."""
    return [
        "systemd-socket-activate",
        "--seqpacket",
        "--fdname=control",
        f"--listen={socket_path}",
        *(f"--setenv={k}={v}" for k, v in env.items()),
        *argv,
    ]


class BrokerStartError(RuntimeError):
    """The broker exited or did not become ready; the message holds its stderr."""


class BrokerProcess:
    """A running gfxbpf-broker; use BrokerProcess.start(...), stop() or `with`."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        directory: Path,
        socket_path: str,
        grpc: str | None,
        policy_path: str,
        stderr_path: Path,
        owns_directory: bool,
        argv: list[str],
    ) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.directory = directory
        self.socket = socket_path
        self.grpc = grpc  # "unix:/path" or None
        self.policy_path = policy_path
        self.stderr_path = stderr_path
        self.argv = argv
        self._owns_directory = owns_directory
        self.returncode: int | None = None
        self._notify: socket.socket | None = None  # until READY=1 arrived

    # long: its docstring is a third of it; the start sequence reads best in one place.
    @classmethod
    def start(
        cls,
        policy_text: str,
        tmpdir: str | os.PathLike[str] | None = None,
        *,
        grpc: bool = True,
        catalog: str | None = None,
        overrides: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        as_root_with_user: bool = False,
        socket_activated: bool = False,
        wrapper: Sequence[str] = (),
        env_extra: Mapping[str, str] | None = None,
    ) -> BrokerProcess:
        """Write the policy, start the broker from the unit's ExecStart, wait for READY=1.

        as_root_with_user: run the unit's ExecStart directly as root with
        --user gfxbpf (the broker drops privileges itself) instead of via setpriv.
        socket_activated: as gfxbpf.socket does, systemd-socket-activate holds
        the control socket (mode from the socket unit) and starts the broker
        with it as fd 3 on the first connection; start() returns once the
        socket listens, before the broker runs (wait_ready() waits for it).
        overrides go to setpriv_argv on top of --policy/--socket/--grpc
        (e.g. {"--log-level": "debug"}). wrapper: a command (run as root) that
        execs the broker's argv given after it, e.g. to change its mounts.
        env_extra: more environment for the broker (GFXBPF_TEST_LOAD_DELAY_S).
        Raises BrokerStartError with the
        broker's stderr if it exits or is not ready within timeout seconds.
        """
        ue = _unit_exec_module()
        base, run, policy_path, owns = _prepare(tmpdir, policy_text)
        socket_path = str(run / "control.sock")
        grpc_addr = f"unix:{run / 'grpc.sock'}" if grpc else None

        flags = {"--policy": str(policy_path), "--socket": socket_path, "--grpc": grpc_addr or ""}
        if socket_activated:  # the broker must ignore --socket and take fd 3
            flags["--socket"] = str(run / "not-used.sock")
        if catalog is not None:
            flags["--catalog"] = catalog
        argv = _unit_argv(flags, overrides, as_root_with_user)
        info = ue.unit_exec(SERVICE)

        # sd_notify: the broker says READY=1 once both sockets listen.
        notify_path = str(run / "notify.sock")
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(notify_path)
        os.chmod(notify_path, 0o666)
        env = dict(BASE_ENV)
        env.update(info.environment)
        env["NOTIFY_SOCKET"] = notify_path
        env.update(env_extra or {})
        if socket_activated:
            argv = _socket_activated(argv, socket_path, env)
        argv = [*wrapper, *argv]
        stderr_path = run / "stderr.log"
        with open(stderr_path, "wb") as err:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                env=env,
                cwd="/",
                umask=info.umask if info.umask is not None else -1,
                start_new_session=True,
            )
        broker = cls(proc, base, socket_path, grpc_addr, str(policy_path), stderr_path, owns, argv)
        broker._notify = notify
        try:
            if socket_activated:
                broker._wait_socket(timeout)
            else:
                broker.wait_ready(timeout)
        except BaseException:
            broker.stop()
            raise
        return broker

    def _wait_socket(self, timeout: float) -> None:
        """Wait for systemd-socket-activate's socket; give it the socket unit's mode."""
        mode = int(_unit_exec_module().read_unit(SOCKET_UNIT)["Socket"]["SocketMode"][-1], 8)
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise BrokerStartError(f"no socket at {self.socket}:\n{self.stderr()}")
            time.sleep(0.02)
        os.chmod(self.socket, mode)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait for the broker's READY=1 on the notify socket (once; then closed)."""
        notify = self._notify
        if notify is None:
            return
        try:
            self._wait_ready(notify, timeout)
        finally:
            self._close_notify()

    def _close_notify(self) -> None:
        notify, self._notify = self._notify, None
        if notify is not None:
            path = notify.getsockname()
            notify.close()
            with contextlib.suppress(OSError):
                os.unlink(path)

    def _wait_ready(self, notify: socket.socket, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        notify.settimeout(0.1)
        while time.monotonic() < deadline:
            try:
                msg = notify.recv(4096).decode("utf-8", "replace")
            except TimeoutError:
                msg = ""
            if "READY=1" in msg.split("\n"):
                if self.grpc is None or os.path.exists(self.grpc[len("unix:") :]):
                    return
            if self.proc.poll() is not None:
                raise BrokerStartError(
                    f"broker exited with {self.proc.returncode} before READY=1:\n{self.stderr()}"
                )
        raise BrokerStartError(f"broker not ready after {timeout} s:\n{self.stderr()}")

    def install(self, path: str | os.PathLike[str]) -> Path:
        """A copy of path in the broker's directory, readable by the test users
        (who cannot read the checkout under /root, say); copied once."""
        src = Path(path)
        dest = self.directory / src.name
        if not dest.exists():
            shutil.copy(src, dest)
            os.chmod(dest, 0o644)
        return dest

    # ------------------------------------------------------------ inspection

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def stderr_lines(self) -> list[str]:
        """Every line the broker wrote to stderr so far (audit lines are JSON)."""
        return self.stderr().splitlines()

    def audit_records(self) -> list[dict[str, Any]]:
        """The audit log: the JSON object lines of stderr, parsed."""
        out = []
        for line in self.stderr_lines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def fd_count(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def status(self) -> dict[str, str]:
        """/proc/<pid>/status as key -> value."""
        with open(f"/proc/{self.pid}/status") as f:
            return {
                k.strip(): v.strip() for k, _, v in (line.partition(":") for line in f) if k.strip()
            }

    def cmdline(self) -> list[str]:
        """/proc/<pid>/cmdline as argv (what this pid runs now, after any exec)."""
        with open(f"/proc/{self.pid}/cmdline", "rb") as f:
            return [a.decode() for a in f.read().split(b"\0")[:-1]]

    def thread_count(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/task"))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def reload(self, policy_text: str | None = None, timeout: float = 10.0) -> dict[str, Any]:
        """Replace the policy file (when policy_text is given), SIGHUP the broker
        (as ExecReload= does), and return its "reload" audit record."""
        before = sum(1 for r in self.audit_records() if r.get("op") == "reload")
        if policy_text is not None:
            path = Path(self.policy_path)
            path.write_text(policy_text)
            os.chmod(path, 0o644)
        self.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = [r for r in self.audit_records() if r.get("op") == "reload"]
            if len(done) > before:
                return done[before]
            if not self.alive():
                raise BrokerStartError(f"broker exited on SIGHUP:\n{self.stderr()}")
            time.sleep(0.02)
        raise TimeoutError(f"no reload record after {timeout} s:\n{self.stderr()}")

    # ------------------------------------------------------------ lifetime

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, wait (SIGKILL after timeout); return the exit status."""
        self.returncode = stop_process(self.proc, signal.SIGTERM, timeout)
        self._close_notify()
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)
        return self.returncode

    def __enter__(self) -> BrokerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def unit_exec_argv(exec_start: str) -> list[str]:
    """setpriv line that runs exec_start as the service unit runs the broker:
    User=gfxbpf with exactly its capabilities (CAP_BPF + CAP_PERFMON)."""
    ensure_user(BROKER_USER)
    return list(_unit_exec_module().setpriv_argv(SERVICE, {"ExecStart": exec_start}))


def setpriv_user_argv(user: str, argv: Sequence[str]) -> list[str]:
    """setpriv command that runs argv as user (its groups, no capabilities)."""
    uid, gid = ensure_user(user)
    return [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={gid}",
        "--init-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
        *argv,
    ]


def run_as(
    user: str,
    argv: Sequence[str],
    *,
    background: bool = False,
    env: Mapping[str, str] | None = None,
    **popen_kwargs: Any,
) -> Any:
    """Run argv as user (no capabilities); the environment is BASE_ENV plus env.

    background=False: subprocess.run (defaults: capture_output, text, timeout
    120, cwd "/") -> CompletedProcess. background=True: a Popen.
    """
    full_env = dict(BASE_ENV)
    full_env.update(env or {})
    cmd = setpriv_user_argv(user, argv)
    popen_kwargs.setdefault("cwd", "/")
    if background:
        return subprocess.Popen(cmd, env=full_env, **popen_kwargs)
    popen_kwargs.setdefault("capture_output", True)
    popen_kwargs.setdefault("text", True)
    popen_kwargs.setdefault("timeout", 120)
    return subprocess.run(cmd, env=full_env, **popen_kwargs)


def bpftool_prog_exists(prog_id: int) -> bool:
    """Whether the kernel still has program prog_id (bpftool prog show id N)."""
    r = subprocess.run(
        ["bpftool", "prog", "show", "id", str(prog_id)], capture_output=True, timeout=30
    )
    return r.returncode == 0


def wait_until(pred: Any, timeout: float, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


class Client:
    """tests/kernel/rawclient.py run as a test user: one session, JSON commands."""

    def __init__(self, broker: BrokerProcess, user: str) -> None:
        self.user = user
        self.broker = broker
        self.opened = False  # the broker answered a request: a session exists
        self.proc: subprocess.Popen[str] = run_as(
            user,
            [VENV_PYTHON, str(broker.install(RAWCLIENT)), broker.socket],
            background=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        ready = self._line()
        assert ready.get("ready"), ready
        self.pid = ready["pid"]

    def _line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"client {self.user} died: {err}")
        return json.loads(line)

    def __call__(self, cmd: str, **kw: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **kw}) + "\n")
        self.proc.stdin.flush()
        r = self._line()
        self.opened |= r["ok"]
        return r

    def ok(self, cmd: str, **kw: Any) -> dict[str, Any]:
        r = self(cmd, **kw)
        assert r["ok"], r
        return r

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self("quit")
            except (OSError, ValueError, AssertionError):
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()
        if self.opened:
            # Wait until the broker closed the session, so the next test
            # starts from a broker that holds nothing for this client.
            assert wait_until(lambda: self.session_closed(), 5), f"session of {self.pid} open"

    def session_closed(self) -> bool:
        return any(
            r["op"] == "close_session" and r["pid"] == self.pid for r in self.broker.audit_records()
        )
