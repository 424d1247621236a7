"""The broker's memory stays bounded across 1,000 attach/detach cycles of a CO-RE program.

execsnoop's tp_btf build is CO-RE against the kernel's BTF and attaches by
BTF id: each cycle is a fresh load (nobody else holds the instance) that
relocates against vmlinux BTF, then a detach that unloads it. The broker
runs as gfxbpf with only CAP_BPF+CAP_PERFMON, the client as an ordinary
user. After a warm-up (the first CO-RE load reads and indexes vmlinux BTF
once), its RSS is sampled every 100 cycles: what it holds must not grow
with the number of cycles (issue #25: kernel BTF is held compactly and its
decoded types are bounded), and no fd may be left behind.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kernel.brokerenv import ALICE, BrokerProcess, Client, policy_for

WARMUP = 50
CYCLES = 1000
STEP = 100
# A leak of 4 KiB a cycle is 4 MiB over the run; allocator noise is far less.
MAX_GROWTH_KIB = 4096


def _rss_kib(broker: BrokerProcess) -> int:
    return int(broker.status()["VmRSS"].split()[0])


@pytest.fixture(scope="module")
def broker() -> Iterator[BrokerProcess]:
    # Each cycle creates execsnoop's maps anew: lift the per-user map budget
    # and the audit rate, which would otherwise refuse or summarise the cycles.
    limits = {"map_bytes_per_user": 2**31 - 1, "audit_lines_per_second": 1_000_000}
    policy = policy_for({"execsnoop": {"users": [ALICE], "scope": ["self"]}}, limits)
    b = BrokerProcess.start(policy)
    try:
        yield b
    finally:
        b.stop()


def test_core_attach_detach_cycles_keep_memory_bounded(broker: BrokerProcess) -> None:
    alice = Client(broker, ALICE)
    try:
        first = alice.ok("attach", name="execsnoop", scope="self")
        assert not first["shared"]
        alice.ok("detach", id=first["id"])
        assert alice.ok("cycles", name="execsnoop", scope="self", n=WARMUP)["unloaded"] == WARMUP
        base_rss, base_fds = _rss_kib(broker), broker.fd_count()
        samples = []
        for _ in range(CYCLES // STEP):
            r = alice.ok("cycles", name="execsnoop", scope="self", n=STEP)
            assert r["unloaded"] == STEP  # every cycle loaded and unloaded its own instance
            samples.append(_rss_kib(broker))
        fds = broker.fd_count()
    finally:
        alice.close()
    growth = max(samples) - base_rss
    print(f"\nbroker RSS after warm-up {base_rss} KiB; every {STEP} cycles: {samples}")
    assert growth <= MAX_GROWTH_KIB, f"RSS grew {growth} KiB over {CYCLES} cycles: {samples}"
    assert fds == base_fds, f"fds: {base_fds} after warm-up, {fds} after {CYCLES} cycles"
