"""broker.registry (shared, refcounted instances) and broker.pidcheck (pidfd ownership)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from gfxbpf.broker.request.pidcheck import PidError, verify_owner
from gfxbpf.broker.sharing.registry import Gone, InstanceKey, Registry


class Thing:
    def __init__(self, n: int) -> None:
        self.n = n
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def key(**kw: object) -> InstanceKey:
    base = {
        "sha256": "ab" * 32,
        "scope": "system",
        "uid": None,
        "pid": None,
        "library": None,
        "functions": (),
    }
    base.update(kw)
    return InstanceKey(**base)  # type: ignore[arg-type]


def test_a_release_while_pinned_closes_when_the_last_pin_goes() -> None:
    reg: Registry[Thing] = Registry()
    thing, _ = reg.acquire(key(), lambda: Thing(1))
    with reg.pin(key(), thing):
        with reg.pin(key(), thing):
            assert reg.release(key(), thing) is True  # the last attachment left...
            assert thing.closed == 0 and len(reg) == 0  # ...but a request still reads it
        assert thing.closed == 0
    assert thing.closed == 1
    with pytest.raises(Gone):  # a request that starts after the release
        reg.pin(key(), thing)
    again, joined = reg.acquire(key(), lambda: Thing(2))
    assert not joined and again.n == 2  # a new attach does not join the closing one
    with pytest.raises(Gone):
        reg.pin(key(), thing)  # nor does a pin of the old instance reach the new one


def test_join_and_release() -> None:
    reg: Registry[Thing] = Registry()
    made: list[Thing] = []

    def create() -> Thing:
        made.append(Thing(len(made)))
        return made[-1]

    a, joined_a = reg.acquire(key(), create)
    b, joined_b = reg.acquire(key(), create)
    c, joined_c = reg.acquire(key(scope="self", uid=5), create)
    assert a is b and not joined_a and joined_b
    assert c is not a and not joined_c
    assert reg.refs(key()) == 2 and len(reg) == 2
    assert reg.release(key(), a) is False
    assert a.closed == 0
    assert reg.release(key(), a) is True
    assert a.closed == 1 and len(reg) == 1
    with pytest.raises(KeyError):
        reg.release(key(), a)
    # A new acquire after the last release creates a fresh instance.
    d, joined = reg.acquire(key(), create)
    assert d is not a and not joined


def test_unique_keys_never_share() -> None:
    reg: Registry[Thing] = Registry()
    a, _ = reg.acquire(key(unique=1), lambda: Thing(1))
    b, joined = reg.acquire(key(unique=2), lambda: Thing(2))
    assert a is not b and not joined


def test_failed_create_leaves_nothing() -> None:
    reg: Registry[Thing] = Registry()

    def boom() -> Thing:
        raise RuntimeError("load failed")

    with pytest.raises(RuntimeError):
        reg.acquire(key(), boom)
    assert len(reg) == 0 and reg.refs(key()) == 0
    t, joined = reg.acquire(key(), lambda: Thing(1))
    assert not joined and t.n == 1


def test_concurrent_identical_requests_share_one_instance() -> None:
    reg: Registry[Thing] = Registry()
    created = []
    lock = threading.Lock()

    def create() -> Thing:
        time.sleep(0.05)  # a slow load: the others must wait and join
        with lock:
            created.append(1)
        return Thing(len(created))

    got: list[Thing] = []

    def worker() -> None:
        t, _ = reg.acquire(key(), create)
        with lock:
            got.append(t)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(created) == 1
    assert len({id(t) for t in got}) == 1 and reg.refs(key()) == 16
    for t in got:
        reg.release(key(), t)
    assert got[0].closed == 1 and len(reg) == 0


def test_verify_owner_own_process() -> None:
    with verify_owner(os.getpid(), os.getuid()) as h:
        assert h.alive() and h.pid == os.getpid()
    assert not h.alive()


def test_verify_owner_refuses_others_and_the_dead() -> None:
    with pytest.raises(PidError, match="belongs to uid"):
        verify_owner(os.getpid(), os.getuid() + 1)
    p = subprocess.Popen(["/bin/true"])
    p.wait()
    with pytest.raises(PidError, match="no process"):
        verify_owner(p.pid, os.getuid())
    for bad in (0, -1):
        with pytest.raises(PidError, match="positive"):
            verify_owner(bad, 0)


def test_verify_owner_checks_real_and_effective_uid(tmp_path: Path) -> None:
    pid = os.getpid()
    (tmp_path / str(pid)).mkdir()
    uid = os.getuid()
    (tmp_path / str(pid) / "status").write_text(f"Name:\tx\nUid:\t{uid}\t{uid + 1}\t{uid}\t{uid}\n")
    with pytest.raises(PidError, match=f"effective {uid + 1}"):
        verify_owner(pid, uid, proc=str(tmp_path))


def test_handle_sees_exit() -> None:
    p = subprocess.Popen(["/bin/sleep", "5"])
    try:
        h = verify_owner(p.pid, os.getuid())
        assert h.alive()
        p.kill()
        p.wait()
        assert not h.alive()
        h.close()
    finally:
        if p.poll() is None:
            p.kill()
