"""The gRPC adapter against a stand-in Service: auth, errors, leases, streams, mTLS."""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from gfxbpf.broker.grpc_server import (
    META_CODE,
    META_ERROR,
    META_RULE,
    TlsConfig,
    start_grpc_server,
)
from gfxbpf.broker.policy import Policy
from gfxbpf.broker.service import BrokerError, Caller
from gfxbpf.broker.tokens import TokenStore
from gfxbpf.proto import gfxbpf_pb2 as pb
from gfxbpf.proto import gfxbpf_pb2_grpc as pb_grpc

ALICE = Caller(uid=1001, gid=1001, gids=(1001, 44), pid=777, transport="unix")


class FakeOwner:
    def __init__(self, caller: Caller) -> None:
        self.caller = caller
        self.closed = False
        self.attachments: set[int] = set()


class FakeService:
    """Just enough of broker.service.Service to drive the adapter."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.tokens: Any = None
        self.audit = self
        self.denials: list[dict[str, Any]] = []
        self.owners: list[FakeOwner] = []
        self.next_id = 100
        self.closed_fds: list[int] = []
        self.events: list[bytes] = []
        self.stream_polls = 0

    # audit
    def denied(self, op: str, **kw: Any) -> None:
        self.denials.append({"op": op, **kw})

    def ok(self, op: str, **kw: Any) -> None:
        pass

    def open_owner(self, caller: Caller) -> FakeOwner:
        o = FakeOwner(caller)
        self.owners.append(o)
        return o

    def close_owner(self, owner: FakeOwner) -> None:
        owner.attachments.clear()
        owner.closed = True

    def hello(self, caller: Caller, req: pb.HelloRequest) -> pb.HelloReply:
        return pb.HelloReply(protocol=1, uid=caller.uid, gid=caller.gid, pid=caller.pid)

    def list_programs(self, caller: Caller, req: Any) -> pb.ListProgramsReply:
        raise BrokerError(
            pb.ERROR_PERMISSION_DENIED,
            "no programs for you",
            'policy.toml [[program]] #1 "syscount": users = ["bob"] – not ü',
        )

    def attach(self, caller: Caller, owner: FakeOwner, req: pb.AttachRequest) -> Any:
        if req.name == "boom":
            raise RuntimeError("kaput")
        self.next_id += 1
        owner.attachments.add(self.next_id)
        r, w = os.pipe()  # a transport bug: fds must never reach a gRPC caller
        reply = pb.AttachReply(attachment_id=self.next_id, program=req.name)
        reply.maps.add(name="counts", fd_index=0)
        reply.programs.add(name="p", fd_index=1)
        return reply, [r, w]

    def _own(self, owner: FakeOwner, aid: int) -> None:
        if aid not in owner.attachments:
            raise BrokerError(pb.ERROR_NOT_FOUND, f"no attachment {aid} in this session")

    def detach(self, caller: Caller, owner: FakeOwner, req: pb.DetachRequest) -> pb.DetachReply:
        self._own(owner, req.attachment_id)
        owner.attachments.discard(req.attachment_id)
        return pb.DetachReply(unloaded=True)

    def read_map(self, caller: Caller, owner: FakeOwner, req: pb.ReadMapRequest) -> Any:
        self._own(owner, req.attachment_id)
        return pb.ReadMapReply(entries=[pb.MapEntry(key=b"\x01", value=b"\x02")])

    def stats(self, caller: Caller, owner: FakeOwner, req: pb.StatsRequest) -> pb.StatsReply:
        return pb.StatsReply(stats_enabled=True)

    def stream_events(
        self, caller: Caller, owner: FakeOwner, req: Any, cancelled: Callable[[], bool]
    ) -> Iterator[pb.EventBatch]:
        self._own(owner, req.attachment_id)
        seq = 0
        for data in self.events:
            seq += 1
            yield pb.EventBatch(events=[pb.Event(seq=seq, data=data)])
        if req.max_events:
            yield pb.EventBatch(end=True)
            return
        while not cancelled():  # wait for records until the client goes
            self.stream_polls += 1
            time.sleep(0.02)


POLICY = """
[limits]
lease_seconds = 2
"""


@pytest.fixture
def broker(tmp_path: Any) -> Iterator[tuple[FakeService, Any, str]]:
    svc = FakeService(Policy.parse(POLICY))
    path = tmp_path / "grpc.sock"
    old = os.umask(0o077)  # as the unit runs it
    try:
        handle = start_grpc_server(svc, f"unix:{path}", reap_interval=0.05)
    finally:
        os.umask(old)
    try:
        yield svc, handle, f"unix:{path}"
    finally:
        handle.stop(0)


def stub(address: str, **kw: Any) -> pb_grpc.BrokerStub:
    return pb_grpc.BrokerStub(grpc.insecure_channel(address, **kw))


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def test_listener_socket_is_0666_and_tokens_are_installed(broker: Any) -> None:
    svc, handle, address = broker
    path = address[len("unix:") :]
    assert stat.S_ISSOCK(os.stat(path).st_mode)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666
    assert isinstance(svc.tokens, TokenStore) and svc.tokens is handle.tokens
    handle.stop(0)
    assert not os.path.exists(path)
    assert svc.tokens is None


def test_token_authenticates_as_the_issuing_uid(broker: Any) -> None:
    svc, handle, address = broker
    token, _ = svc.tokens.issue(ALICE, 60)
    reply = stub(address).Hello(pb.HelloRequest(protocol=1), metadata=bearer(token))
    assert (reply.uid, reply.gid, reply.pid) == (1001, 1001, 0)


@pytest.mark.parametrize(
    "metadata",
    [None, [("authorization", "Bearer nope")], [("authorization", "Basic abc")]],
)
def test_unauthenticated_says_how_to_get_a_token(broker: Any, metadata: Any) -> None:
    svc, _, address = broker
    with pytest.raises(grpc.RpcError) as e:
        stub(address).Hello(pb.HelloRequest(), metadata=metadata)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "IssueToken" in e.value.details()
    assert "authorization: Bearer <token>" in e.value.details()
    md = dict(e.value.trailing_metadata())
    assert md[META_CODE] == "ERROR_UNAUTHENTICATED"
    assert svc.denials and svc.denials[-1]["op"] == "grpc_auth"


def test_expired_token_is_refused(broker: Any) -> None:
    svc, _, address = broker
    svc.tokens = None  # keep the handle's store
    store = broker[1].tokens
    token, _ = store.issue(ALICE, 1)
    s = stub(address)
    s.Hello(pb.HelloRequest(), metadata=bearer(token))
    time.sleep(1.1)
    with pytest.raises(grpc.RpcError) as e:
        s.Hello(pb.HelloRequest(), metadata=bearer(token))
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_broker_error_maps_to_status_and_trailing_metadata(broker: Any) -> None:
    svc, _, address = broker
    token, _ = svc.tokens.issue(ALICE)
    with pytest.raises(grpc.RpcError) as e:
        stub(address).ListPrograms(pb.ListProgramsRequest(), metadata=bearer(token))
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert e.value.details() == "no programs for you"
    md = dict(e.value.trailing_metadata())
    assert md[META_CODE] == "ERROR_PERMISSION_DENIED"
    assert md[META_RULE].startswith('policy.toml [[program]] #1 "syscount": users = ["bob"]')
    assert md[META_RULE].isascii()
    err = pb.Error.FromString(md[META_ERROR])
    assert err.code == pb.ERROR_PERMISSION_DENIED
    assert err.rule.endswith("– not ü")  # exact text in the binary copy


def test_internal_errors_fail_one_call_only(broker: Any) -> None:
    svc, _, address = broker
    token, _ = svc.tokens.issue(ALICE)
    s = stub(address)
    with pytest.raises(grpc.RpcError) as e:
        s.Attach(pb.AttachRequest(name="boom"), metadata=bearer(token))
    assert e.value.code() == grpc.StatusCode.INTERNAL
    assert "kaput" in e.value.details()
    assert s.Hello(pb.HelloRequest(), metadata=bearer(token)).uid == 1001


def test_attach_passes_no_fds_and_lease_expires(broker: Any) -> None:
    svc, handle, address = broker
    token, _ = svc.tokens.issue(ALICE)
    s = stub(address)
    before = time.time()
    reply = s.Attach(pb.AttachRequest(name="syscount", lease_seconds=1), metadata=bearer(token))
    assert [m.fd_index for m in reply.maps] == [-1]
    assert [p.fd_index for p in reply.programs] == [-1]
    assert before + 1 <= reply.lease_expires_unix <= time.time() + 2
    aid = reply.attachment_id
    # Renewed by ReadMap for a while...
    for _ in range(6):
        time.sleep(0.3)
        got = s.ReadMap(pb.ReadMapRequest(attachment_id=aid, map="counts"), metadata=bearer(token))
        assert got.entries[0].value == b"\x02"
    # ...then left alone: the reaper detaches it.
    time.sleep(1.4)
    with pytest.raises(grpc.RpcError) as e:
        s.ReadMap(pb.ReadMapRequest(attachment_id=aid, map="counts"), metadata=bearer(token))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert handle.leases.leases() == []


def test_lease_is_capped_by_policy(broker: Any) -> None:
    svc, _, address = broker
    token, _ = svc.tokens.issue(ALICE)
    reply = stub(address).Attach(
        pb.AttachRequest(name="x", lease_seconds=3600), metadata=bearer(token)
    )
    assert reply.lease_expires_unix <= time.time() + 3  # policy lease_seconds = 2


def test_detach_and_other_tokens_cannot_touch_it(broker: Any) -> None:
    svc, handle, address = broker
    t1, _ = svc.tokens.issue(ALICE)
    t2, _ = svc.tokens.issue(ALICE)
    s = stub(address)
    aid = s.Attach(pb.AttachRequest(name="x"), metadata=bearer(t1)).attachment_id
    with pytest.raises(grpc.RpcError) as e:  # a token is its own owner
        s.Detach(pb.DetachRequest(attachment_id=aid), metadata=bearer(t2))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert s.Detach(pb.DetachRequest(attachment_id=aid), metadata=bearer(t1)).unloaded
    assert handle.leases.leases() == []


def test_stream_events_delivers_batches_and_renews_while_open(broker: Any) -> None:
    svc, handle, address = broker
    token, _ = svc.tokens.issue(ALICE)
    s = stub(address)
    aid = s.Attach(
        pb.AttachRequest(name="x", lease_seconds=1), metadata=bearer(token)
    ).attachment_id
    svc.events = [b"one", b"two"]
    batches = list(
        s.StreamEvents(
            pb.StreamEventsRequest(attachment_id=aid, max_events=2), metadata=bearer(token)
        )
    )
    assert [e.data for b in batches for e in b.events] == [b"one", b"two"]
    assert batches[-1].end
    # An open stream keeps a 1 s lease alive for 2.5 s; cancelling ends it.
    call = s.StreamEvents(pb.StreamEventsRequest(attachment_id=aid), metadata=bearer(token))
    got = [next(call), next(call)]
    assert [b.events[0].seq for b in got] == [1, 2]
    time.sleep(2.5)
    assert [a for _, a, _ in handle.leases.leases()] == [aid]
    call.cancel()
    deadline = time.monotonic() + 3
    while handle.leases.leases() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert handle.leases.leases() == []  # not renewed after the stream ended
    assert svc.stream_polls > 10


def test_stream_errors_become_statuses(broker: Any) -> None:
    svc, _, address = broker
    token, _ = svc.tokens.issue(ALICE)
    call = stub(address).StreamEvents(
        pb.StreamEventsRequest(attachment_id=12345), metadata=bearer(token)
    )
    with pytest.raises(grpc.RpcError) as e:
        list(call)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as e:
        list(stub(address).StreamEvents(pb.StreamEventsRequest(attachment_id=1)))
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_stop_detaches_everything_and_ends_streams(tmp_path: Any) -> None:
    svc = FakeService(Policy.parse(POLICY))
    handle = start_grpc_server(svc, f"unix:{tmp_path}/g.sock")
    token, _ = svc.tokens.issue(ALICE)
    s = stub(f"unix:{tmp_path}/g.sock")
    aid = s.Attach(pb.AttachRequest(name="x"), metadata=bearer(token)).attachment_id
    call = s.StreamEvents(pb.StreamEventsRequest(attachment_id=aid), metadata=bearer(token))
    done = threading.Event()

    def drain() -> None:
        try:
            list(call)
        except grpc.RpcError:
            pass
        done.set()

    threading.Thread(target=drain, daemon=True).start()
    time.sleep(0.3)
    handle.stop(0.5)
    assert done.wait(5)
    assert all(o.closed for o in svc.owners)
    handle.stop()  # idempotent


def test_stale_socket_is_replaced_but_a_file_is_not(tmp_path: Any) -> None:
    path = tmp_path / "stale.sock"
    sk = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sk.bind(str(path))
    sk.close()
    svc = FakeService(Policy.parse(POLICY))
    handle = start_grpc_server(svc, f"unix:{path}")
    handle.stop(0)
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError, match="not a socket"):
        start_grpc_server(svc, f"unix:{tmp_path}/file")
    assert (tmp_path / "file").read_text() == "x"


def test_network_listener_requires_tls() -> None:
    svc = FakeService(Policy.parse(POLICY))
    with pytest.raises(ValueError, match="mTLS"):
        start_grpc_server(svc, "127.0.0.1:0")


def test_tls_config_errors_name_the_file(tmp_path: Any) -> None:
    (tmp_path / "junk").write_text("hello")
    with pytest.raises(OSError, match="--tls-cert .*missing"):
        TlsConfig.load(str(tmp_path / "missing"), "k", "c")
    with pytest.raises(ValueError, match="--tls-cert .*not a PEM"):
        TlsConfig.load(str(tmp_path / "junk"), "k", "c")


def test_mtls_maps_the_certificate_to_a_user(tmp_path: Any) -> None:
    from tests import tlscerts  # needs cryptography (a dev dependency)

    ca = tlscerts.make_ca("gfxbpf unit CA")
    other = tlscerts.make_ca("someone else's CA")
    server = ca.issue("localhost", server=True)
    runner = ca.issue("ci-runner")
    unmapped = ca.issue("stranger")
    forged = other.issue("ci-runner")  # right name, wrong CA
    policy = Policy.parse(
        POLICY
        + '[[tls_client]]\nsubject_cn = "ci-runner"\nuser = 4321\n'
        + f'[[tls_client]]\ncert_sha256 = "{unmapped.sha256}"\nsubject_cn = "nope"\nuser = 1\n'
    )
    svc = FakeService(policy)
    handle = start_grpc_server(
        svc,
        "127.0.0.1:0",
        TlsConfig(cert=server.cert_pem, key=server.key_pem, client_ca=ca.cert_pem),
    )
    try:
        assert handle.port and handle.address == f"127.0.0.1:{handle.port}"

        def channel(client: Any) -> pb_grpc.BrokerStub:
            creds = grpc.ssl_channel_credentials(
                root_certificates=ca.cert_pem,
                private_key=client.key_pem,
                certificate_chain=client.cert_pem,
            )
            return pb_grpc.BrokerStub(grpc.secure_channel(handle.address, creds))

        reply = channel(runner).Hello(pb.HelloRequest(), timeout=10)
        assert reply.uid == 4321 and reply.pid == 0
        with pytest.raises(grpc.RpcError) as e:
            channel(unmapped).Hello(pb.HelloRequest(), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "[[tls_client]]" in e.value.details() and unmapped.sha256 in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            channel(forged).Hello(pb.HelloRequest(), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE  # handshake refused
        # A token still works on the TLS listener (and wins over the certificate).
        token, _ = svc.tokens.issue(ALICE)
        assert channel(runner).Hello(pb.HelloRequest(), metadata=bearer(token)).uid == 1001
        # Without a client certificate the handshake fails.
        bare = pb_grpc.BrokerStub(
            grpc.secure_channel(
                handle.address, grpc.ssl_channel_credentials(root_certificates=ca.cert_pem)
            )
        )
        with pytest.raises(grpc.RpcError) as e:
            bare.Hello(pb.HelloRequest(), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        handle.stop(0)
