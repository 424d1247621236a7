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

from gfxbpf.broker.access.tokens import TokenStore
from gfxbpf.broker.callers import Caller
from gfxbpf.broker.errors import BrokerError
from gfxbpf.broker.grpc.server import (
    META_CODE,
    META_ERROR,
    META_RULE,
    TlsConfig,
    start_grpc_server,
)
from gfxbpf.broker.policy.rules import Policy
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
        self.release = threading.Event()  # lets a Hello with client_version "wait" return
        self.hello_threads: set[str] = set()

    # audit
    def denied(self, op: str, **kw: Any) -> None:
        self.denials.append({"op": op, **kw})

    def ok(self, op: str, **kw: Any) -> None:
        pass

    def record(self, *, op: str, result: str, **kw: Any) -> None:
        if result == "denied":
            self.denials.append({"op": op, **kw})

    def open_owner(self, caller: Caller) -> FakeOwner:
        o = FakeOwner(caller)
        self.owners.append(o)
        return o

    def close_owner(self, owner: FakeOwner) -> None:
        owner.attachments.clear()
        owner.closed = True

    def hello(self, caller: Caller, req: pb.HelloRequest) -> pb.HelloReply:
        self.hello_threads.add(threading.current_thread().name)
        if req.client_version == "wait":
            self.release.wait(30)
        if req.client_version == "fail":
            raise BrokerError(pb.ERROR_INVALID_ARGUMENT, "bad hello")
        if req.client_version == "boom":
            raise RuntimeError("kaput")
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


def test_a_body_that_is_no_message_is_a_protocol_error(broker: Any) -> None:
    svc, _, address = broker
    token, _ = svc.tokens.issue(ALICE)
    raw = grpc.insecure_channel(address).unary_unary("/gfxbpf.v1.Broker/Attach")
    with pytest.raises(grpc.RpcError) as e:
        raw(b"\x0a\xff\xff", metadata=bearer(token))  # a string field longer than the body
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(e.value.trailing_metadata())[META_CODE] == "ERROR_PROTOCOL"
    assert "not a valid gfxbpf.v1.AttachRequest" in e.value.details()
    bad = [d for d in svc.denials if d["op"] == "grpc_request"]
    assert bad and bad[-1]["uid"] == 1001
    assert stub(address).Hello(pb.HelloRequest(), metadata=bearer(token)).uid == 1001


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


def test_grpcs_private_socket_is_the_brokers_alone_and_cleaned_up(tmp_path: Any) -> None:
    stale = tmp_path / ".grpc.sock.d"  # left by a broker that died
    stale.mkdir()
    (stale / "grpc.sock").write_text("")
    svc = FakeService(Policy.parse(POLICY))
    handle = start_grpc_server(svc, f"unix:{tmp_path}/grpc.sock")
    inner = os.path.dirname(handle.acceptor.inner_path)
    try:
        assert inner == str(stale) and not (stale / "grpc.sock").is_file()
        assert stat.S_IMODE(os.stat(inner).st_mode) == 0o700
        assert stat.S_ISSOCK(os.stat(handle.acceptor.inner_path).st_mode)
    finally:
        handle.stop(0)
    assert not os.path.exists(inner)
    (tmp_path / ".other.sock.d").write_text("not a directory")
    with pytest.raises(OSError, match="is not this user's directory"):
        start_grpc_server(svc, f"unix:{tmp_path}/other.sock")


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


# ------------------------------------------------------------------ floods (issue #16)

LIMITED = """
[limits]
lease_seconds = 2
grpc_calls_per_user = 3
grpc_request_seconds = 1
"""
BOB = Caller(uid=1002, gid=1002, gids=(1002,), pid=778, transport="unix")


@pytest.fixture
def limited(tmp_path: Any) -> Iterator[tuple[FakeService, Any, str]]:
    svc = FakeService(Policy.parse(LIMITED))
    handle = start_grpc_server(svc, f"unix:{tmp_path}/l.sock", reap_interval=0.05)
    try:
        yield svc, handle, f"unix:{tmp_path}/l.sock"
    finally:
        svc.release.set()
        handle.stop(0)


class HeaderOnly:
    """Calls that send their headers and never a request message (until let go)."""

    def __init__(self, address: str, method: str = "Hello") -> None:
        self.channel = grpc.insecure_channel(address)
        self.let_go = threading.Event()
        if method == "StreamEvents":
            self.mc: Any = self.channel.stream_stream(
                "/gfxbpf.v1.Broker/StreamEvents",
                request_serializer=pb.StreamEventsRequest.SerializeToString,
                response_deserializer=pb.EventBatch.FromString,
            )
        else:
            self.mc = self.channel.stream_unary(
                f"/gfxbpf.v1.Broker/{method}",
                request_serializer=pb.HelloRequest.SerializeToString,
                response_deserializer=pb.HelloReply.FromString,
            )
        self.calls: list[Any] = []

    def _never(self) -> Iterator[Any]:
        self.let_go.wait(60)
        return
        yield

    def open(self, n: int, metadata: Any = None) -> list[Any]:
        new = []
        for _ in range(n):
            if isinstance(self.mc, grpc.StreamStreamMultiCallable):
                new.append(self.mc(self._never(), metadata=metadata))
            else:
                new.append(self.mc.future(self._never(), metadata=metadata))
        self.calls += new
        return new

    def close(self) -> None:
        self.let_go.set()
        self.channel.close()


def _code(call: Any) -> grpc.StatusCode | None:
    """A finished call's status; None while it runs."""
    if not call.done():
        return None
    return call.code()


def _until(cond: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_header_only_calls_without_credentials_are_refused_at_once(broker: Any) -> None:
    svc, handle, address = broker
    flood = HeaderOnly(address)
    try:
        t0 = time.monotonic()
        calls = flood.open(200)
        assert _until(lambda: all(c.done() for c in calls), 10)
        assert {c.code() for c in calls} == {grpc.StatusCode.UNAUTHENTICATED}
        assert time.monotonic() - t0 < 10
        md = dict(calls[0].trailing_metadata())
        assert md[META_CODE] == "ERROR_UNAUTHENTICATED"
        assert "IssueToken" in calls[0].details()
        # Each one audited, with the peer (no uid is known).
        auth = [d for d in svc.denials if d["op"] == "grpc_auth"]
        assert len(auth) == 200
        assert all(d["transport"] == "grpc" and "peer" in d and "uid" not in d for d in auth)
        # Streams too: the refusal comes without a request message.
        streams = HeaderOnly(address, "StreamEvents")
        try:
            call = streams.open(1)[0]
            with pytest.raises(grpc.RpcError) as e:
                next(call)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        finally:
            streams.close()
        # Meanwhile an authenticated caller is served as usual.
        token, _ = svc.tokens.issue(ALICE)
        assert stub(address).Hello(pb.HelloRequest(), metadata=bearer(token)).uid == 1001
    finally:
        flood.close()


def test_held_calls_cost_no_thread_and_others_are_served(limited: Any) -> None:
    svc, handle, address = limited
    alice, _ = svc.tokens.issue(ALICE)
    bob, _ = svc.tokens.issue(BOB)
    s = stub(address)
    s.Hello(pb.HelloRequest(), metadata=bearer(bob))
    before = threading.active_count()
    flood = HeaderOnly(address)
    try:
        held = flood.open(3, bearer(alice))
        assert _until(lambda: handle.slots.count(1001) == 3)
        refused = flood.open(50, bearer(alice))
        assert _until(lambda: all(c.done() for c in refused))
        assert {c.code() for c in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        md = dict(refused[0].trailing_metadata())
        assert md[META_CODE] == "ERROR_RESOURCE_EXHAUSTED"
        assert md[META_RULE] == "[limits] grpc_calls_per_user = 3"
        assert "uid 1001 already has 3 gRPC calls in flight" in refused[0].details()
        assert not any(c.done() for c in held)
        limit = [d for d in svc.denials if d["op"] == "grpc_limit"]
        assert len(limit) == 50 and all(d["uid"] == 1001 for d in limit)
        # Bob (another uid) is served at once; the held calls took no server thread
        # (the client library's own threads, one per held call, are the rest).
        t0 = time.perf_counter()
        assert s.Hello(pb.HelloRequest(), metadata=bearer(bob)).uid == 1002
        assert time.perf_counter() - t0 < 0.5
        server_threads = [t for t in threading.enumerate() if t.name.startswith("gfxbpf-grpc_")]
        assert len(server_threads) <= 2, [t.name for t in server_threads]
        assert threading.active_count() - before < 3 + 53 + 8
        # The held calls end when their request does not come in time (1 s).
        assert _until(lambda: all(c.done() for c in held), 5)
        assert {c.code() for c in held} == {grpc.StatusCode.INVALID_ARGUMENT}
        assert dict(held[0].trailing_metadata())[META_CODE] == "ERROR_PROTOCOL"
        assert _until(lambda: handle.slots.count() == 0)
    finally:
        flood.close()


def test_request_must_follow_the_headers_in_time(limited: Any) -> None:
    svc, handle, address = limited
    token, _ = svc.tokens.issue(ALICE)
    flood = HeaderOnly(address)
    try:
        t0 = time.monotonic()
        (call,) = flood.open(1, bearer(token))
        with pytest.raises(grpc.RpcError) as e:
            call.result(timeout=10)
        took = time.monotonic() - t0
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "no request message within 1 s" in e.value.details()
        md = dict(e.value.trailing_metadata())
        assert md[META_CODE] == "ERROR_PROTOCOL"
        assert md[META_RULE] == "[limits] grpc_request_seconds = 1"
        assert 0.9 < took < 4
        rec = [d for d in svc.denials if d["op"] == "grpc_request"]
        assert rec and rec[-1]["uid"] == 1001 and rec[-1]["transport"] == "grpc"
        # A request stream closed without a message is refused too.
        mc = flood.channel.stream_unary(
            "/gfxbpf.v1.Broker/Hello",
            request_serializer=pb.HelloRequest.SerializeToString,
            response_deserializer=pb.HelloReply.FromString,
        )
        with pytest.raises(grpc.RpcError) as e:
            mc(iter(()), metadata=bearer(token), timeout=5)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "without a request message" in e.value.details()
    finally:
        flood.close()
    assert _until(lambda: handle.slots.count() == 0)


# long: one case per way a call can end, each checking the slot comes back.
def test_a_uids_slots_come_back_on_every_way_a_call_ends(limited: Any) -> None:
    svc, handle, address = limited
    token, _ = svc.tokens.issue(ALICE)
    md = bearer(token)
    s = stub(address)

    def free() -> bool:
        return _until(lambda: handle.slots.count() == 0)

    # Success, BrokerError, internal error: 3 rounds of 3 (the limit) each.
    for _ in range(3):
        assert s.Hello(pb.HelloRequest(), metadata=md).uid == 1001
        for version, code in (("fail", "INVALID_ARGUMENT"), ("boom", "INTERNAL")):
            with pytest.raises(grpc.RpcError) as e:
                s.Hello(pb.HelloRequest(client_version=version), metadata=md)
            assert e.value.code().name == code
    assert free()
    # Cancelled while waiting for the request; cancelled by its deadline.
    flood = HeaderOnly(address)
    calls = flood.open(3, md)
    assert _until(lambda: handle.slots.count(1001) == 3)
    for c in calls:
        c.cancel()
    assert free()
    with pytest.raises(grpc.RpcError) as e:
        flood.mc(flood._never(), metadata=md, timeout=0.2)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert free()
    # Client gone (channel closed) while waiting for its request.
    calls = flood.open(3, md)
    assert _until(lambda: handle.slots.count(1001) == 3)
    flood.close()
    assert free()
    # Cancelled while the Service works: the slot stays until the work is done,
    # so hanging up does not let a user pile up work.
    svc.release.clear()
    busy = [s.Hello.future(pb.HelloRequest(client_version="wait"), metadata=md) for _ in range(3)]
    assert _until(lambda: handle.slots.count(1001) == 3)
    time.sleep(0.2)
    for f in busy:
        f.cancel()
    time.sleep(0.3)
    assert handle.slots.count(1001) == 3
    with pytest.raises(grpc.RpcError) as e:
        s.Hello(pb.HelloRequest(), metadata=md)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    svc.release.set()
    assert free()
    # Streams: refused, ended by the Service, cancelled by the client.
    with pytest.raises(grpc.RpcError):
        list(s.StreamEvents(pb.StreamEventsRequest(attachment_id=999), metadata=md))
    aid = s.Attach(pb.AttachRequest(name="x"), metadata=md).attachment_id
    svc.events = [b"a"]
    got = list(s.StreamEvents(pb.StreamEventsRequest(attachment_id=aid, max_events=1), metadata=md))
    assert got[-1].end
    assert free()
    call = s.StreamEvents(pb.StreamEventsRequest(attachment_id=aid), metadata=md)
    assert next(call).events[0].data == b"a"
    assert handle.slots.count(1001) == 1
    call.cancel()
    assert free()
    # And the uid has its whole allowance again.
    futs = [s.Hello.future(pb.HelloRequest(), metadata=md) for _ in range(3)]
    assert all(f.result(5).uid == 1001 for f in futs)


def test_the_grpc_limits_are_validated_like_the_others() -> None:
    from gfxbpf.broker.policy.rules import LIMIT_KEYS, PolicyError

    assert {"grpc_calls_per_user", "grpc_request_seconds"} <= set(LIMIT_KEYS)
    assert {
        "grpc_connections_per_user",
        "grpc_connections_total",
        "grpc_connect_seconds",
        "grpc_idle_seconds",
    } <= set(LIMIT_KEYS)
    assert Policy.parse(LIMITED).limits.grpc_calls_per_user == 3
    for bad in ("grpc_calls_per_user = 0", 'grpc_request_seconds = "10"'):
        with pytest.raises(PolicyError, match=bad.split()[0]):
            Policy.parse(f"[limits]\n{bad}\n")


CONNECTIONS = """
[limits]
grpc_connections_per_user = 2
grpc_connect_seconds = 1
grpc_idle_seconds = 1
"""


@pytest.fixture
def capped(tmp_path: Any) -> Iterator[tuple[FakeService, Any, str]]:
    svc = FakeService(Policy.parse(CONNECTIONS))
    handle = start_grpc_server(svc, f"unix:{tmp_path / 'grpc.sock'}", reap_interval=0.05)
    try:
        yield svc, handle, str(tmp_path / "grpc.sock")
    finally:
        handle.stop(0)


def _eof(s: socket.socket, timeout: float) -> bool:
    s.settimeout(timeout)
    try:
        return s.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_connections_past_the_per_user_cap_are_refused_at_accept(capped: Any) -> None:
    svc, handle, path = capped
    socks = []
    for _ in range(5):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        socks.append(s)
    try:
        assert _until(lambda: sum(_eof(s, 0.01) for s in socks[2:]) == 3)
        assert handle.acceptor.per_uid.count(os.getuid()) == 2
        assert _until(lambda: len([d for d in svc.denials if d["op"] == "grpc_connect"]) == 3)
        refused = [d for d in svc.denials if d["op"] == "grpc_connect"]
        assert refused[0]["uid"] == os.getuid()
        assert refused[0]["rule"] == "[limits] grpc_connections_per_user = 2"
        # Silent ones go after grpc_connect_seconds; then the places are free again.
        assert _eof(socks[0], 3.0) and _eof(socks[1], 3.0)
        assert _until(lambda: handle.acceptor.total == 0)
        token, _ = svc.tokens.issue(ALICE, 60)
        assert stub(f"unix:{path}").Hello(pb.HelloRequest(), metadata=bearer(token)).uid == 1001
    finally:
        for s in socks:
            s.close()


def test_an_idle_connection_is_closed_and_the_client_comes_back(capped: Any) -> None:
    svc, handle, path = capped
    token, _ = svc.tokens.issue(ALICE, 60)
    s = stub(f"unix:{path}")
    assert s.Hello(pb.HelloRequest(), metadata=bearer(token), timeout=5).uid == 1001
    assert handle.acceptor.total == 1
    # grpc_idle_seconds without a call: grpc closes it, the relay lets the place go.
    assert _until(lambda: handle.acceptor.total == 0, 5.0)
    assert s.Hello(pb.HelloRequest(), metadata=bearer(token), timeout=5).uid == 1001


def test_peer_fields_name_the_relayed_uid() -> None:
    from gfxbpf.broker.grpc.accept import Peer, peer_fields

    name = Peer(1003, 42).inner_name()
    assert name.startswith("\0gfxbpf-grpc-")
    assert peer_fields("unix-abstract:" + name[1:]) == {"peer": "uid 1003", "peer_pid": 42}
    assert peer_fields("ipv4:10.0.0.1:5555") == {"peer": "ipv4:10.0.0.1"}
    assert peer_fields("unix:") == {"peer": "unix:"}
