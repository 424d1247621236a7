"""Issue #16, findings 1 and 2: what a user can do with the map fds she receives.

1. Pin a received fd into a bpffs she may write (a plain `mount -t bpf` is
   mode 1777), open the pin again read-write, write the map: every map a
   client can receive is frozen, so every write fails, on shared system-scope
   maps and per-session ones; ring buffers have no elements to write.
2. Attach and detach again and again, keeping the fds: the kernel keeps those
   maps; the broker's live map budget refuses once they hold it all (issue
   #26 item 11), and a create/drop loop meets the churn allowance.

The broker runs as the unit runs it (user gfxbpf, CAP_BPF + CAP_PERFMON);
the attacker is gfxtest-mallory running tests/kernel/mapattack.py.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.consts import BPF_F_NO_PREALLOC, MapType
from gfxbpf.bpf.loader import LoadError, load
from gfxbpf.bpf.object import ObjectSpec
from gfxbpf.bpf.specs import MapSpec
from gfxbpf.broker.access.budget import PAGE, map_bytes
from gfxbpf.catalog.entries import load_catalog
from tests.kernel.brokerenv import (
    BOB,
    MALLORY,
    RAWCLIENT,
    VENV_PYTHON,
    BrokerProcess,
    Client,
    policy_for,
    run_as,
)
from tests.kernel.mapattack import LIBC, obj_get, obj_pin, write_attempts
from tests.kernel.sysmaps_util import run_unprivileged

HERE = Path(__file__).parent
NCPU = bpfsys.possible_cpus()
BUDGET = 1 << 20  # 1 MiB: three execsnoop rings (256 KiB of data each), not four


@pytest.fixture
def bpffs() -> Iterator[Path]:
    """A bpffs mounted as an administrator's plain `mount -t bpf` would: mode 1777."""
    d = Path(tempfile.mkdtemp(prefix="gfxbpf-bpffs-", dir="/tmp"))
    subprocess.run(["mount", "-t", "bpf", "bpf", str(d)], check=True, timeout=30)
    try:
        assert os.stat(d).st_mode & 0o7777 == 0o1777
        yield d
    finally:
        subprocess.run(["umount", str(d)], check=False, timeout=30)
        d.rmdir()


def start_broker(policy: str) -> BrokerProcess:
    broker = BrokerProcess.start(policy, grpc=False)
    broker.install(RAWCLIENT)  # mapattack.py speaks through it
    broker.install(HERE / "mapattack.py")
    return broker


def mallory(broker: BrokerProcess, *args: str) -> dict[str, Any]:
    r = run_as(
        MALLORY,
        [VENV_PYTHON, str(broker.directory / "mapattack.py"), broker.socket, *args],
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- finding 1

ATTACKED = [
    # System scope: shared with bob before issue #26 (Unix fds now reach only
    # instances of her own uid); the writes must fail either way.
    {"name": "clonecount", "scope": "system"},
    {"name": "syscount", "scope": "system"},
    {"name": "execsnoop", "scope": "self"},  # her own ring buffer
    {"name": "ucalls", "scope": "self"},  # two per-session hash maps
    {"name": "fence", "scope": "system"},
]


# long: one attack scenario: bob's view, mallory's pins, every write, bob's view again.
def test_pinned_and_reopened_map_fds_cannot_write(bpffs: Path) -> None:
    both = [MALLORY, BOB]
    policy = policy_for(
        {
            "clonecount": {"users": both, "scope": ["system"]},
            "syscount": {"users": both, "scope": ["system"]},
            "execsnoop": {"users": [MALLORY], "scope": ["self"]},
            "ucalls": {
                "users": [MALLORY],
                "scope": ["self"],
                "libraries": [LIBC],
                "functions": ["getpid"],
            },
            "fence": {"users": [MALLORY], "scope": ["system"]},
        }
    )
    broker = start_broker(policy)
    bob = None
    try:
        # Issue 35 item 11: the broker says at start that users may pin here.
        checks = [r for r in broker.audit_records() if r.get("op") == "host_check"]
        assert any(f"{bpffs} is a bpffs of mode 1777" in r["detail"] for r in checks), checks
        bob = Client(broker, BOB)
        clone = bob.ok("attach", name="clonecount", scope="system")["id"]
        sysc = bob.ok("attach", name="syscount", scope="system")["id"]
        bob.ok("fork", n=3)
        before = {a: bob.ok("read_rpc", id=a)["entries"] for a in (clone, sysc)}
        assert all(before.values())

        out = mallory(broker, "pin", str(bpffs), json.dumps(ATTACKED))

        # Bob's view through the broker first (what the attack was after):
        # nothing deleted, nothing of hers, and the programs still count into
        # their frozen maps.
        bob.ok("fork", n=3)
        after = {a: bob.ok("read_rpc", id=a)["entries"] for a in (clone, sysc)}
        for a in (clone, sysc):
            mine = [k for k in after[a] if b"mallory".hex() in k]
            assert not mine, f"bob sees mallory's entries {mine}"
            assert set(before[a]) <= set(after[a]), (
                f"entries gone: {set(before[a]) - set(after[a])}"
            )
        grew = [k for k in before[clone] if after[clone][k] != before[clone][k]]
        assert grew, "clonecount stopped counting"

        assert out["refused"] == {}, out["refused"]
        want = {
            "clonecount/counts",
            "syscount/counts",
            "execsnoop/events",
            "ucalls/calls",
            "ucalls/latency",
            "fence/fence_latency",
        }
        assert set(out["maps"]) == want, out["maps"]
        for name, m in out["maps"].items():
            assert m["same_map"], name
            if m["type"] == MapType.RINGBUF:
                # Her own ring, already read-write: no elements, and the kernel
                # maps only the consumer page writable.
                assert m["insert"] != "ok" and m["delete"] != "ok", (name, m)
                assert m["mmap_producer_page_writable"] == "EPERM", (name, m)
                assert m["mmap_data_writable"] == "EPERM", (name, m)
            else:
                writes = {k: v for k, v in m.items() if k not in ("type", "same_map")}
                assert set(writes.values()) <= {"EPERM", "no keys"}, (name, m)
                assert writes["insert"] == "EPERM", (name, m)
    finally:
        if bob is not None:
            bob.close()
        broker.stop()

    # The pins outlive her session and the broker itself: the maps stay in the
    # kernel until the pin is removed (here: the unmount), still frozen.
    fd = obj_get(str(bpffs / "clonecount-counts"), 0)
    try:
        with pytest.raises(bpfsys.BpfError) as ei:
            bpfsys.map_update_elem(fd, b"x" * 16, b"\0" * 8)
        assert ei.value.errno == errno.EPERM
    finally:
        os.close(fd)


def _spec(maps: list[MapSpec]) -> ObjectSpec:
    spec = ObjectSpec()
    spec.name = "frozen_maps"
    spec.maps = {m.real_name: m for m in maps}
    return spec


def _m(name: str, map_type: int, key: int, value: int, entries: int, flags: int = 0) -> MapSpec:
    return MapSpec(name, name, map_type, key, value, entries, flags)


FREEZABLE = [
    _m("hash", MapType.HASH, 4, 8, 64),
    _m("hash_noprealloc", MapType.HASH, 4, 8, 64, BPF_F_NO_PREALLOC),
    _m("array", MapType.ARRAY, 4, 8, 16),
    _m("percpu_hash", MapType.PERCPU_HASH, 4, 8, 16),
    _m("percpu_array", MapType.PERCPU_ARRAY, 4, 8, 16),
    _m("lru_hash", MapType.LRU_HASH, 4, 8, 64),
    _m("lru_pcpu_hash", MapType.LRU_PERCPU_HASH, 4, 8, 64),
    _m("stack_trace", MapType.STACK_TRACE, 4, 8 * 8, 16),
    _m("perf_events", MapType.PERF_EVENT_ARRAY, 4, 4, NCPU),
]


def _pin_reopen_write(bpffs: str, fds: dict[str, int]) -> dict[str, dict[str, str]]:
    """Runs as uid 65534 without capabilities."""
    out = {}
    for name, fd in fds.items():
        path = f"{bpffs}/{name}"
        obj_pin(fd, path)
        again = obj_get(path, 0)
        try:
            out[name] = write_attempts(again, bpfsys.map_info(again))
        finally:
            os.close(again)
    return out


def test_loader_read_only_maps_refuse_writes_through_a_reopened_pin(bpffs: Path) -> None:
    control = _m("control", MapType.HASH, 4, 8, 4)  # not made read-only
    maps = [*FREEZABLE, control]
    spec = _spec(maps)
    shapes = [dataclasses.astuple(m) for m in maps]
    with load(spec, programs=[], read_only=[m.real_name for m in FREEZABLE]) as obj:
        assert [dataclasses.astuple(m) for m in maps] == shapes  # the spec is untouched
        fds = {name: m.fileno() for name, m in obj.maps.items()}
        out = run_unprivileged(_pin_reopen_write, str(bpffs), fds)
    assert out["control"]["insert"] == "ok"  # the attack itself works
    for m in FREEZABLE:
        assert set(out[m.real_name].values()) <= {"EPERM", "no keys"}, (m.real_name, out)
        assert out[m.real_name]["insert"] == "EPERM", m.real_name


def test_loader_refuses_to_freeze_a_ring_buffer() -> None:
    ring = _m("ring", MapType.RINGBUF, 0, 0, 4096)
    with pytest.raises(LoadError, match="ring buffer cannot be frozen"):
        load(_spec([ring]), programs=[], read_only=["ring"])
    with pytest.raises(LoadError, match="no map 'nope'"):
        load(_spec([ring]), programs=[], read_only=["nope"])


# ---------------------------------------------------------------- finding 2


def test_retaining_map_fds_is_bounded_by_the_map_budget() -> None:
    # A short window: only the live limit (maps the kernel still holds) can stop
    # her; a budget of bytes per window (before issue #26 item 11) let her go on.
    policy = policy_for(
        {
            "execsnoop": {"users": [MALLORY], "scope": ["self"]},
            "syscount": {"users": [MALLORY, BOB], "scope": ["system"]},
        },
        limits={"map_bytes_per_user": BUDGET, "map_bytes_window_seconds": 1},
    )
    broker = start_broker(policy)
    bob = her = None
    try:
        out = mallory(broker, "retain", "12", "0.5")
        assert out["refusal"] is not None, f"12 attaches allowed, {out['held_memlock']} bytes held"
        assert 1 <= out["allowed"] < 12
        assert out["held_fds"] == out["allowed"]
        # What the kernel keeps for her stays within the budget.
        assert 0 < out["held_memlock"] <= BUDGET, out
        refusal = out["refusal"]
        assert refusal["code"] == "ERROR_RESOURCE_EXHAUSTED"
        assert refusal["rule"].endswith(f"[limits] map_bytes_per_user = {BUDGET}")
        assert "close the map fds you kept" in refusal["message"], refusal
        assert "execsnoop" in refusal["message"]
        denied = [
            r
            for r in broker.audit_records()
            if r["op"] == "attach" and r["result"] == "denied" and "map_bytes" in r.get("rule", "")
        ]
        assert len(denied) == 1 and denied[0]["code"] == "ERROR_RESOURCE_EXHAUSTED"
        charged = [
            r["map_bytes"]
            for r in broker.audit_records()
            if r["op"] == "attach" and r["result"] == "ok"
        ]
        assert len(charged) == out["allowed"] and sum(charged) <= BUDGET

        # Joining a live instance allocates nothing, so it costs nothing (fd
        # clients share with their own uid only).
        bob = Client(broker, BOB)
        bob.ok("attach", name="syscount", scope="system")
        her = Client(broker, BOB)
        assert her.ok("attach", name="syscount", scope="system")["shared"] is True
    finally:
        for s in (bob, her):
            if s is not None:
                s.close()
        broker.stop()


def test_a_tight_create_and_drop_loop_meets_the_churn_allowance() -> None:
    """Without keeping anything alive, creating maps in a loop is still bounded."""
    churn = 4 << 20
    policy = policy_for(
        {"execsnoop": {"users": [MALLORY], "scope": ["self"]}},
        # Live room for a few instances: the kernel frees a detached one's maps
        # a moment later (RCU), and this loop does not wait.
        limits={"map_bytes_per_user": 4 * churn, "map_churn_bytes_per_user": churn},
    )
    broker = start_broker(policy)
    try:
        out = mallory(broker, "churn", "60")
        assert out["refusal"] is not None, f"60 attaches allowed: {out}"
        assert out["held_fds"] == 0 and 4 <= out["allowed"] < 60, out
        refusal = out["refusal"]
        assert refusal["code"] == "ERROR_RESOURCE_EXHAUSTED"
        assert refusal["rule"].endswith(f"[limits] map_churn_bytes_per_user = {churn}")
        assert "Retry in" in refusal["message"], refusal
    finally:
        broker.stop()


def _memlock(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("memlock:"))


def _catalog_visible_maps() -> list[MapSpec]:
    out = []
    for p in load_catalog().programs:
        spec = ObjectSpec.from_file(str(p.directory / p.object))
        out += [spec.maps[m.name] for m in p.visible_maps]
    return out


@pytest.mark.parametrize("fill", [False, True], ids=["empty", "full"])
def test_map_bytes_covers_what_the_kernel_accounts(fill: bool) -> None:
    shapes = [
        *_catalog_visible_maps(),
        *FREEZABLE,
        _m("ring_small", MapType.RINGBUF, 0, 0, PAGE),
        _m("ring_big", MapType.RINGBUF, 0, 0, 1 << 20),
    ]
    for m in shapes:
        fd = bpfsys.map_create(m.map_type, m.key_size, m.value_size, m.max_entries, m.flags)
        try:
            hashes = (MapType.HASH, MapType.PERCPU_HASH, MapType.LRU_HASH)
            if fill and m.map_type in hashes:  # a non-preallocated hash grows with its entries
                vsize = ((m.value_size + 7) & ~7) * (NCPU if m.map_type == 5 else 1)
                for i in range(m.max_entries):
                    key = i.to_bytes(4, "little").ljust(m.key_size, b"\0")
                    bpfsys.map_update_elem(fd, key, b"\0" * vsize)
            kernel = _memlock(fd)
        finally:
            os.close(fd)
        est = map_bytes(m.map_type, m.key_size, m.value_size, m.max_entries, m.flags, NCPU)
        assert kernel <= est, (m.real_name, kernel, est)
        if fill or not m.flags & BPF_F_NO_PREALLOC:  # an empty one may still grow
            assert est <= 2 * kernel + 2 * PAGE, (m.real_name, kernel, est)
