"""The gRPC listener against a real broker (user gfxbpf, CAP_BPF + CAP_PERFMON only).

Clients run as gfxtest-alice through the project venv: they get a token on
the Unix control socket (raw framing, no gfxbpf.client), then talk gRPC with
a small raw stub. What is checked:
- Hello over gRPC reports the token's uid (pid 0);
- syscount (scope self): gRPC ReadMap and the passed map fd give the same
  counts at one moment (an exact getppid count), and the two attachments
  share one kernel program;
- execsnoop: gRPC StreamEvents delivers the same exec records (pid,
  filename) as the passed ring-buffer fd, for the same execs;
- nothing read over gRPC looks like a kernel address;
- a token outlives its session; an expired lease detaches (program gone
  from bpftool); a bad or missing token is UNAUTHENTICATED;
- mTLS: a client certificate mapped by [[tls_client]] acts as alice; one
  signed by another CA is refused.
"""

from __future__ import annotations

import json
import os
import pwd
import socket
import textwrap
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from gfxbpf.proto import gfxbpf_pb2 as pb
from gfxbpf.proto import gfxbpf_pb2_grpc as pb_grpc
from tests.kernel.brokerenv import (
    ALICE,
    BROKER_USER,
    VENV_PYTHON,
    BrokerProcess,
    bpftool_prog_exists,
    ensure_user,
    policy_for,
    run_as,
    shared_dir,
)

GETPPID_CALLS = 1234

# The client, run as alice. argv: scenario, control socket, gRPC address, [token].
# Prints one JSON object. Deliberately raw (framing + generated stubs only).
CLIENT = textwrap.dedent(
    r'''
    import json, os, socket, struct, subprocess, sys, threading, time
    import grpc
    from gfxbpf.bpf.maps import Map
    from gfxbpf.bpf.ringbuf import RingBuffer
    from gfxbpf.proto import framing, gfxbpf_pb2 as pb, gfxbpf_pb2_grpc as pb_grpc

    scenario, control, grpc_addr = sys.argv[1:4]
    out = {}
    _next_id = [0]

    def unix_connect():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(control)
        return s

    def call(sock, **body):
        _next_id[0] += 1
        framing.send_message(sock, pb.Request(id=_next_id[0], **body))
        resp, fds = framing.recv_message(sock, pb.Response)
        assert resp.id == _next_id[0], (resp.id, _next_id[0])
        if resp.WhichOneof("body") == "error":
            raise SystemExit("unix error: %s" % resp.error)
        return resp, fds

    def token_from(sock):
        resp, _ = call(sock, issue_token=pb.IssueTokenRequest(ttl_seconds=600))
        return resp.issue_token.token

    def stub():
        return pb_grpc.BrokerStub(grpc.insecure_channel(grpc_addr))

    def md(token):
        return [("authorization", "Bearer " + token)]

    def kernel_words(*blobs):
        """8-byte aligned words that look like kernel (direct-map/text) addresses."""
        bad = []
        for b in blobs:
            for i in range(0, len(b) - len(b) % 8, 8):
                (v,) = struct.unpack_from("<Q", b, i)
                if v >= 0xFFFF800000000000:
                    bad.append(hex(v))
        return bad

    def read_grpc(s, token, aid, name):
        entries, cursor, pages = {}, b"", 0
        while True:
            r = s.ReadMap(pb.ReadMapRequest(attachment_id=aid, map=name, max_entries=4,
                                            cursor=cursor), metadata=md(token))
            pages += 1
            for e in r.entries:
                entries[e.key] = b"".join(e.per_cpu) or e.value
            cursor = r.next_cursor
            if not cursor:
                return entries, pages

    def u32(b):
        return struct.unpack("<I", b)[0]

    def u64(b):
        # syscount counts per CPU: one u64 per CPU, summed
        b = b"".join(b) if isinstance(b, list) else b
        return sum(struct.unpack(f"<{len(b) // 8}Q", b))

    if scenario == "syscount":
        sock = unix_connect()
        hello, _ = call(sock, hello=pb.HelloRequest(protocol=1, client_version="test_grpc"))
        out["unix_uid"] = hello.hello.uid
        token = token_from(sock)
        s = stub()
        h = s.Hello(pb.HelloRequest(protocol=1), metadata=md(token))
        out["grpc_hello"] = {"uid": h.uid, "gid": h.gid, "pid": h.pid}
        resp, fds = call(sock, attach=pb.AttachRequest(name="syscount", scope=pb.SCOPE_SELF))
        ua = resp.attach
        fd = fds[ua.maps[0].fd_index]
        ga = s.Attach(pb.AttachRequest(name="syscount", scope=pb.SCOPE_SELF, lease_seconds=60),
                      metadata=md(token))
        out["grpc_shared"] = ga.shared
        out["grpc_fd_indexes"] = [m.fd_index for m in ga.maps] + [p.fd_index for p in ga.programs]
        out["prog_ids"] = [[p.prog_id for p in ua.programs], [p.prog_id for p in ga.programs]]
        out["lease_left"] = ga.lease_expires_unix - time.time()
        for _ in range(GETPPID_CALLS):
            os.getppid()
        # One moment, three reads: fd, gRPC, fd. Counters only grow.
        fmap = Map.from_fd(fd)
        before = {k: u64(v) for k, v in fmap.items()}
        entries, pages = read_grpc(s, token, ga.attachment_id, "counts")
        grpc_counts = {u32(k): u64(v) for k, v in entries.items()}
        after = {k: u64(v) for k, v in fmap.items()}
        before = {u32(k): v for k, v in before.items()}
        after = {u32(k): v for k, v in after.items()}
        out["pages"] = pages
        out["fd_before"] = before
        out["grpc"] = grpc_counts
        out["fd_after"] = after
        out["kernel_words"] = kernel_words(*entries.keys(), *entries.values())
        st = s.Stats(pb.StatsRequest(attachment_id=ga.attachment_id), metadata=md(token))
        out["stats_prog_ids"] = [p.prog_id for p in st.programs]
        d = s.Detach(pb.DetachRequest(attachment_id=ga.attachment_id), metadata=md(token))
        out["grpc_detach_unloaded"] = d.unloaded
    elif scenario == "execsnoop":
        sock = unix_connect()
        token = token_from(sock)
        resp, fds = call(sock, attach=pb.AttachRequest(name="execsnoop", scope=pb.SCOPE_SELF))
        ua = resp.attach
        ring = RingBuffer(fds[ua.maps[0].fd_index])
        s = stub()
        ga = s.Attach(pb.AttachRequest(name="execsnoop", scope=pb.SCOPE_SELF),
                      metadata=md(token))
        out["grpc_shared"] = ga.shared
        out["prog_ids"] = [[p.prog_id for p in ua.programs], [p.prog_id for p in ga.programs]]
        pids = []
        for argv in (["/bin/true"], ["/bin/echo", "gfx"], ["/usr/bin/env", "/bin/true"]):
            p = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
            p.wait()
            pids.append(p.pid)
        out["pids"] = pids

        def parse(rec):
            pid, tgid, uid, gid, comm, fn = struct.unpack_from("<IIII16s256s", rec)
            return [pid, tgid, uid, fn.split(b"\0")[0].decode(), comm.split(b"\0")[0].decode()]

        fd_events = []
        deadline = time.time() + 10
        while time.time() < deadline:
            fd_events += [parse(r) for r in ring.poll(0.2)]
            if set(pids) <= {e[0] for e in fd_events} and len(fd_events) >= 4:
                break
        grpc_events, seqs, raw, lost = [], [], [], 0
        call_ = s.StreamEvents(pb.StreamEventsRequest(attachment_id=ga.attachment_id),
                               metadata=md(token), timeout=15)
        try:
            for batch in call_:
                lost = batch.lost
                for e in batch.events:
                    seqs.append(e.seq)
                    raw.append(e.data)
                    grpc_events.append(parse(e.data))
                if len(grpc_events) >= len(fd_events):
                    break
        finally:
            call_.cancel()
        out["fd_events"] = fd_events
        out["grpc_events"] = grpc_events
        out["seqs"] = seqs
        out["lost"] = lost
        out["kernel_words"] = kernel_words(*raw)
    elif scenario == "lease":
        sock = unix_connect()
        token = token_from(sock)
        sock.close()  # the token outlives its session
        s = stub()
        ga = s.Attach(pb.AttachRequest(name="clonecount", scope=pb.SCOPE_SELF, lease_seconds=2),
                      metadata=md(token))
        out["token"] = token
        out["attachment_id"] = ga.attachment_id
        out["prog_ids"] = [p.prog_id for p in ga.programs]
        out["lease_left"] = ga.lease_expires_unix - time.time()
    elif scenario == "after_lease":
        token, aid = sys.argv[4], int(sys.argv[5])
        s = stub()
        out["hello_uid"] = s.Hello(pb.HelloRequest(), metadata=md(token)).uid
        try:
            s.ReadMap(pb.ReadMapRequest(attachment_id=aid), metadata=md(token))
            out["read"] = "ok"
        except grpc.RpcError as e:
            out["read"] = e.code().name
    elif scenario == "badtoken":
        s = stub()
        for name, metadata in (("none", None), ("bad", md("x" * 43)),
                               ("basic", [("authorization", "Basic Zm9vOmJhcg==")])):
            try:
                s.Hello(pb.HelloRequest(), metadata=metadata)
                out[name] = ["OK", ""]
            except grpc.RpcError as e:
                out[name] = [e.code().name, e.details()]
        try:
            s.Attach(pb.AttachRequest(name="syscount"), metadata=md("y" * 43))
            out["attach"] = "OK"
        except grpc.RpcError as e:
            out["attach"] = e.code().name
    print(json.dumps(out))
    '''
).replace("GETPPID_CALLS", str(GETPPID_CALLS))


def _policy(extra: str = "") -> str:
    who = {"users": [ALICE], "scope": ["self", "system"]}
    return policy_for(
        {"syscount": who, "execsnoop": who, "clonecount": who},
        limits={"lease_seconds": 60},
        extra=extra,
    )


@pytest.fixture(scope="module")
def env() -> Any:
    base = shared_dir(None, prefix="gfxbpf-grpc-")
    script = base / "grpc_client.py"
    script.write_text(CLIENT)
    os.chmod(script, 0o644)
    broker = BrokerProcess.start(_policy(), base)
    try:
        yield broker, script
    finally:
        broker.stop()


def run_client(env: Any, scenario: str, *extra: str) -> dict[str, Any]:
    broker, script = env
    r = run_as(
        ALICE,
        [VENV_PYTHON, str(script), scenario, broker.socket, broker.grpc, *extra],
        timeout=90,
    )
    assert r.returncode == 0, f"client {scenario} failed:\n{r.stderr}\nbroker:\n{broker.stderr()}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_broker_runs_unprivileged_and_grpc_socket_is_world_connectable(env: Any) -> None:
    broker, _ = env
    st = broker.status()
    assert int(st["CapEff"], 16) == (1 << 38) | (1 << 39)
    assert st["Uid"].split()[0] == str(pwd.getpwnam(BROKER_USER).pw_uid)
    path = broker.grpc[len("unix:") :]
    assert os.stat(path).st_mode & 0o777 == 0o666


def test_hello_and_syscount_readmap_matches_the_fd(env: Any) -> None:
    alice_uid, alice_gid = ensure_user(ALICE)
    out = run_client(env, "syscount")
    assert out["unix_uid"] == alice_uid
    assert out["grpc_hello"] == {"uid": alice_uid, "gid": alice_gid, "pid": 0}
    # The same kernel instance (scope self, same user): one program, shared.
    assert out["grpc_shared"] is True
    assert out["prog_ids"][0] == out["prog_ids"][1] == out["stats_prog_ids"]
    assert set(out["grpc_fd_indexes"]) == {-1}
    assert 50 < out["lease_left"] <= 61
    before = {int(k): v for k, v in out["fd_before"].items()}
    grpc_counts = {int(k): v for k, v in out["grpc"].items()}
    after = {int(k): v for k, v in out["fd_after"].items()}
    getppid = 110  # x86-64
    assert before[getppid] == grpc_counts[getppid] == after[getppid]
    assert grpc_counts[getppid] >= GETPPID_CALLS
    assert len(grpc_counts) > 4 and out["pages"] > 1  # paged through the cursor
    for k, v in grpc_counts.items():
        assert before.get(k, 0) <= v <= after[k], (k, before.get(k), v, after[k])
    assert out["kernel_words"] == []
    assert out["grpc_detach_unloaded"] is False  # the Unix session still holds it


def test_stream_events_match_the_ring_buffer_fd(env: Any) -> None:
    alice_uid, _ = ensure_user(ALICE)
    out = run_client(env, "execsnoop")
    assert out["grpc_shared"] is False  # a ring buffer is never shared
    assert not set(out["prog_ids"][0]) & set(out["prog_ids"][1])
    pids = set(out["pids"])
    fd_events = [e for e in out["fd_events"] if e[0] in pids]
    grpc_events = [e for e in out["grpc_events"] if e[0] in pids]
    # Same execs, same order, same contents (pid, tgid, uid, filename, comm).
    assert fd_events == grpc_events
    filenames = [e[3] for e in grpc_events]
    assert filenames == ["/bin/true", "/bin/echo", "/usr/bin/env", "/bin/true"]
    assert {e[2] for e in grpc_events} == {alice_uid}
    assert out["seqs"] == list(range(1, len(out["seqs"]) + 1))
    assert out["lost"] == 0
    assert out["kernel_words"] == []


def test_expired_lease_detaches(env: Any) -> None:
    broker, _ = env
    out = run_client(env, "lease")  # the client has exited; its session is closed
    prog_ids = out["prog_ids"]
    assert prog_ids and 0 < out["lease_left"] <= 3
    assert all(bpftool_prog_exists(p) for p in prog_ids), "attachment died with its session"
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline and any(bpftool_prog_exists(p) for p in prog_ids):
        time.sleep(0.2)
    assert not any(bpftool_prog_exists(p) for p in prog_ids), "lease expired, program still loaded"
    after = run_client(env, "after_lease", out["token"], str(out["attachment_id"]))
    assert after["hello_uid"] == ensure_user(ALICE)[0]  # the token still works
    assert after["read"] == "NOT_FOUND"
    expired = [r for r in broker.audit_records() if r.get("op") == "lease_expired"]
    assert any(r.get("attachment_id") == out["attachment_id"] for r in expired)


def test_bad_or_missing_token_is_unauthenticated(env: Any) -> None:
    out = run_client(env, "badtoken")
    for name in ("none", "bad", "basic"):
        code, details = out[name]
        assert code == "UNAUTHENTICATED", (name, code, details)
        assert "IssueToken" in details and "Bearer" in details
    assert out["attach"] == "UNAUTHENTICATED"


# ------------------------------------------------------------------ mTLS


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# long: one mTLS scenario: certificates, listener, mapped and unmapped callers.
def test_mtls_client_certificate_maps_to_alice() -> None:
    from tests import tlscerts  # needs cryptography (a dev dependency)

    alice_uid, alice_gid = ensure_user(ALICE)
    broker_uid, broker_gid = ensure_user(BROKER_USER)
    base = shared_dir(None, prefix="gfxbpf-mtls-")
    ca = tlscerts.make_ca("gfxbpf test CA")
    server = ca.issue("localhost", server=True)
    client = ca.issue("alice-laptop")
    stranger = tlscerts.make_ca("another CA").issue("alice-laptop")
    files: dict[str, Path] = {}
    for name, data in (
        ("server.pem", server.cert_pem),
        ("server.key", server.key_pem),
        ("clients-ca.pem", ca.cert_pem),
    ):
        p = base / name
        p.write_bytes(data)
        os.chown(p, broker_uid, broker_gid)
        os.chmod(p, 0o600)
        files[name] = p
    port = _free_port()
    extra = f'[[tls_client]]\nsubject_cn = "alice-laptop"\nuser = "{ALICE}"\n'
    broker = BrokerProcess.start(
        _policy(extra),
        base,
        grpc=False,
        overrides={
            "--grpc": f"127.0.0.1:{port}",
            "--tls-cert": str(files["server.pem"]),
            "--tls-key": str(files["server.key"]),
            "--tls-client-ca": str(files["clients-ca.pem"]),
        },
    )
    try:

        def stub(who: Any) -> pb_grpc.BrokerStub:
            creds = grpc.ssl_channel_credentials(
                root_certificates=ca.cert_pem,
                private_key=who.key_pem,
                certificate_chain=who.cert_pem,
            )
            return pb_grpc.BrokerStub(grpc.secure_channel(f"127.0.0.1:{port}", creds))

        deadline = time.monotonic() + 10
        while True:  # READY=1 may precede the TCP listener by a moment
            try:
                hello = stub(client).Hello(pb.HelloRequest(protocol=1), timeout=5)
                break
            except grpc.RpcError as e:
                if time.monotonic() > deadline or e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                time.sleep(0.2)
        assert (hello.uid, hello.gid, hello.pid) == (alice_uid, alice_gid, 0)
        names = {p.name for p in stub(client).ListPrograms(pb.ListProgramsRequest()).programs}
        assert names == {"syscount", "execsnoop", "clonecount"}
        with pytest.raises(grpc.RpcError) as e:
            stub(stranger).Hello(pb.HelloRequest(), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE  # the handshake refuses it
        hellos = [r for r in broker.audit_records() if r.get("op") == "hello"]
        assert hellos and all(r["uid"] == alice_uid for r in hellos)
    finally:
        broker.stop()
