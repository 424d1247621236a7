"""The per-user budget of load CPU time (broker/access/loadcpu.py) and the broker's refusal."""

from __future__ import annotations

import io
import threading

import pytest

from gfxbpf.broker.access.loadcpu import LoadBudget, LoadLimits, OverLoadBudget
from gfxbpf.broker.auditlog import AuditLog
from gfxbpf.broker.policy.rules import Policy
from gfxbpf.broker.service import BrokerError, Caller, Service
from gfxbpf.catalog.entries import load_catalog
from gfxbpf.proto import gfxbpf_pb2 as pb


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _load(b: LoadBudget, cpu: Clock, uid: int, seconds: float, limits: LoadLimits) -> None:
    with b.loading(uid, limits):
        cpu.now += seconds


def test_loads_are_refused_once_their_cpu_fills_the_window_and_lapse_after_it() -> None:
    clock, cpu = Clock(), Clock(0.0)
    b = LoadBudget(clock, cpu)
    limits = LoadLimits(seconds=2, window=60)
    _load(b, cpu, 1, 1.5, limits)
    clock.now += 10
    _load(b, cpu, 1, 0.75, limits)  # under the limit when it began: it runs
    assert b.used(1, 60) == 2.25
    with pytest.raises(OverLoadBudget) as ei:
        _load(b, cpu, 1, 1.0, limits)
    # The first load (1.5 s) must leave the window, 50 s from now.
    assert (ei.value.used, ei.value.retry_after) == (2.25, 50.0)
    assert cpu.now == 2.25  # a refused load costs nothing
    _load(b, cpu, 2, 1.0, limits)  # per uid
    clock.now += 50
    _load(b, cpu, 1, 1.0, limits)


def test_a_load_that_fails_is_charged_all_the_same() -> None:
    clock, cpu = Clock(), Clock(0.0)
    b = LoadBudget(clock, cpu)
    with pytest.raises(RuntimeError), b.loading(1, LoadLimits(1, 60)):
        cpu.now += 1.0
        raise RuntimeError("exited while attaching")
    with pytest.raises(OverLoadBudget):
        _load(b, cpu, 1, 0.1, LoadLimits(1, 60))


def test_one_users_loads_run_one_at_a_time() -> None:
    b = LoadBudget()
    limits = LoadLimits(100, 60)
    inside, peak = [0], [0]
    lock = threading.Lock()
    gate = threading.Barrier(4)

    def one() -> None:
        gate.wait()
        with b.loading(7, limits):
            with lock:
                inside[0] += 1
                peak[0] = max(peak[0], inside[0])
            threading.Event().wait(0.02)
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == 1


def test_the_broker_refuses_a_load_past_the_allowance_naming_the_limit() -> None:
    clock = Clock()
    policy = Policy.parse(
        "[limits]\nload_cpu_seconds_per_user = 3\nload_cpu_window_seconds = 30\n",
        path="/etc/gfxbpf/policy.toml",
    )
    s = Service(policy, load_catalog(), AuditLog(stream=io.StringIO()), clock=clock)
    caller = Caller(uid=1001, gid=1001, gids=(1001,), pid=42, transport="unix")
    entry = load_catalog().get("stackcopy")
    cpu = Clock(0.0)
    s.loader.load_budget = LoadBudget(clock, cpu)
    with s.loader._load_paid(caller, entry):
        cpu.now += 3.5  # one slow load, allowed: the budget was unused
    clock.now += 12
    with pytest.raises(BrokerError) as ei, s.loader._load_paid(caller, entry):
        pass
    e = ei.value
    assert e.code == pb.ERROR_RESOURCE_EXHAUSTED
    assert e.rule == "[limits] load_cpu_seconds_per_user = 3"
    assert e.audit_rule == "/etc/gfxbpf/policy.toml [limits] load_cpu_seconds_per_user = 3"
    assert "spend 3.5 s of CPU loading programs" in e.message
    assert "allowance of 3 s per 30 s" in e.message and "Retry in 18 s" in e.message
