"""Catalog programs with a BTF-typed build (issue #14 item 5), on the live kernel.

execsnoop has two builds in one object: `btf` (tp_btf + CO-RE reads of
sched_process_exec's typed arguments) and `tracefs` (format-file offsets).
Where the kernel has BTF the first is chosen; without it the second. Both
must report exactly the execs the test causes, the same values, directly
and through a broker running as gfxbpf with only CAP_BPF+CAP_PERFMON; the
tp_btf build runs even where the broker cannot read tracefs at all.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from gfxbpf.bpf.kernel import vmlinux as kernel_btf
from gfxbpf.bpf.ringbuf import RingBuffer
from gfxbpf.catalog import instance
from gfxbpf.catalog.entries import load_catalog
from gfxbpf.catalog.objects import read_object
from tests.kernel.brokerenv import ALICE, BrokerProcess, Client, ensure_user, policy_for
from tests.kernel.rawclient import kernel_looking
from tests.kernel.sysmaps_util import run_unprivileged

CATALOG = load_catalog()
TEST_UID = 54329  # a uid nothing else on the machine runs as
N_EXECS = 40


def _exec_true_as(uid: int, n: int) -> list[int]:
    """n execs of /bin/true by a child running as uid; their pids."""
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(r)
            os.setgid(uid)
            os.setuid(uid)
            pids = []
            for _ in range(n):
                pid = os.fork()
                if pid == 0:
                    try:
                        os.execv("/bin/true", ["true"])
                    finally:
                        os._exit(127)
                os.waitpid(pid, 0)
                pids.append(pid)
            os.write(w, ",".join(map(str, pids)).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(child, 0)
    return [int(x) for x in data.decode().split(",") if x]


@pytest.fixture(params=["btf", "tracefs"])
def variant(request: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "tracefs":  # as on a kernel without BTF
        monkeypatch.setattr(kernel_btf, "tp_btf_target_exists", lambda _name: False)
    return str(request.param)


def test_execsnoop_counts_exact_execs_in_each_build(variant: str) -> None:
    entry = CATALOG.get("execsnoop")
    params = instance.Params(uid=TEST_UID)
    with instance.start(entry, read_object(entry), params) as inst:
        assert inst.variant == variant
        assert list(inst.obj.programs) == [
            "process_exec_btf" if variant == "btf" else "process_exec"
        ]
        _exec_true_as(0, 3)  # root's execs must not appear
        pids = _exec_true_as(TEST_UID, N_EXECS)
        btf = inst.obj.spec.btf
        assert btf is not None
        ev_type = btf.find("exec_event")
        fd = inst.obj.map("events").fileno()

        def consume() -> list[bytes]:
            out: list[bytes] = []
            with RingBuffer(fd) as rb:
                deadline = time.monotonic() + 3
                while time.monotonic() < deadline:  # drain all: extra events must show
                    out += rb.poll(0.2)
            return out

        records = run_unprivileged(consume)
        got = [btf.decode(ev_type, r) for r in records]
    # The typed pointers (task, binprm, filename) stay in registers.
    assert [kernel_looking(r) for r in records] == [[]] * len(records)
    assert len(got) == N_EXECS
    assert sorted(e["pid"] for e in got) == sorted(pids)
    for e in got:
        assert e["uid"] == TEST_UID and e["gid"] == TEST_UID and e["comm"] == "true"
        assert e["filename"] == "/bin/true"
        assert e["tgid"] == e["pid"]


def test_without_btf_or_tracefs_execsnoop_says_what_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entry = CATALOG.get("execsnoop")
    monkeypatch.setattr(kernel_btf, "tp_btf_target_exists", lambda _name: False)
    with pytest.raises(instance.Unavailable) as e:
        instance.choose_variant(entry, exists=lambda _s, _e: False)
    msg = str(e.value)
    assert "sched:sched_process_exec does not exist" in msg
    assert "btf (needs kernel BTF with btf_trace_sched_process_exec)" in msg


def broker_policy(request: pytest.FixtureRequest) -> str:
    return policy_for({"execsnoop": {"users": [ALICE], "scope": ["self"]}})


def test_broker_runs_the_btf_build_with_exact_events(broker: BrokerProcess) -> None:
    # The broker (user gfxbpf, CAP_BPF+CAP_PERFMON) loads the tp_btf build; its
    # audit passed the object (TRACING/tp_btf is in broker/review/table.py).
    alice = Client(broker, ALICE)
    try:
        att = alice.ok("attach", name="execsnoop", scope="self")
        stats = alice.ok("stats", id=att["id"])["programs"]
        assert [p[0] for p in stats] == ["process_exec_btf"]  # the tp_btf build
        mine = alice.ok("exec", n=N_EXECS)["pids"]
        events = alice.ok("events", id=att["id"], want_pids=mine, timeout=5)["events"]
        alice_uid, _ = ensure_user(ALICE)
        assert sorted(e["pid"] for e in events) == sorted(mine)
        assert all(e["uid"] == alice_uid and e["filename"] == "/bin/true" for e in events)
        assert all(e["suspicious"] == [] for e in events)  # no kernel address reaches alice
    finally:
        alice.close()


# The broker in a mount namespace of its own where /sys/kernel/tracing is an
# empty root-only tmpfs: tracefs as it is without the deploy drop-in. Only the
# mount that holds /sys/kernel/tracing is made private (so the tmpfs does not
# propagate to the host), not "/": in a chroot the root is no mount point and
# `unshare --propagation private` fails there ("cannot change root filesystem
# propagation").
NO_TRACEFS = [
    "unshare",
    "--mount",
    "--propagation",
    "unchanged",
    "sh",
    "-c",
    'mount --make-rprivate "$(findmnt -n -o TARGET -T /sys/kernel/tracing)"'
    ' && mount -t tmpfs -o mode=0700 gfxbpf-no-tracefs /sys/kernel/tracing && exec "$@"',
    "sh",
]


def test_broker_without_tracefs_runs_the_btf_build_only() -> None:
    policy = policy_for(
        {
            "execsnoop": {"users": [ALICE], "scope": ["self"]},
            "clonecount": {"users": [ALICE], "scope": ["self"]},
        }
    )
    b = BrokerProcess.start(policy, wrapper=NO_TRACEFS)
    alice = Client(b, ALICE)
    try:
        att = alice.ok("attach", name="execsnoop", scope="self")
        mine = alice.ok("exec", n=N_EXECS)["pids"]
        events = alice.ok("events", id=att["id"], want_pids=mine, timeout=5)["events"]
        assert sorted(e["pid"] for e in events) == sorted(mine)
        # A tracepoint-only program needs tracefs: refused, saying so.
        r = alice("attach", name="clonecount", scope="self")
        assert not r["ok"] and r["code"] == "ERROR_UNAVAILABLE", r
        assert "permission denied reading tracefs" in r["message"], r
    finally:
        alice.close()
        b.stop()
