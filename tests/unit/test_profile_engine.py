"""The profiling engine as a library (issue 36 item 1): take_profile() takes a
request and a broker and returns named stacks, without the command. A fake
broker stands in for the kernel half (tests/kernel/test_profile.py runs the
real one): it refuses stack copies, as a policy without stackcopy does, and
answers the frame-pointer program's maps."""

from __future__ import annotations

import os
import pwd
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gfxbpf.client.errors import BrokerError
from gfxbpf.client.profiles import read as profile_read
from gfxbpf.client.profiles.engine.child import HELD_COMM, Child
from gfxbpf.client.profiles.engine.naming import FRAME_POINTER_ADVICE as FP
from gfxbpf.client.profiles.engine.request import ProfileRequest
from gfxbpf.client.profiles.engine.take import Taken, take_profile
from gfxbpf.proto import gfxbpf_pb2 as pb


class _Map:
    """A map read through the broker (no fd): whole tables, no lookups."""

    def __init__(self, items: list[tuple[bytes, bytes]], value_size: int = 8) -> None:
        self.items = items
        self.fd = None
        self.desc = SimpleNamespace(value_size=value_size)

    def raw_items(self) -> list[tuple[bytes, bytes]]:
        return list(self.items)

    def lookup_many(self, keys: Any) -> None:
        return None


class _Attachment:
    def __init__(self, program: str, maps: dict[str, _Map]) -> None:
        self.program = program
        self.maps = maps
        self.detached = False

    def map(self, name: str) -> _Map:
        return self.maps[name]

    def detach(self) -> None:
        self.detached = True


class _Broker:
    """Grants `profile` only (or nothing); records what was asked. Its counts
    hold one row per (pid, comm, weight) of rows; pid None: the attach's pid."""

    def __init__(
        self,
        rows: list[tuple[int | None, bytes, int]],
        grant: bool = True,
        rule: str = "p:1",
        code: int | None = None,
    ) -> None:
        self.code = code if code is not None else _code_address()
        self.asked: list[tuple[str, dict[str, Any]]] = []
        self.rows = rows
        self.grant = grant
        self.rule = rule
        self.closed = False
        self.attachment: _Attachment | None = None

    def attach(self, name: str, **kw: Any) -> _Attachment:
        self.asked.append((name, kw))
        if name != "profile" or not self.grant:
            why = f"you may not run program {name!r}: no entry names it"
            raise BrokerError(pb.ERROR_PERMISSION_DENIED, why, self.rule)
        stack = struct.pack("<127Q", self.code, *([0] * 126))
        counts = [
            (
                profile_read.SAMPLE_KEY.pack(kw["pid"] if pid is None else pid, 7, 0, comm),
                struct.pack("<Q", weight),
            )
            for pid, comm, weight in self.rows
        ]
        self.attachment = _Attachment(
            name,
            {
                "counts": _Map(counts),
                "stacks": _Map([(struct.pack("<I", 7), stack)], value_size=127 * 8),
                "lost": _Map([(b"\0" * 4, struct.pack("<Q", 3))]),
            },
        )
        return self.attachment

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> _Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _code_address(pid: int | str = "self") -> int:
    """An address in a process's first executable mapping."""
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            span, perms = line.split()[:2]
            if "x" in perms:
                return int(span.split("-")[0], 16) + 0x10
    raise AssertionError("no executable mapping")


class _Never:
    stopped = False

    def wait(self, timeout: float) -> bool:
        time.sleep(timeout)
        return False


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    p = subprocess.Popen(["sleep", "30"])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # exec'd: its own maps, not python's
        with open(f"/proc/{p.pid}/comm") as f:
            if f.read().strip() == "sleep":
                break
        time.sleep(0.01)
    yield p
    p.kill()
    p.wait()


def _taken(broker: _Broker, req: ProfileRequest, duration: float = 0.2) -> Taken:
    return take_profile(req, lambda: broker, _Never(), duration=duration)


def test_a_profile_of_a_pid_is_named_stacks_from_one_call(
    sleeper: subprocess.Popen[bytes],
) -> None:
    pid = sleeper.pid
    broker = _Broker([(pid, b"sleep\0", 42)], code=_code_address(pid))
    taken = _taken(broker, ProfileRequest(pids=[pid], command=[]))
    # No stackcopy: the frame-pointer program, at the request's frequency, this pid.
    assert [name for name, _ in broker.asked] == ["stackcopy", "profile"]
    assert broker.asked[1][1]["pid"] == pid and broker.asked[1][1]["frequency"] == 99
    assert broker.attachment is not None and broker.attachment.detached and broker.closed
    prof = taken.profile
    assert prof.unit == "samples" and prof.total() == 42 and prof.period_ns == 10**9 // 99
    ((frames, weight),) = prof.stacks.items()
    assert weight == 42 and frames[0] == "sleep" and len(frames) == 2
    assert taken.lost == 3 and not taken.empty
    assert taken.run.processes == [pid] and taken.run.seen == [(pid, "sleep", 42)]
    assert any("could not be counted" in n for n in prof.notes)  # the lost samples


def test_without_stackcopy_the_frame_pointer_note_says_what_to_ask_for(
    sleeper: subprocess.Popen[bytes],
) -> None:
    """Issue 33 item 5: the note advised frame pointers only."""
    pid = sleeper.pid
    broker = _Broker([(pid, b"sleep\0", 42)], code=_code_address(pid))
    (note,) = [n for n in _taken(broker, ProfileRequest([pid], [])).profile.notes if FP in n]
    user = pwd.getpwuid(os.getuid()).pw_name
    assert f"`gfxbpf-admin approve stackcopy --users {user} --scope self`" in note
    # Scope system has no stack copies to grant: frame pointers only.
    broker = _Broker([(pid, b"sleep\0", 42)], code=_code_address(pid))
    req = ProfileRequest([pid], [], scope="system")
    (note,) = [n for n in _taken(broker, req).profile.notes if FP in n]
    assert "stackcopy" not in note and [a for a, _ in broker.asked] == ["profile"]


def test_a_profile_of_all_processes_leaves_out_the_profiler(
    sleeper: subprocess.Popen[bytes],
) -> None:
    """Issue 33 item 5: gfxclient was in its own process list."""
    rows = [(sleeper.pid, b"sleep\0", 42), (os.getpid(), b"gfxclient\0", 9)]
    taken = _taken(_Broker(rows), ProfileRequest(pids=[], command=[]))
    assert taken.run.seen == [(sleeper.pid, "sleep", 42)] and taken.profile.total() == 42


def test_the_held_child_is_named_apart_and_left_out(tmp_path: Path) -> None:
    """What the child runs between fork and exec is gfxclient's own Python."""
    child = Child(["/bin/true"])
    try:
        deadline = time.monotonic() + 5
        comm = ""
        while comm != HELD_COMM and time.monotonic() < deadline:
            with open(f"/proc/{child.pid}/comm") as f:
                comm = f.read().strip()
        assert comm == HELD_COMM
    finally:
        child.abandon()
    rows = [(None, HELD_COMM.encode() + b"\0", 5), (None, b"sh\0", 42)]
    req = ProfileRequest(pids=[], command=["/bin/sh", "-c", "exit 0"])
    taken = _taken(_Broker(rows), req, duration=10.0)
    assert taken.run.child is not None
    assert taken.run.seen == [(taken.run.child.pid, "sh", 42)] and taken.profile.total() == 42


def test_a_command_runs_once_attached_and_its_exit_status_is_kept(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    broker = _Broker([(None, b"sh\0", 1)])
    req = ProfileRequest(pids=[], command=["/bin/sh", "-c", f"touch {marker}; exit 3"])
    taken = _taken(broker, req, duration=10.0)
    (_, kw) = broker.asked[-1]
    assert marker.exists() and taken.run.child is not None
    assert kw["pid"] == taken.run.child.pid and kw["children"]  # its tree, in the kernel
    assert taken.run.child.status == 3 and taken.run.elapsed() < 10.0


def test_a_refused_attach_never_runs_the_command(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    broker = _Broker([], grant=False)
    req = ProfileRequest(pids=[], command=["/bin/sh", "-c", f"touch {marker}"])
    with pytest.raises(BrokerError, match="you may not run program 'profile'"):
        take_profile(req, lambda: broker, _Never())
    assert broker.closed and not marker.exists()


def test_stacks_at_refused_says_which_grant_is_missing() -> None:
    """Issue 33 item 5: --stacks-at …/libc.so.6:malloc was refused as "you may
    not run program 'ustacks'"; what is missing is ustackcopy on that library."""
    broker = _Broker([], grant=False)
    req = ProfileRequest([os.getpid()], [], library="/lib/libc.so.6", functions=["malloc"])
    with pytest.raises(BrokerError) as e:
        _taken(broker, req)
    assert [a for a, _ in broker.asked] == ["ustackcopy", "ustacks"]
    user = pwd.getpwuid(os.getuid()).pw_name
    text = str(e.value)
    assert e.value.code == pb.ERROR_PERMISSION_DENIED and e.value.rule == "p:1"
    assert "needs program ustackcopy (or ustacks, by frame pointers)" in text
    assert (
        f"`gfxbpf-admin approve ustackcopy --users {user} --scope self "
        "--libraries /lib/libc.so.6 --functions malloc`"
    ) in text
    assert "broker: you may not run program 'ustacks'" in text
    # A refusal that is not the policy's (no rule: e.g. not your process) is left
    # as it is, and no other program is tried behind it.
    broker = _Broker([], grant=False, rule="")
    with pytest.raises(BrokerError) as e:
        _taken(broker, req)
    assert e.value.message == "you may not run program 'ustackcopy': no entry names it"
    assert [a for a, _ in broker.asked] == ["ustackcopy"]


class _TargetRefused(_Broker):
    """Refuses the target process itself, as the broker's pid check does."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__([])
        self.refusal = BrokerError(code, why)

    def attach(self, name: str, **kw: Any) -> _Attachment:
        self.asked.append((name, kw))
        raise self.refusal


@pytest.mark.parametrize(
    ("code", "why"),
    [
        (pb.ERROR_PERMISSION_DENIED, "process 1 belongs to uid 0 (effective 0), not to you"),
        (pb.ERROR_NOT_FOUND, "no process 999999"),
    ],
)
def test_a_refused_target_is_said_not_hidden_behind_another_program(code: int, why: str) -> None:
    """`profile --pid 1` said "you may not run program 'profile'" to a user
    granted stackcopy: the fallback to frame-pointer stacks hid the broker's
    refusal of the process, which no other program would accept either."""
    broker = _TargetRefused(code, why)
    with pytest.raises(BrokerError) as e:
        _taken(broker, ProfileRequest(pids=[1], command=[]))
    assert e.value.message == why and [a for a, _ in broker.asked] == ["stackcopy"]
    assert not BrokerError(code, why).refuses_program
    assert BrokerError(pb.ERROR_PERMISSION_DENIED, "you may not", "default deny").refuses_program
    assert BrokerError(pb.ERROR_NOT_FOUND, "no program 'x' in the broker's catalog").refuses_program


def test_the_collector_is_as_it_was_after_the_call(sleeper: subprocess.Popen[bytes]) -> None:
    import gc

    req = ProfileRequest(pids=[sleeper.pid], command=[])
    assert gc.isenabled()
    _taken(_Broker([(None, b"sleep\0", 1)]), req, duration=0.1)
    assert gc.isenabled()
    try:
        broker = _Broker([(None, b"sleep\0", 1)])
        take_profile(req, lambda: broker, _Never(), 0.1, keep_collector_off=True)
        assert not gc.isenabled()  # the caller writes its file first
    finally:
        gc.enable()


def test_the_command_keeps_to_its_flags_report_and_summary() -> None:
    """Issue 36: the engine lives here, the command stays at most 450 lines."""
    command = Path(__file__).resolve().parents[2] / "client" / "cli" / "profile_cmd.py"
    assert len(command.read_text().splitlines()) <= 450


def test_walls_copy_advice_is_for_the_waits_smaller_copies() -> None:
    """--wall unwinds CPU samples copied by stackcopy (24 KiB as `approve`
    writes it) and waits copied by offcpu (8 KiB): a note on cut stacks said
    the copies were already the most gfxbpf takes, of the waits' 8 KiB."""
    from gfxbpf.catalog.stack_copies import MAX_STACK_BYTES
    from gfxbpf.client.profiles.engine.naming import copy_size

    def run(asked: int, waits: int | None) -> Any:
        return SimpleNamespace(
            req=SimpleNamespace(stack_bytes=asked),
            copies=SimpleNamespace(largest=MAX_STACK_BYTES),
            att=SimpleNamespace(program="stackcopy"),
            waits=None if waits is None else SimpleNamespace(largest=waits),
            waits_att=None if waits is None else SimpleNamespace(program="offcpu"),
        )

    wall = copy_size(run(0, 8192))
    assert (wall.copied, wall.program, wall.asked) == (8192, "offcpu", 0)
    assert "gfxbpf-admin approve offcpu --max-stack-bytes" in wall.advice()
    assert copy_size(run(0, None)).program == "stackcopy"
    assert "already" in copy_size(run(0, None)).advice()
    assert "--stack-bytes 24576" in copy_size(run(8192, 8192)).advice()


def test_a_full_rings_note_gives_advice_the_profile_can_take() -> None:
    """--locks and --gpu sample at no frequency: a locks profile of four
    threads contending on one lock dropped 2286 copies and said "sample at a
    lower --frequency"."""
    from gfxbpf.client.profiles.engine.naming import lost_note
    from gfxbpf.client.profiles.engine.request import CPU, GPU, LOCKS, OFF_CPU

    assert "--frequency" in lost_note(CPU, 5, copied=True, probes=False)
    assert "--min-block" in lost_note(OFF_CPU, 5, copied=True, probes=False)
    for mode in (LOCKS, GPU):
        note = lost_note(mode, 2286, copied=True, probes=False)
        assert note.startswith("2286 stack copies were dropped") and "--frequency" not in note
    assert "--stack-bytes" in lost_note(LOCKS, 1, copied=True, probes=False)
    assert "the broker's table was full" in lost_note(CPU, 3, copied=False, probes=False)
    from gfxbpf.client.profiles.engine.request import MEMORY

    # a PyTorch script's exact --memory profile lost 730,000 copies and calls
    assert "--sample-bytes" in lost_note(MEMORY, 730_000, copied=True, probes=True)
    assert "--sample-bytes" not in lost_note(CPU, 7, copied=True, probes=True)  # --stacks-at
