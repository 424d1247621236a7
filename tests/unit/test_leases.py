"""LeaseManager: leases on gRPC attachments, renewal, the reaper, owners, shutdown."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from gfxbpf.broker.access.leases import LeaseManager
from gfxbpf.broker.callers import Caller
from gfxbpf.broker.errors import BrokerError
from gfxbpf.proto import gfxbpf_pb2 as pb

ALICE = Caller(uid=1001, gid=1001, gids=(1001,), pid=0, transport="grpc")
BOB = Caller(uid=1002, gid=1002, gids=(1002,), pid=0, transport="grpc")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FakeOwner:
    def __init__(self, n: int, caller: Caller) -> None:
        self.id = n
        self.caller = caller
        self.closed = False
        self.attachments: set[int] = set()


class FakeService:
    """Records what the lease manager asks of the Service."""

    def __init__(self, max_owners: int = 100) -> None:
        self.owners: list[FakeOwner] = []
        self.detached: list[tuple[int, int, int]] = []  # (uid, owner id, attachment id)
        self.max_owners = max_owners
        self.audit_lines: list[dict[str, Any]] = []
        self.audit = self
        self.lock = threading.Lock()

    def ok(self, op: str, **fields: Any) -> None:
        self.audit_lines.append({"op": op, **fields})

    def open_owner(self, caller: Caller) -> FakeOwner:
        with self.lock:
            if sum(1 for o in self.owners if not o.closed) >= self.max_owners:
                raise BrokerError(pb.ERROR_RESOURCE_EXHAUSTED, "too many sessions")
            o = FakeOwner(len(self.owners) + 1, caller)
            self.owners.append(o)
            return o

    def close_owner(self, owner: FakeOwner) -> None:
        for aid in sorted(owner.attachments):
            self.detached.append((owner.caller.uid, owner.id, aid))
        owner.attachments.clear()
        owner.closed = True

    def detach(self, caller: Caller, owner: FakeOwner, req: pb.DetachRequest) -> pb.DetachReply:
        assert not owner.closed
        if req.attachment_id not in owner.attachments:
            raise BrokerError(pb.ERROR_NOT_FOUND, f"no attachment {req.attachment_id}")
        owner.attachments.discard(req.attachment_id)
        self.detached.append((caller.uid, owner.id, req.attachment_id))
        return pb.DetachReply(unloaded=True)


def attach(mgr: LeaseManager, holder: Any, aid: int, seconds: int = 0) -> int:
    with mgr.using(holder) as owner:
        owner.attachments.add(aid)
        return mgr.grant(holder, aid, seconds)


def make(clock: Clock, svc: FakeService | None = None, **kw: Any) -> LeaseManager:
    wall = lambda: 1_700_000_000.0 + clock.t  # noqa: E731
    kw.setdefault("default_seconds", 30)
    kw.setdefault("max_seconds", 60)
    return LeaseManager(svc or FakeService(), clock=clock, wall=wall, **kw)


def test_lease_length_default_and_cap() -> None:
    mgr = make(Clock())
    assert mgr.lease_length(0) == 30
    assert mgr.lease_length(5) == 5
    assert mgr.lease_length(10_000) == 60
    with pytest.raises(ValueError):
        LeaseManager(FakeService(), default_seconds=0)


def test_expired_lease_is_detached_by_the_reaper_pass() -> None:
    clock, svc = Clock(), FakeService()
    mgr = make(clock, svc)
    h = mgr.holder("token:a", ALICE)
    expires = attach(mgr, h, 7, seconds=5)
    assert expires == int(1_700_000_000 + 1000 + 5)
    clock.t += 4.9
    assert mgr.reap() == []
    assert svc.detached == []
    clock.t += 0.1
    assert mgr.reap() == [7]
    assert svc.detached == [(1001, 1, 7)]
    assert svc.audit_lines == [
        {"op": "lease_expired", "uid": 1001, "pid": 0, "attachment_id": 7, "transport": "grpc"}
    ]
    assert not mgr.has_lease(h, 7)
    # The owner is idle now (no leases, no call in flight): the next pass closes it.
    assert not svc.owners[0].closed
    mgr.reap()
    assert svc.owners[0].closed


def test_renewal_keeps_an_attachment_alive() -> None:
    clock, svc = Clock(), FakeService()
    mgr = make(clock, svc)
    h = mgr.holder("token:a", ALICE)
    attach(mgr, h, 1, seconds=10)
    attach(mgr, h, 2, seconds=10)
    for _ in range(5):
        clock.t += 8
        assert mgr.renew(h, 1) == int(1_700_000_000 + clock.t + 10)
        mgr.reap()
    assert svc.detached == [(1001, 1, 2)]  # 2 was never renewed
    assert mgr.renew(h, 2) is None
    assert mgr.renew_all(h) == 1
    clock.t += 9.9
    mgr.reap()
    assert mgr.has_lease(h, 1)
    clock.t += 0.2
    assert mgr.reap() == [1]


def test_release_after_client_detach_and_already_gone_attachment() -> None:
    clock, svc = Clock(), FakeService()
    mgr = make(clock, svc)
    h = mgr.holder("token:a", ALICE)
    attach(mgr, h, 3, seconds=1)
    assert mgr.release(h, 3) is True
    assert mgr.release(h, 3) is False
    attach(mgr, h, 4, seconds=1)
    svc.owners[0].attachments.discard(4)  # the service already dropped it
    clock.t += 2
    assert mgr.reap() == []  # NOT_FOUND from the service is not fatal
    assert svc.detached == []


def test_holders_are_separate_owners_and_busy_owners_stay_open() -> None:
    clock, svc = Clock(), FakeService()
    mgr = make(clock, svc)
    ha = mgr.holder("token:a", ALICE)
    hb = mgr.holder("token:b", BOB)
    assert mgr.holder("token:a", ALICE) is ha
    with mgr.using(ha) as oa, mgr.using(hb) as ob:
        assert oa is not ob
        assert (oa.caller, ob.caller) == (ALICE, BOB)
        mgr.reap()
        assert not oa.closed and not ob.closed  # calls in flight
    mgr.reap()
    assert oa.closed and ob.closed
    # The next call opens a fresh owner.
    with mgr.using(ha) as oa2:
        assert oa2 is not oa and not oa2.closed


def test_open_owner_errors_propagate() -> None:
    clock = Clock()
    mgr = make(clock, FakeService(max_owners=1))
    with mgr.using(mgr.holder("token:a", ALICE)):
        with pytest.raises(BrokerError) as e:
            with mgr.using(mgr.holder("token:b", ALICE)):
                pass
    assert e.value.code == pb.ERROR_RESOURCE_EXHAUSTED


def test_holder_with_expired_token_is_forgotten_once_empty() -> None:
    clock, svc = Clock(), FakeService()
    mgr = make(clock, svc)
    wall_now = 1_700_000_000.0 + clock.t
    h = mgr.holder("token:a", ALICE, expires_unix=wall_now + 20)
    attach(mgr, h, 9, seconds=60)
    clock.t += 30  # token expired, lease not yet: the attachment stays
    mgr.reap()
    assert [k for k, _, _ in mgr.leases()] == ["token:a"]
    clock.t += 31
    assert mgr.reap() == [9]
    mgr.reap()
    assert mgr.leases() == []
    assert "token:a" not in mgr._holders


def test_stop_closes_every_owner_and_refuses_new_calls() -> None:
    clock, svc = Clock(), FakeService()
    mgr = make(clock, svc)
    h = mgr.holder("token:a", ALICE)
    attach(mgr, h, 1)
    attach(mgr, mgr.holder("token:b", BOB), 2)
    mgr.stop()
    assert all(o.closed for o in svc.owners)
    assert sorted(d[2] for d in svc.detached) == [1, 2]
    with pytest.raises(RuntimeError, match="shutting down"):
        with mgr.using(h):
            pass


def test_reaper_thread_detaches_in_real_time_and_stops_cleanly() -> None:
    svc = FakeService()
    mgr = LeaseManager(svc, default_seconds=0.3, max_seconds=0.3, interval=0.05)
    mgr.start()
    mgr.start()  # idempotent
    try:
        h = mgr.holder("token:a", ALICE)
        attach(mgr, h, 5)
        attach(mgr, h, 6)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:  # keep 6 alive, let 5 lapse
            mgr.renew(h, 6)
            if any(d[2] == 5 for d in svc.detached):
                break
            time.sleep(0.02)
        assert [d[2] for d in svc.detached] == [5]
        assert mgr.has_lease(h, 6)
    finally:
        t0 = time.monotonic()
        mgr.stop()
        assert time.monotonic() - t0 < 1.0
    assert mgr._thread is not None and not mgr._thread.is_alive()
    assert sorted(d[2] for d in svc.detached) == [5, 6]


def test_pinned_lease_does_not_run_out_until_the_stream_ends() -> None:
    clock, svc = Clock(), FakeService()
    mgr = make(clock, svc)
    h = mgr.holder("token:a", ALICE)
    attach(mgr, h, 8, seconds=5)
    with mgr.pinned(h, 8):
        clock.t += 100
        assert mgr.reap() == []
        with mgr.pinned(h, 8):
            clock.t += 100
        assert mgr.reap() == []  # still pinned by the outer stream
    clock.t += 4.9  # the lease runs its full length from the stream's end
    assert mgr.reap() == []
    clock.t += 0.2
    assert mgr.reap() == [8]
    with mgr.pinned(h, 12345):  # no such lease: nothing to pin, no error
        pass
