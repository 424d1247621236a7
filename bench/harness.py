"""The bench's stage: users, tracefs, the broker, the workload and the peers.

Everything here runs as root in bench/run's process; what a user would run
(gfxclient, the client library) runs as the unprivileged bench user, and the
broker runs from deploy/gfxbpf.service's ExecStart as the service user with
only CAP_BPF and CAP_PERFMON, as in a deployment.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from bench.procs import stop as stop_process

REPO = Path(__file__).resolve().parent.parent
SERVICE_USER = "gfxbpf"
BENCH_USER = "gfxbench"
RUN_DIR = Path("/run/gfxbpf-bench")
TRACEFS = "/sys/kernel/tracing"
BPF_STATS = Path("/proc/sys/kernel/bpf_stats_enabled")

# Programs the bench user may attach, system-wide like the bpftrace peers.
# fence, drmsched, vmabind: for the exporter's row (7), which attaches the whole
# catalog; on a host without their tracepoints they are reported unattached.
# profile: the profile rows (bench/profile_bench.py).
POLICY_PROGRAMS = (
    "syscount", "execsnoop", "clonecount", "fence", "drmsched", "vmabind", "profile",
)  # fmt: skip
# A measuring harness, not a security test: the flood bounds, the audit rate
# and the map budget must not shape the figures (attach loops create far more
# than a user's default map budget allows).
POLICY_LIMITS = """
[limits]
sessions_per_user = 256
sessions_total = 1024
attachments_per_user = 512
tokens_per_user = 64
grpc_calls_per_user = 1024
audit_lines_per_second = 1000000
map_bytes_per_user = 2147483647
"""


class BenchError(RuntimeError):
    """Something the bench needs is missing or failed; the message says what."""


def log(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def stop_tool(proc: subprocess.Popen[str], timeout: float = 120) -> None:
    """A tracing tool run for a measurement: SIGINT, then read what it prints
    at exit (its maps: a full pipe would block it), killed if it hangs."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def workload_timing(text: str) -> dict[str, float]:
    """The JSON line a bench workload prints when it ends ({"elapsed": s, ...})."""
    for line in text.splitlines():
        if line.startswith('{"elapsed"'):
            return json.loads(line)
    raise BenchError(f"the workload printed no timing: {text[-500:]!r}")


def sh(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run a setup command; its stderr in the error if it fails."""
    r = subprocess.run(argv, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise BenchError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def ensure_user(name: str, system: bool) -> pwd.struct_passwd:
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(name)
    flags = ["--system", "--user-group", "--no-create-home"] if system else ["--user-group"]
    sh(["useradd", *flags, "--shell", "/usr/sbin/nologin", name])
    return pwd.getpwnam(name)


def mount_tracefs() -> None:
    """tracefs readable by the service group only, as deploy/ sets it up."""
    # The gid as a number: util-linux 2.41 does not resolve a remount's names.
    opts = f"gid={grp.getgrnam(SERVICE_USER).gr_gid},mode=0750"
    if os.path.ismount(TRACEFS):
        sh(["mount", "-o", f"remount,{opts}", TRACEFS])
    else:
        sh(["mount", "-t", "tracefs", "-o", f"nosuid,nodev,noexec,{opts}", "nodev", TRACEFS])


@contextlib.contextmanager
def bpftool_pins() -> Iterator[Path]:
    """A path for `bpftool prog loadall` to pin in (it creates it), on a bpffs
    of the bench's own (mode 0700), unmounted after, which drops the pins:
    the host's /sys/fs/bpf may not be mounted (no systemd), and a plain mount
    there would be one every user may write."""
    where = Path(tempfile.mkdtemp(prefix="gfxbench-bpffs-"))
    try:
        sh(["mount", "-t", "bpf", "-o", "mode=0700", "bpf", str(where)])
        try:
            yield where / "pins"
        finally:
            subprocess.run(["umount", str(where)], capture_output=True, check=False)
    finally:
        where.rmdir()


@dataclass
class Stage:
    venv: Path
    work: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gfxbpf-bench-")))
    broker: subprocess.Popen[bytes] | None = None
    broker_log: Path | None = None
    bench_uid: int = -1
    bench_gid: int = -1

    # --- setting up ---

    def prepare(self) -> None:
        # One bench at a time: two would share RUN_DIR and disturb each other.
        self._lock = open("/run/gfxbpf-bench.lock", "w")  # noqa: SIM115 (held for the run)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BenchError("another bench/run is running on this machine") from None
        os.chmod(self.work, 0o755)  # the bench user runs files from here
        ensure_user(SERVICE_USER, system=True)
        pw = ensure_user(BENCH_USER, system=False)
        self.bench_uid, self.bench_gid = pw.pw_uid, pw.pw_gid
        # A home the bench user can write, as a user's is: gfxclient keeps its
        # symbol and unwind-table caches there (~/.cache/gfxbpf).
        self.home.mkdir(exist_ok=True)
        os.chown(self.home, self.bench_uid, self.bench_gid)
        mount_tracefs()
        self._build()
        self._write_policy()
        self.start_broker()

    def _build(self) -> None:
        gcc = shutil.which("gcc") or "gcc"
        sh([gcc, "-O2", "-Wall", "-o", str(self.workload_bin), str(REPO / "bench/workload.c")])
        shutil.copy(REPO / "bench/clientside.py", self.work / "clientside.py")
        for p in self.work.iterdir():
            p.chmod(0o755)

    @property
    def home(self) -> Path:
        return self.work / "home"

    @property
    def workload_bin(self) -> Path:
        return self.work / "workload"

    @property
    def bench_object(self) -> Path:
        # Committed beside its source (tools/build_bpf.py); loaded by root only.
        return REPO / "bench/bench.bpf.o"

    def _write_policy(self) -> None:
        admin = str(self.venv / "bin/gfxbpf-admin")
        # Every catalog program that takes no parameter, too: the broker-memory
        # rows (bench/broker_memory.py) attach each once.
        from gfxbpf.catalog.entries import load_catalog

        extra = [
            p.name
            for p in load_catalog()
            if "system" in p.scopes and not any(q.required for q in p.parameters)
        ]
        entries = [
            sh([admin, "approve", name, "--users", BENCH_USER, "--scope", "system"]).stdout
            for name in dict.fromkeys([*POLICY_PROGRAMS, *extra])
        ]
        # cuda (bench/cuda_cost.py): the bench user's own processes, on the stand-in.
        libs = str(self.work / "cuda" / "*" / "libcuda.so.1")
        cuda = [admin, "approve", "cuda", "--users", BENCH_USER, "--scope", "self"]
        entries.append(sh([*cuda, "--libraries", libs]).stdout)
        # stackcopy (bench/python_profile.py): stack copies are scope self only.
        # The frame-pointer rows (profile_bench.py) ask for --scope system.
        copies = [admin, "approve", "stackcopy", "--users", BENCH_USER, "--scope", "self"]
        entries.append(sh(copies).stdout)
        # offcpu (bench/offcpu.py): copies of the bench user's own stacks, scope self only.
        entries.append(sh([admin, "approve", "offcpu", "--users", BENCH_USER]).stdout)
        # locks (bench/locks.py): the same, at futex calls.
        entries.append(sh([admin, "approve", "locks", "--users", BENCH_USER]).stdout)
        # ustackcopy (bench/attach_latency.py): --stacks-at libc's getpid.
        ucopy = [admin, "approve", "ustackcopy", "--users", BENCH_USER]
        entries.append(sh([*ucopy, "--libraries", "/usr/lib/x86_64-linux-gnu/libc.so.6"]).stdout)
        # memstacks (bench/memory_cost.py): --memory on libc.
        mem = [admin, "approve", "memstacks", "--users", BENCH_USER]
        entries.append(sh([*mem, "--libraries", "/usr/lib/x86_64-linux-gnu/libc.so.6"]).stdout)
        path = self.work / "policy.toml"
        path.write_text("".join(entries) + POLICY_LIMITS)
        path.chmod(0o644)
        sh([str(self.venv / "bin/gfxbpf-broker"), "--policy", str(path), "--check-policy"])

    # --- the broker ---

    @property
    def socket_path(self) -> str:
        return str(RUN_DIR / "control.sock")

    @property
    def grpc_address(self) -> str:
        return f"unix:{RUN_DIR / 'grpc.sock'}"

    def start_broker(self) -> None:
        svc = pwd.getpwnam(SERVICE_USER)
        RUN_DIR.mkdir(mode=0o755, exist_ok=True)
        os.chown(RUN_DIR, svc.pw_uid, svc.pw_gid)
        for stale in RUN_DIR.iterdir():
            stale.unlink()
        argv = sh(
            [str(self.venv / "bin/python"), str(REPO / "tools/unit_exec.py")]
            + [str(REPO / "deploy/gfxbpf.service"), "--print-argv"]
            + [f"--policy={self.work / 'policy.toml'}", f"--socket={self.socket_path}"]
            + [f"--grpc={self.grpc_address}", f"program={self.venv / 'bin/gfxbpf-broker'}"]
        ).stdout.splitlines()
        self.broker_log = self.work / "broker.log"
        with open(self.broker_log, "wb") as err:
            self.broker = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 30
        while not (RUN_DIR / "grpc.sock").exists():
            if self.broker.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"the broker did not start:\n{self.broker_log.read_text()}")
            time.sleep(0.05)
        while not os.path.exists(self.socket_path):
            time.sleep(0.05)

    @property
    def broker_pid(self) -> int:
        assert self.broker is not None
        return self.broker.pid

    def audit(self) -> list[dict[str, Any]]:
        """The broker's audit log (JSON lines on its stderr) so far."""
        assert self.broker_log is not None
        out = []
        for line in self.broker_log.read_text().splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def close(self, keep: bool = False) -> None:
        """Stop the broker; remove the work directory unless keep (to debug)."""
        if self.broker is not None:
            stop_process(self.broker, signal.SIGTERM, 30)
        if keep:
            log(f"kept {self.work} (outputs, broker.log)")
        else:
            shutil.rmtree(self.work, ignore_errors=True)

    # --- the bench user's processes ---

    def client_env(self) -> dict[str, str]:
        return {
            "PATH": f"{self.venv}/bin:/usr/bin:/bin",
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            "GFXBPF_SOCKET": self.socket_path,
            "GFXBPF_GRPC": self.grpc_address,
        }

    def setpriv(self, argv: list[str]) -> list[str]:
        """argv run as the bench user by a tool that runs as root and starts it
        (perf record, py-spy): through setpriv, without root's groups."""
        ids = [f"--reuid={self.bench_uid}", f"--regid={self.bench_gid}", "--clear-groups"]
        return ["setpriv", *ids, "--", *argv]

    def as_bench_user(self, argv: list[str], **kw: Any) -> subprocess.Popen[str]:
        return subprocess.Popen(
            argv,
            user=self.bench_uid,
            group=self.bench_gid,
            extra_groups=[],
            env=self.client_env(),
            cwd=self.work,
            text=True,
            **kw,
        )

    def gfxclient(self, *args: str, **kw: Any) -> subprocess.Popen[str]:
        """gfxclient from the deployment's venv, as the bench user."""
        return self.as_bench_user([str(self.venv / "bin/gfxclient"), *args], **kw)

    def timed_gfxclient(self, *args: str, timeout: float = 120) -> tuple[float, str]:
        """(wall seconds from start to exit, stdout) of a whole gfxclient command."""
        t0 = time.perf_counter()
        p = self.gfxclient(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = p.communicate(timeout=timeout)
        dt = time.perf_counter() - t0
        if p.returncode != 0:
            raise BenchError(f"gfxclient {' '.join(args)} failed ({p.returncode}): {err.strip()}")
        return dt, out

    def clientside(self, *args: str, **kw: Any) -> subprocess.Popen[str]:
        argv = [str(self.venv / "bin/python"), str(self.work / "clientside.py"), *args]
        return self.as_bench_user(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, **kw)

    def clientside_result(self, *args: str, timeout: float = 600) -> dict[str, Any]:
        p = self.clientside(*args)
        out, _ = p.communicate("", timeout=timeout)
        if p.returncode != 0:
            raise BenchError(f"clientside {' '.join(args)} failed ({p.returncode})")
        return json.loads(out.splitlines()[-1])

    @contextlib.contextmanager
    def held(self, program: str, sessions: int = 1, drain: bool = False) -> Iterator[dict]:
        """The bench user keeps `sessions` sessions attached to program."""
        args = ["hold", program, "--sessions", str(sessions)] + (["--drain"] if drain else [])
        p = self.clientside(*args)
        try:
            ready = read_json_line(p.stdout, p, f"hold {program}")
            yield ready
            assert p.stdin is not None
            p.stdin.write("\n")
            p.stdin.flush()
            ready.update(read_json_line(p.stdout, p, f"hold {program}"))
        finally:
            with contextlib.suppress(Exception):
                p.communicate(timeout=60)

    def workload(self, kind: str, n: int) -> dict[str, Any]:
        """Run the workload as the bench user; its own timing."""
        p = self.as_bench_user([str(self.workload_bin), kind, str(n)], stdout=subprocess.PIPE)
        out, _ = p.communicate(timeout=900)
        if p.returncode != 0:
            raise BenchError(f"workload {kind} {n} failed ({p.returncode})")
        return json.loads(out)

    def gated_workload(self, kind: str, n: int) -> subprocess.Popen[str]:
        """The workload, started but waiting for go(): its pid can be traced first."""
        return self.as_bench_user(
            [str(self.workload_bin), "--gate", kind, str(n)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )


def go(workload: subprocess.Popen[str], timeout: float = 900) -> dict[str, Any]:
    out, _ = workload.communicate("g", timeout=timeout)
    if workload.returncode != 0:
        raise BenchError(f"workload failed ({workload.returncode})")
    return json.loads(out)


def read_json_line(stream: IO[str] | None, proc: subprocess.Popen[str], what: str) -> dict:
    assert stream is not None
    line = stream.readline()
    if not line:
        proc.wait(30)
        raise BenchError(f"{what} ended without a result (exit {proc.returncode})")
    return json.loads(line)


# --- bpftrace, the peer ---


class Bpftrace:
    """A bpftrace process running a script, stopped with SIGINT like Ctrl-C."""

    def __init__(self, script: str, output: Path, *args: str) -> None:
        self.output = output
        self._out = open(output, "wb")
        self.proc = subprocess.Popen(
            ["bpftrace", "-e", script, *args],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def wait_attached(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while b"Attaching" not in self.output.read_bytes()[:4096]:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"bpftrace did not attach: {self.output.read_text()[-2000:]}")
            time.sleep(0.02)
        # "Attaching N probes..." is printed before the probes attach.
        while not prog_stats(self.proc.pid):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"bpftrace did not attach: {self.error()}")
            time.sleep(0.02)
        time.sleep(0.2)

    def error(self) -> str:
        """bpftrace's error, without the RLIMIT_MEMLOCK warning every run prints."""
        lines = self.output.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if "ERROR" in line and "RLIMIT_MEMLOCK" not in line:
                # the failing call and its errno text come on the line before
                before = lines[i - 1] if i and lines[i - 1].startswith(("ioctl", "bpf")) else ""
                return f"{line} ({before})" if before else line
        return "(no message)"

    def stop(self) -> None:
        stop_process(self.proc, signal.SIGINT, 120)
        self._out.close()


@dataclass
class Fleet:
    """bpftrace processes started together: those attached, and why others failed."""

    attached: list[Bpftrace]
    failed: list[str]


@contextlib.contextmanager
def bpftraces(script: str, n: int, directory: Path, *args: str) -> Iterator[Fleet]:
    """n bpftrace processes running script. The kernel allows at most 64
    programs per tracepoint (BPF_TRACE_MAX_PROGS): the rest fail to attach
    with E2BIG, and are reported rather than raised."""
    procs: list[Bpftrace] = []
    fleet = Fleet([], [])
    try:
        for i in range(n):
            procs.append(Bpftrace(script, directory / f"bpftrace-{i}.out", *args))
        for p in procs:
            try:
                p.wait_attached()
                fleet.attached.append(p)
            except BenchError:
                fleet.failed.append(p.error())
        if not fleet.attached:
            raise BenchError(f"no bpftrace attached: {fleet.failed[0]}")
        yield fleet
    finally:
        for p in procs:
            p.stop()


# --- kernel figures ---


def prog_stats(pid: int) -> dict[int, tuple[int, int]]:
    """{prog_id: (run_cnt, run_time_ns)} of every BPF program fd pid holds."""
    out: dict[int, tuple[int, int]] = {}
    fd_dir = f"/proc/{pid}/fd"
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for fd in os.listdir(fd_dir):
            with contextlib.suppress(OSError):
                if os.readlink(f"{fd_dir}/{fd}") != "anon_inode:bpf-prog":
                    continue
                info = dict(
                    line.split(":", 1) for line in open(f"/proc/{pid}/fdinfo/{fd}") if ":" in line
                )
                pid_id = int(info["prog_id"])
                out[pid_id] = (int(info.get("run_cnt", 0)), int(info.get("run_time_ns", 0)))
    return out


@contextlib.contextmanager
def new_prog_stats(
    pid: int,
    since: dict[int, tuple[int, int]] | None = None,
    on_new: Callable[[int], None] | None = None,
) -> Iterator[dict[int, tuple[int, int]]]:
    """{prog_id: (run_cnt, run_time_ns)} of what each BPF program pid holds ran
    while the block runs, counted from since (default: the stats at the start;
    {}: from zero), polled every 50 ms: a tool's programs and their stats are
    gone once it detaches. A program the broker loaded earlier, parked warm and
    attached again counts too, from the start. on_new(prog_id) runs once per
    program seen running, while it is loaded. Needs bpf_stats_enabled()."""
    base = prog_stats(pid) if since is None else since
    last: dict[int, tuple[int, int]] = {}
    stop = threading.Event()

    def poll() -> None:
        while True:
            for prog, (cnt, ns) in prog_stats(pid).items():
                cnt0, ns0 = base.get(prog, (0, 0))
                if prog not in last and (prog in base and cnt == cnt0):
                    continue  # loaded before and has not run since
                if prog not in last and on_new is not None:
                    on_new(prog)
                last[prog] = (cnt - cnt0, ns - ns0)
            if stop.wait(0.05):
                return

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    try:
        yield last
    finally:
        stop.set()
        t.join()


@contextlib.contextmanager
def bpf_stats_enabled() -> Iterator[None]:
    """kernel.bpf_stats_enabled=1 for the duration (restored after)."""
    before = BPF_STATS.read_text().strip()
    BPF_STATS.write_text("1\n")
    try:
        yield
    finally:
        BPF_STATS.write_text(before + "\n")


def rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise BenchError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time pid has used."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
