"""gfxclient as a real user against a real broker (issue 4's acceptance).

The broker runs as the unit runs it (user gfxbpf, CAP_BPF + CAP_PERFMON only,
tests/kernel/brokerenv.py); gfxclient runs as gfxtest-alice with no
capabilities, through `python -m gfxbpf.client` from the shared venv, once
over the Unix socket with passed fds (--via fd) and once over gRPC.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.kernel.brokerenv import (
    ALICE,
    VENV_PYTHON,
    BrokerProcess,
    catalog_sha256,
    policy_for,
    run_as,
    setpriv_user_argv,
    shared_dir,
    uid_of,
)

VIAS = ["fd", "grpc"]
GFXCLIENT = str(Path(VENV_PYTHON).parent / "gfxclient")
GETPPID = 110  # x86-64
# A process of alice's that makes N getppid() calls each time it reads N.
SYSCALL_MAKER = (
    "import os, sys\n"
    "print('ready', flush=True)\n"
    "for line in sys.stdin:\n"
    "    for _ in range(int(line)):\n"
    "        os.getppid()\n"
    "    print('done', flush=True)\n"
)


def broker_policy(request: pytest.FixtureRequest) -> str:
    return policy_for(
        {
            "syscount": {"users": [ALICE], "scope": "self"},
            "execsnoop": {"users": [ALICE], "scope": "self"},
            "vmabind": {"users": [ALICE], "scope": "system"},
            "ucalls": {"users": [ALICE], "scope": "self", "libraries": ["/usr/bin/true"]},
        }
    )


def client_argv(broker: BrokerProcess, via: str, *args: str) -> list[str]:
    assert broker.grpc is not None
    return [
        VENV_PYTHON,
        "-m",
        "gfxbpf.client",
        "--socket",
        broker.socket,
        "--grpc",
        broker.grpc,
        "--via",
        via,
        *args,
    ]


def gfxclient(broker: BrokerProcess, via: str, *args: str, timeout: float = 60) -> Any:
    r = run_as(ALICE, client_argv(broker, via, *args), timeout=timeout)
    assert "Traceback" not in r.stderr, r.stderr
    return r


class Lines:
    """Lines of a pipe, read by a thread, so a test can wait with a timeout."""

    def __init__(self, stream: Any) -> None:
        self.q: queue.Queue[str | None] = queue.Queue()
        self.all: list[str] = []
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: Any) -> None:
        for line in stream:
            self.q.put(line)
        self.q.put(None)

    def next(self, timeout: float = 30) -> str:
        line = self.q.get(timeout=timeout)
        if line is None:
            raise EOFError("the process closed its output")
        self.all.append(line)
        return line

    def wait_for(self, text: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while True:
            line = self.next(max(0.1, deadline - time.monotonic()))
            if text in line:
                return line

    def rest(self, timeout: float = 30) -> list[str]:
        out = []
        while True:
            try:
                out.append(self.next(timeout))
            except EOFError:
                return out


def _count(obj: dict[str, Any], nr: int) -> int:
    for row in obj["maps"]["counts"]:
        if row["key"] == nr:
            return int(row["value"])
    return 0


# ------------------------------------------------------------------ list, dump, status


@pytest.mark.parametrize("via", VIAS)
def test_list_json(broker: BrokerProcess, via: str) -> None:
    r = gfxclient(broker, via, "list", "--json")
    assert r.returncode == 0, r.stderr
    programs = {p["name"]: p for p in json.loads(r.stdout)["programs"]}
    assert set(programs) == {"syscount", "execsnoop", "vmabind", "ucalls"}
    assert programs["syscount"]["available"] is True
    assert programs["syscount"]["scopes"] == ["self"]
    assert programs["vmabind"]["available"] is False
    assert "i915:i915_vma_bind does not exist" in programs["vmabind"]["unavailable_reason"]
    needs = "an Intel GPU on the i915 driver (the i915:i915_vma_bind tracepoint)"
    assert programs["vmabind"]["requires"] == needs
    assert programs["syscount"]["requires"] is None
    text = gfxclient(broker, via, "list")
    assert text.returncode == 0
    assert f"vmabind: needs {needs}: tracepoint i915:i915_vma_bind does not exist" in text.stdout


@pytest.mark.parametrize("via", VIAS)
def test_info(broker: BrokerProcess, via: str) -> None:
    r = gfxclient(broker, via, "info", "execsnoop", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["sha256"] == catalog_sha256("execsnoop") and info["scopes"] == ["self"]
    # Both builds, in catalog order: tp_btf where the kernel has BTF, else tracefs.
    assert info["attach_points"] == [
        "tp_btf/sched_process_exec",
        "tracepoint/sched/sched_process_exec",
    ]
    # What an attachment will show, as the broker's catalog describes it.
    assert [(m["name"], m["show"], m["event_type"]) for m in info["maps"]] == [
        ("events", "events", "exec_event")
    ]
    text = gfxclient(broker, via, "info", "vmabind")
    assert text.returncode == 0, text.stderr
    assert "  needs         an Intel GPU on the i915 driver" in text.stdout
    assert "unavailable: needs an Intel GPU" in text.stdout
    assert "tracepoint i915:i915_vma_bind does not exist" in text.stdout
    assert "bind_size (log2_histogram, bytes" in text.stdout


@pytest.mark.parametrize("via", VIAS)
def test_dump(broker: BrokerProcess, via: str) -> None:
    r = gfxclient(broker, via, "dump", "syscount", "--wait", "0.5", "--json")
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout)
    assert obj["program"] == "syscount" and obj["scope"] == "self"
    counts = obj["maps"]["counts"]
    assert counts["show"] == "counter" and counts["key_label"] == "syscall"
    entries = counts["entries"]
    # The client itself made syscalls as alice while it waited: BTF-decoded ints.
    assert entries and all(isinstance(e["key"], int) and e["value"] >= 1 for e in entries)
    text = gfxclient(broker, via, "dump", "syscount", "counts", "--wait", "0.3")
    assert text.returncode == 0, text.stderr
    assert "counts (counter, count, key syscall)" in text.stdout


@pytest.mark.parametrize("via", VIAS)
def test_status(broker: BrokerProcess, via: str) -> None:
    r = gfxclient(broker, via, "status", "--attach", "syscount", "--wait", "0.5", "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["broker_version"]
    assert st["kernel_release"] == os.uname().release
    assert st["caller"]["uid"] == uid_of(ALICE)
    assert st["features"]["direct_map_reads"] is True  # 6.18: unprivileged fd reads work
    assert st["via"] == via
    assert [a["program"] for a in st["attachments"]] == ["syscount"]
    progs = [p for p in st["programs"] if p["program"] == "syscount"]
    assert progs and progs[0]["function"] == "sys_enter" and progs[0]["prog_id"] > 0
    if st["stats_enabled"]:
        assert progs[0]["run_cnt"] > 0 and progs[0]["avg_ns"] > 0
    text = gfxclient(broker, via, "status")
    assert text.returncode == 0
    assert "features    direct map reads: yes" in text.stdout
    assert ALICE in text.stdout


# ------------------------------------------------------------------ watch


def _watched_syscalls(
    broker: BrokerProcess, via: str, n: int, watch_args: list[str], stop: bool = False
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """alice's `watch syscount --json` (watch_args) while her process makes n
    getppid calls after its first view; stop: then SIGINT (Ctrl-C). The first
    view and the ones after it, once the watch exited 0."""
    maker = run_as(
        ALICE,
        [VENV_PYTHON, "-c", SYSCALL_MAKER],
        background=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    watch = run_as(
        ALICE,
        client_argv(broker, via, "watch", "syscount", "--json", *watch_args),
        background=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        maker_out = Lines(maker.stdout)
        assert maker_out.next() == "ready\n"
        out = Lines(watch.stdout)
        first = json.loads(out.next())  # printed right after attaching
        maker.stdin.write(f"{n}\n")
        maker.stdin.flush()
        assert maker_out.next() == "done\n"
        if stop:
            watch.send_signal(signal.SIGINT)
        rest = [json.loads(line) for line in out.rest()]
        assert watch.wait(30) == 0, watch.stderr.read()
    finally:
        for p in (maker, watch):
            if p.poll() is None:
                p.kill()
                p.wait()
    return first, rest


@pytest.mark.parametrize("via", VIAS)
def test_watch_counts_my_syscalls(broker: BrokerProcess, via: str) -> None:
    n = 500
    baseline, rest = _watched_syscalls(broker, via, n, ["--duration", "2"])
    assert len(rest) == 2  # one object per interval: t=1 s and t=2 s
    last = rest[-1]
    assert last["program"] == "syscount" and last["scope"] == "self"
    assert _count(last, GETPPID) - _count(baseline, GETPPID) >= n
    row = next(r for r in last["maps"]["counts"] if r["key"] == GETPPID)
    assert row["label"] == "getppid"
    values = [r["value"] for r in last["maps"]["counts"]]
    assert values == sorted(values, reverse=True)


def test_watch_stopped_between_intervals_prints_what_came_since(broker: BrokerProcess) -> None:
    """Ctrl-C (SIGINT) 58 s before the next interval: the counts since the
    first view are printed at the stop, not lost, and the watch exits 0."""
    n = 300
    first, rest = _watched_syscalls(broker, "fd", n, ["--interval", "60"], stop=True)
    assert len(rest) == 1, rest
    assert _count(rest[0], GETPPID) - _count(first, GETPPID) >= n


@pytest.mark.parametrize("via", VIAS)
def test_watch_vmabind_is_unavailable_here(broker: BrokerProcess, via: str) -> None:
    r = gfxclient(broker, via, "watch", "vmabind")
    assert r.returncode == 4
    assert "tracepoint i915:i915_vma_bind does not exist on this kernel" in r.stderr
    assert "the i915 driver must be loaded" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_unknown_user_gets_a_clear_denial(broker: BrokerProcess) -> None:
    r = run_as(
        "gfxtest-mallory", client_argv(broker, "fd", "watch", "syscount", "--once"), timeout=60
    )
    assert r.returncode == 3, r.stderr
    assert "permission denied" in r.stderr
    assert "ask your administrator" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_parameters_name_the_flags_and_a_dead_pid_is_not_a_denial(
    broker: BrokerProcess,
) -> None:
    r = gfxclient(broker, "fd", "watch", "syscount", "--pid", "1", "--once")
    assert r.returncode == 1, r.stderr
    assert "program 'syscount' takes no pid" in r.stderr
    assert "`gfxclient info syscount` lists its parameters" in r.stderr
    gone = subprocess.Popen(["true"])
    gone.wait()
    # Its pid names no process now: not found (exit 1), not "permission denied".
    lib = ["--library", "/usr/bin/true", "--function", "main"]
    r = gfxclient(broker, "fd", "dump", "ucalls", "--pid", str(gone.pid), *lib)
    assert r.returncode == 1, r.stderr
    assert f"no process {gone.pid}" in r.stderr and "permission denied" not in r.stderr
    assert "Traceback" not in r.stderr


# ------------------------------------------------------------------ stream


@pytest.mark.parametrize("via", VIAS)
def test_stream_execsnoop_sees_my_execs(broker: BrokerProcess, via: str) -> None:
    d = shared_dir(None, prefix="gfxclient-exec-")
    marker = d / f"marker-{uuid.uuid4().hex[:8]}"
    shutil.copy("/bin/true", marker)
    os.chmod(marker, 0o755)
    stream = run_as(
        ALICE,
        client_argv(broker, via, "--json", "stream", "execsnoop", "--duration", "60"),
        background=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        err = Lines(stream.stderr)
        err.wait_for("streaming execsnoop")
        for _ in range(3):
            assert run_as(ALICE, [str(marker)], timeout=30).returncode == 0
        out = Lines(stream.stdout)
        seen = []
        deadline = time.monotonic() + 20
        while len(seen) < 3 and time.monotonic() < deadline:
            ev = json.loads(out.next(timeout=max(0.1, deadline - time.monotonic())))
            if ev["event"]["filename"] == str(marker):
                seen.append(ev)
        # Ctrl-C is the normal way to stop a stream: exit 0, session closed.
        stream.send_signal(signal.SIGINT)
        assert stream.wait(30) == 0
        assert "Traceback" not in "".join(err.rest())
    finally:
        if stream.poll() is None:
            stream.kill()
            stream.wait()
        shutil.rmtree(d, ignore_errors=True)
    assert len(seen) == 3
    for ev in seen:
        assert ev["program"] == "execsnoop" and ev["map"] == "events"
        assert ev["event"]["uid"] == uid_of(ALICE)
        assert ev["event"]["comm"] == marker.name[:15]


# ------------------------------------------------------------------ the terminal (tmux)


class Tmux:
    def __init__(self, width: int = 100, height: int = 30) -> None:
        self.name = f"gfxclient-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.width, self.height = width, height

    def run(self, *args: str) -> str:
        r = subprocess.run(
            ["tmux", "-L", self.name, *args], capture_output=True, text=True, timeout=30
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    def start(self, argv: list[str]) -> None:
        self.run(
            "new-session",
            "-d",
            "-s",
            "t",
            "-x",
            str(self.width),
            "-y",
            str(self.height),
            " ".join(_shell_quote(a) for a in argv),
        )

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "t")

    def flag(self, fmt: str) -> str:
        return self.run("display-message", "-p", "-t", "t", fmt).strip()

    def wait_screen(self, pred: Any, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.screen()
            if pred(text):
                return text
            time.sleep(0.1)
        raise AssertionError(f"screen never matched; last screen:\n{text}")

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.name, "kill-server"], capture_output=True, timeout=30)


def _shell_quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def _header(screen: str) -> str:
    return next((ln for ln in screen.splitlines() if ln.startswith("gfxclient watch")), "")


# long: one terminal session driven step by step (start, refresh, Ctrl-C, screen).
def test_watch_in_tmux_refreshes_and_ctrl_c_exits_cleanly(broker: BrokerProcess) -> None:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    prompt = "alice-prompt$ "
    shell = setpriv_user_argv(
        ALICE,
        [
            "env",
            "-i",
            "PATH=/usr/bin:/bin",
            "HOME=/",
            "LANG=C.UTF-8",
            "TERM=screen",
            f"PS1={prompt}",
            "bash",
            "--norc",
            "--noprofile",
            "-i",
        ],
    )
    tmux = Tmux()
    tmux.start(shell)
    try:
        tmux.wait_screen(lambda s: prompt.rstrip() in s)
        argv = client_argv(broker, "fd", "watch", "syscount")
        if os.access(GFXCLIENT, os.X_OK):  # the console script, as people run it
            argv = [GFXCLIENT, *argv[3:]]
        cmd = " ".join(_shell_quote(a) for a in argv)
        tmux.run("send-keys", "-t", "t", cmd, "Enter")
        first = tmux.wait_screen(lambda s: "SYSCALL" in s and _header(s))
        assert tmux.flag("#{alternate_on}") == "1"  # full-screen view
        assert tmux.flag("#{cursor_flag}") == "0"  # cursor hidden while drawing
        # The view refreshes: the header's clock and the counts move on.
        second = tmux.wait_screen(lambda s: _header(s) and _header(s) != _header(first), 10)
        assert "counts — Calls per syscall number" in second
        assert "RATE" in second and "/s" in second
        attachment = int(_header(second).split("attachment ")[1].split()[0])
        tmux.run("send-keys", "-t", "t", "C-c")
        after = tmux.wait_screen(lambda s: s.rstrip().endswith(prompt.rstrip()), 15)
        assert tmux.flag("#{alternate_on}") == "0"  # back on the normal screen
        assert tmux.flag("#{cursor_flag}") == "1"  # cursor shown again
        assert "Traceback" not in after
        assert "\x1b" not in after and "[?25" not in after and "[?1049" not in after
        # The last view stays on the normal screen, then the prompt.
        assert "counts — Calls per syscall number" in after
        tmux.run("send-keys", "-t", "t", "echo rc=$?", "Enter")
        tmux.wait_screen(lambda s: "rc=0" in s, 10)
        # The session closed: the broker detached the attachment.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            done = [
                r
                for r in broker.audit_records()
                if r.get("op") in ("detach", "close_session")
                and r.get("attachment_id") in (attachment, None)
                and r.get("uid") == uid_of(ALICE)
            ]
            if any(r.get("attachment_id") == attachment for r in done):
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"no detach of attachment {attachment} in the broker's audit log")
    finally:
        tmux.kill()


def test_installed_console_script(broker: BrokerProcess) -> None:
    if not os.access(GFXCLIENT, os.X_OK):
        pytest.skip(f"{GFXCLIENT} not installed (re-run tools/setup.sh)")
    argv = [GFXCLIENT, *client_argv(broker, "fd", "list", "--json")[3:]]
    r = run_as(ALICE, argv, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "syscount" in {p["name"] for p in json.loads(r.stdout)["programs"]}
    r = run_as(ALICE, [GFXCLIENT, "--help"], timeout=60)
    assert r.returncode == 0 and "exit codes:" in r.stdout


def test_alice_cannot_reach_tracefs(broker: BrokerProcess) -> None:
    # The premise of the client: it works while alice has no tracefs access at all.
    r = run_as(ALICE, ["ls", "/sys/kernel/tracing/events"], timeout=30)
    assert r.returncode != 0
    assert Path("/sys/kernel/tracing/events").exists()
