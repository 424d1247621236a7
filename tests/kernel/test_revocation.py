"""A policy reload revokes what it no longer allows (issue #26, item 3).

Against the broker as deployed (user gfxbpf, CAP_BPF + CAP_PERFMON), with
clients as ordinary users:

- Unix: alice keeps the map fd of a system-scope syscount after detaching,
  while another session of hers keeps her instance attached, and bob (as an
  exporter would) keeps a system-scope instance attached throughout. The
  administrator removes her and reloads: within a few seconds the counter
  read through her fd stops changing; bob's keeps counting.
- gRPC: alice's ReadMap is refused after the reload that removed her from
  the program, and her token stops working once the policy lets her run
  nothing at all.

On main (before the fix) alice's fd joined bob's instance and kept reading
live system-wide data, and her gRPC reads kept succeeding.
"""

from __future__ import annotations

import json
import os
import textwrap
import time
from typing import Any

from tests.kernel.brokerenv import (
    ALICE,
    BOB,
    VENV_PYTHON,
    BrokerProcess,
    Client,
    ensure_user,
    policy_for,
    run_as,
    shared_dir,
)


def _policy(syscount: list[str], clonecount: list[str] | None = None) -> str:
    programs: dict[str, Any] = {"syscount": {"users": syscount, "scope": ["self", "system"]}}
    if clonecount:
        programs["clonecount"] = {"users": clonecount, "scope": ["self"]}
    return policy_for(programs, limits={"sessions_per_user": 4, "lease_seconds": 600})


def _total(entries: dict[str, str]) -> int:
    """Sum of every per-CPU u64 count in a syscount dump (hex values)."""
    total = 0
    for value in entries.values():
        raw = bytes.fromhex(value)
        total += sum(int.from_bytes(raw[i : i + 8], "little") for i in range(0, len(raw), 8))
    return total


def _reading(client: Client, att_id: int) -> int:
    client.ok("getppid", n=500)  # activity the system-wide count sees
    time.sleep(0.2)
    return _total(client.ok("read_fd", id=att_id)["entries"])


def _changes(client: Client, att_id: int) -> bool:
    return _reading(client, att_id) != _reading(client, att_id)


def _stops_changing(client: Client, att_id: int, within: float) -> float | None:
    """Seconds until three readings in a row (with activity between them) are
    equal, or None if the counter still changes after `within` seconds."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < within:
        a, b, c = (_reading(client, att_id) for _ in range(3))
        if a == b == c:
            return time.monotonic() - t0
    return None


def test_a_revoked_user_reads_no_new_data_through_a_kept_fd() -> None:
    with BrokerProcess.start(_policy([ALICE, BOB])) as broker:
        bob, holder, alice = Client(broker, BOB), Client(broker, ALICE), Client(broker, ALICE)
        try:
            b = bob.ok("attach", name="syscount", scope="system")  # attached throughout
            held = holder.ok("attach", name="syscount", scope="system")
            a = alice.ok("attach", name="syscount", scope="system")
            alice.ok("detach", id=a["id"], keep_fds=True)
            # Her other session keeps her instance attached: the fd is live.
            assert _changes(alice, a["id"])

            rec = broker.reload(_policy([BOB]))
            assert rec["result"] == "ok", rec
            took = _stops_changing(alice, a["id"], within=5.0)
            assert took is not None, "a revoked user's fd still reads live data"
            assert rec["revoked_attachments"] == [held["id"]], rec
            # Still frozen a while later, with activity in between...
            still = _reading(alice, a["id"])
            time.sleep(1.0)
            assert _reading(alice, a["id"]) == still
            # ...while bob, still allowed, keeps counting.
            assert _changes(bob, b["id"])
            r = holder("stats", id=held["id"])
            assert not r["ok"] and r["code"] == "ERROR_PERMISSION_DENIED", r
            assert "no longer allows" in r["message"], r
            revoked = [x for x in broker.audit_records() if x["op"] == "revoke"]
            alice_uid = ensure_user(ALICE)[0]
            assert [(x["uid"], x["attachment_id"]) for x in revoked] == [(alice_uid, held["id"])]
        finally:
            for c in (bob, holder, alice):
                c.close()


# Run as alice: "attach" gets a token and attaches syscount over gRPC; "read"
# tries ReadMap and Hello with that token. Prints one JSON object.
GRPC_CLIENT = textwrap.dedent(
    r"""
    import json, socket, sys
    import grpc
    from gfxbpf.proto import framing, gfxbpf_pb2 as pb, gfxbpf_pb2_grpc as pb_grpc

    mode, control, addr = sys.argv[1:4]
    stub = pb_grpc.BrokerStub(grpc.insecure_channel(addr))
    out = {}

    def md(token):
        return [("authorization", "Bearer " + token)]

    def attempt(name, fn):
        try:
            fn()
            out[name] = ["OK", ""]
        except grpc.RpcError as e:
            out[name] = [e.code().name, e.details()]

    if mode == "attach":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(control)
        framing.send_message(s, pb.Request(id=1, issue_token=pb.IssueTokenRequest()))
        resp, _ = framing.recv_message(s, pb.Response)
        token = out["token"] = resp.issue_token.token
        a = stub.Attach(pb.AttachRequest(name="syscount", scope=pb.SCOPE_SYSTEM,
                                         lease_seconds=600), metadata=md(token))
        out["id"] = a.attachment_id
    else:
        token, aid = sys.argv[4], int(sys.argv[5])
    attempt("read", lambda: stub.ReadMap(pb.ReadMapRequest(attachment_id=out.get("id") or aid),
                                         metadata=md(token)))
    attempt("hello", lambda: stub.Hello(pb.HelloRequest(), metadata=md(token)))
    print(json.dumps(out))
    """
)


def _grpc(broker: BrokerProcess, script: str, *args: str) -> dict[str, Any]:
    assert broker.grpc is not None
    r = run_as(ALICE, [VENV_PYTHON, script, args[0], broker.socket, broker.grpc, *args[1:]])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_revoked_users_grpc_reads_and_tokens_end_at_the_reload() -> None:
    base = shared_dir(None, prefix="gfxbpf-revoke-")
    script = base / "grpc_revoke.py"
    script.write_text(GRPC_CLIENT)
    os.chmod(script, 0o644)
    with BrokerProcess.start(_policy([ALICE, BOB], clonecount=[ALICE]), base) as broker:
        first = _grpc(broker, str(script), "attach")
        assert first["read"] == ["OK", ""] and first["hello"] == ["OK", ""], first
        token, aid = first["token"], str(first["id"])
        # Removed from syscount, still allowed clonecount: her token works, the read does not.
        assert broker.reload(_policy([BOB], clonecount=[ALICE]))["result"] == "ok"
        after = _grpc(broker, str(script), "read", token, aid)
        assert after["hello"] == ["OK", ""], after
        # Detached at the reload; her idle gRPC owner went with its last lease,
        # so the attachment is simply gone.
        assert after["read"][0] in ("PERMISSION_DENIED", "NOT_FOUND"), after
        # Removed from every program: the token itself is dropped.
        rec = broker.reload(_policy([BOB]))
        assert rec["revoked_token_uids"] == [ensure_user(ALICE)[0]], rec
        gone = _grpc(broker, str(script), "read", token, aid)
        assert gone["hello"][0] == gone["read"][0] == "UNAUTHENTICATED", gone


def _knobs_policy(stack_cap: int, min_block: int | None, frequency_cap: int) -> str:
    offcpu: dict[str, Any] = {"users": [ALICE], "scope": "self"}
    if min_block is not None:
        offcpu["min_block_us"] = min_block
    return policy_for(
        {
            "stackcopy": {
                "users": [ALICE],
                "scope": "self",
                "max_stack_bytes": stack_cap,
                "max_frequency": frequency_cap,
            },
            "offcpu": offcpu,
        },
        limits={"map_bytes_per_user": 1 << 30},
    )


def test_a_reload_that_narrows_a_knob_revokes() -> None:
    """Issue 35 item 6: lowering max_stack_bytes or max_frequency, or raising
    min_block_us, revokes the attachments that asked for more (on main only
    program, scope, library, functions and frequency counted: 16 KiB copies
    and sub-millisecond waits kept arriving)."""
    with BrokerProcess.start(_knobs_policy(16384, None, 999), grpc=False) as broker:
        alice = Client(broker, ALICE)
        try:
            big = alice.ok("attach", name="stackcopy", scope="self", stack_bytes=16384)
            small = alice.ok("attach", name="stackcopy", scope="self", stack_bytes=1024)
            short = alice.ok("attach", name="offcpu", scope="self", min_block_us=200)
            # No size named: the policy's max_stack_bytes, 16 KiB, is what it copies.
            default = alice.ok("attach", name="stackcopy", scope="self", frequency=49)
            rec = broker.reload(_knobs_policy(16384, None, 999))
            assert rec["result"] == "ok" and rec["revoked_attachments"] == [], rec
            rec = broker.reload(_knobs_policy(1024, 1000, 999))
            assert rec["result"] == "ok", rec
            want = [big["id"], short["id"], default["id"]]
            assert sorted(rec["revoked_attachments"]) == sorted(want), rec
            r = alice("stats", id=big["id"])
            assert not r["ok"] and "no longer allows" in r["message"], r
            assert alice("stats", id=small["id"])["ok"]  # within the new cap: kept
            fast = alice.ok("attach", name="stackcopy", scope="self", frequency=99)
            rec = broker.reload(_knobs_policy(1024, 1000, 49))
            assert sorted(rec["revoked_attachments"]) == sorted([small["id"], fast["id"]]), rec
        finally:
            alice.close()
