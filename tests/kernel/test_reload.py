"""SIGHUP re-reads the policy (issue #16, finding 8), against the broker as deployed.

`systemctl reload gfxbpf` sends SIGHUP (ExecReload= in deploy/gfxbpf.service).
The broker (user gfxbpf, CAP_BPF + CAP_PERFMON, as the unit runs it) must:
keep serving with the old policy when the new file is broken or unreadable
(and say so in the audit log), apply a good one to new requests, and detach
existing attachments it no longer allows (test_revocation.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.kernel.brokerenv import (
    ALICE,
    BOB,
    BrokerProcess,
    Client,
    policy_for,
)


def _policy(users: list[str], **limits: int) -> str:
    return policy_for(
        {"syscount": {"users": users, "scope": ["self", "system"]}},
        limits={"sessions_per_user": 4, **limits},
    )


def _may_use(broker: BrokerProcess, user: str) -> bool:
    """A new session of user: does ListPrograms offer syscount?"""
    c = Client(broker, user)
    try:
        r = c("list")
        assert r["ok"], r
        return "syscount" in r["programs"]
    finally:
        c.close()


def test_reload_keeps_the_old_policy_on_error_and_applies_a_good_one() -> None:
    with BrokerProcess.start(_policy([ALICE])) as broker:
        alice = Client(broker, ALICE)
        try:
            att = alice("attach", name="syscount", scope="self")
            assert att["ok"], att
            assert _may_use(broker, ALICE) and not _may_use(broker, BOB)

            # 1. A broken file (TOML syntax): refused, audited, the old policy stays.
            rec = broker.reload("[[program]\nname = \n")
            assert rec["result"] == "error", rec
            assert "NOT reloaded" in rec["detail"] and rec["problems"], rec
            assert "TOML" in rec["problems"][0], rec
            assert broker.alive()
            assert _may_use(broker, ALICE) and not _may_use(broker, BOB)

            # 2. Valid TOML, invalid policy: every problem listed, nothing applied.
            bad = _policy([BOB]).replace("sessions_per_user = 4", "sessions_per_user = -1")
            bad += '[[program]]\nname = "nosuchfield"\nsha256 = "zz"\n'
            rec = broker.reload(bad)
            assert rec["result"] == "error", rec
            assert any("sessions_per_user" in p for p in rec["problems"]), rec
            assert len(rec["problems"]) >= 2, rec
            assert _may_use(broker, ALICE) and not _may_use(broker, BOB)

            # 3. A file the broker (user gfxbpf) cannot read: the same.
            good = _policy([BOB], audit_lines_per_second=50)
            Path(broker.policy_path).write_text(good)
            os.chmod(broker.policy_path, 0o600)  # root only
            rec = broker.reload()
            assert rec["result"] == "error" and "cannot read" in rec["problems"][0], rec
            assert _may_use(broker, ALICE) and not _may_use(broker, BOB)

            # 4. A good policy: new requests follow it, existing attachments stay.
            rec = broker.reload(good)
            assert rec["result"] == "ok", rec
            assert "1 entries" in rec["detail"], rec
            assert _may_use(broker, BOB) and not _may_use(broker, ALICE)
            bob = Client(broker, BOB)
            try:
                r = bob("attach", name="syscount", scope="self")
                assert r["ok"], r
            finally:
                bob.close()
            # alice's attachment from before the reload was revoked (issue #26)...
            assert rec["revoked_attachments"] == [att["id"]], rec
            r = alice("stats", id=att["id"])
            assert not r["ok"] and r["code"] == "ERROR_PERMISSION_DENIED", r
            # ...and a new attach on her old session is decided by the new policy.
            r = alice("attach", name="syscount", scope="self")
            assert not r["ok"] and r["code"] == "ERROR_PERMISSION_DENIED", r
            assert broker.alive()
        finally:
            alice.close()
        ops = [r["op"] for r in broker.audit_records()]
        assert ops.count("reload") == 4, ops
        assert broker.stop() == 0, broker.stderr()
