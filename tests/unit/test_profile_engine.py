"""The profiling engine as a library (issue 36 item 1): take_profile() takes a
request and a broker and returns named stacks, without the command. A fake
broker stands in for the kernel half (tests/kernel/test_profile.py runs the
real one): it refuses stack copies, as a policy without stackcopy does, and
answers the frame-pointer program's maps."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gfxbpf.client.errors import BrokerError
from gfxbpf.client.profiles import read as profile_read
from gfxbpf.client.profiles.engine.request import ProfileRequest
from gfxbpf.client.profiles.engine.take import take_profile
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
    """Grants `profile` only; records what was asked."""

    def __init__(self, pid_of_rows: int | None, grant: bool = True) -> None:
        self.asked: list[tuple[str, dict[str, Any]]] = []
        self.pid_of_rows = pid_of_rows
        self.grant = grant
        self.closed = False
        self.attachment: _Attachment | None = None

    def attach(self, name: str, **kw: Any) -> _Attachment:
        self.asked.append((name, kw))
        if name != "profile" or not self.grant:
            raise BrokerError(pb.ERROR_PERMISSION_DENIED, f"no rule grants you {name}")
        tgid = self.pid_of_rows if self.pid_of_rows is not None else kw["pid"]
        pc = _code_address()
        stack = struct.pack("<127Q", pc, *([0] * 126))
        counts = [(profile_read.SAMPLE_KEY.pack(tgid, 7, 0, b"prog\0"), struct.pack("<Q", 42))]
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


def _code_address() -> int:
    """An address in this interpreter's executable code."""
    with open("/proc/self/maps") as f:
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


def test_a_profile_of_a_pid_is_named_stacks_from_one_call() -> None:
    broker = _Broker(os.getpid())
    req = ProfileRequest(pids=[os.getpid()], command=[])
    taken = take_profile(req, lambda: broker, _Never(), duration=0.2)
    # No stackcopy: the frame-pointer program, at the request's frequency, this pid.
    assert [name for name, _ in broker.asked] == ["stackcopy", "profile"]
    assert broker.asked[1][1]["pid"] == os.getpid() and broker.asked[1][1]["frequency"] == 99
    assert broker.attachment is not None and broker.attachment.detached and broker.closed
    prof = taken.profile
    assert prof.unit == "samples" and prof.total() == 42 and prof.period_ns == 10**9 // 99
    ((frames, weight),) = prof.stacks.items()
    assert weight == 42 and len(frames) >= 2  # the process, then its code
    assert taken.lost == 3 and not taken.empty
    assert taken.run.processes == [os.getpid()]
    assert taken.run.seen == [(os.getpid(), "prog", 42)]
    assert any("could not be counted" in n for n in prof.notes)  # the lost samples


def test_a_command_runs_once_attached_and_its_exit_status_is_kept(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    broker = _Broker(None)
    req = ProfileRequest(pids=[], command=["/bin/sh", "-c", f"touch {marker}; exit 3"])
    taken = take_profile(req, lambda: broker, _Never(), duration=10.0)
    (_, kw) = broker.asked[-1]
    assert marker.exists() and taken.run.child is not None
    assert kw["pid"] == taken.run.child.pid and kw["children"]  # its tree, in the kernel
    assert taken.run.child.status == 3 and taken.run.elapsed() < 10.0


def test_a_refused_attach_never_runs_the_command(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    broker = _Broker(None, grant=False)
    req = ProfileRequest(pids=[], command=["/bin/sh", "-c", f"touch {marker}"])
    with pytest.raises(BrokerError, match="no rule grants you profile"):
        take_profile(req, lambda: broker, _Never())
    assert broker.closed and not marker.exists()


def test_the_collector_is_as_it_was_after_the_call() -> None:
    import gc

    assert gc.isenabled()
    take_profile(ProfileRequest(pids=[os.getpid()], command=[]), lambda: _Broker(1), _Never(), 0.1)
    assert gc.isenabled()
    try:
        take_profile(
            ProfileRequest(pids=[os.getpid()], command=[]),
            lambda: _Broker(1),
            _Never(),
            0.1,
            keep_collector_off=True,
        )
        assert not gc.isenabled()  # the caller writes its file first
    finally:
        gc.enable()
