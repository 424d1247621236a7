"""Hosts that let any user load BPF (issue #26, item 4).

With kernel.unprivileged_bpf_disabled = 0 an ordinary user may load a socket
filter, and its code may bpf_map_update_elem() any map whose fd the user
holds, frozen or not (freezing stops bpf(2) writes only). mallory does that
to the syscount map the broker passed her (progwrite.py); bob, who watches
the same program in system scope (as the exporter would), must never see
her forged count, through his fd or through ReadMap. The broker passes each
user fds of that user's own instances only, and says in its audit log that
the host allows unprivileged BPF.

On main (before the fix) mallory's attach joined bob's instance, and her
forged count showed up in his dump.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

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

SYSCTL = Path("/proc/sys/kernel/unprivileged_bpf_disabled")
SLOT = 1023  # no syscall has this number: its count stays 0 unless forged
FORGED = 999_999


@contextlib.contextmanager
def unprivileged_bpf_allowed() -> Iterator[None]:
    """kernel.unprivileged_bpf_disabled = 0 for the block, restored after."""
    old = SYSCTL.read_text().strip()
    if old == "1":  # 1 cannot be undone without a reboot: the attack is impossible here
        pytest.skip("kernel.unprivileged_bpf_disabled is 1 (sticky): no user can load BPF")
    SYSCTL.write_text("0")
    try:
        yield
    finally:
        SYSCTL.write_text(old)


def _slot(entries: dict[str, str]) -> int:
    raw = bytes.fromhex(entries.get(SLOT.to_bytes(4, "little").hex(), ""))
    return sum(int.from_bytes(raw[i : i + 8], "little") for i in range(0, len(raw), 8))


def test_a_users_own_bpf_program_cannot_forge_what_others_read() -> None:
    policy = policy_for({"syscount": {"users": [MALLORY, BOB], "scope": ["system"]}})
    with BrokerProcess.start(policy) as broker:
        script = broker.install(Path(__file__).with_name("progwrite.py"))
        broker.install(RAWCLIENT)
        bob = Client(broker, BOB)
        try:
            b = bob.ok("attach", name="syscount", scope="system")
            argv = [VENV_PYTHON, str(script), broker.socket, "syscount", "system", "counts"]
            with unprivileged_bpf_allowed():  # only while her attack runs: the kernel is shared
                r = run_as(MALLORY, [*argv, str(SLOT), str(FORGED)], timeout=60)
            assert r.returncode == 0, r.stderr
            out = json.loads(r.stdout.strip().splitlines()[-1])
            # The attack itself works: her program wrote her map...
            assert out["unprivileged_bpf_disabled"] == "0" and out["load"] == "ok", out
            assert out["own_view"] == FORGED, out
            # ...which is hers alone: bob reads no forged count, by fd or by ReadMap.
            assert _slot(bob.ok("read_fd", id=b["id"])["entries"]) == 0
            assert _slot(bob.ok("read_rpc", id=b["id"], map="counts")["entries"]) == 0
            assert out["shared"] is False, out
            # Her attach line says the fds went out on a host that allows unprivileged BPF.
            hers = [
                x
                for x in broker.audit_records()
                if x["op"] == "attach"
                and x["result"] == "ok"
                and x.get("attachment_id") == out["id"]
            ]
            assert hers and hers[0].get("unprivileged_bpf") == "allowed", hers
        finally:
            bob.close()
