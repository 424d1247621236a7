"""gfxbpf.client against a stand-in broker (no kernel, no root).

FakeBroker speaks the real protocol on both transports: SOCK_SEQPACKET with
gfxbpf.proto.framing, and grpcio with the generated servicer, answering
errors the way broker/grpc/errors.py does (status + gfxbpf-* trailers). Its
maps hold fixed bytes, encoded with the catalog objects' own BTF, so the
client's BTF decoding, ReadMap paging, token handling and error messages
are checked end to end. The real broker is exercised in
tests/kernel/test_gfxclient.py.
"""

from __future__ import annotations

import io
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from elftools.elf.elffile import ELFFile

from gfxbpf.bpf.btf.facade import Btf
from gfxbpf.client import Broker, BrokerError, BrokerUnreachable, ClientError, UsageError
from gfxbpf.client.cli import gfxclient as cli
from gfxbpf.client.errors import EXIT_DENIED, EXIT_UNAVAILABLE, EXIT_UNREACHABLE
from gfxbpf.client.tokens import TokenCache
from gfxbpf.client.transport import Transport
from gfxbpf.proto import framing
from gfxbpf.proto import gfxbpf_pb2 as pb
from gfxbpf.proto import gfxbpf_pb2_grpc as pb_grpc

PROGRAMS = Path(__file__).resolve().parents[2] / "catalog" / "programs"
VMABIND_REASON = (
    "tracepoint i915:i915_vma_bind does not exist on this kernel: the i915 driver must "
    "be loaded (an Intel GPU, modprobe i915)"
)
DENY_RULE = 'policy.toml [[program]] #2 "secret": users = ["bob"]'


def object_btf(name: str) -> bytes:
    data = (PROGRAMS / f"{name}.bpf.o").read_bytes()
    return ELFFile(io.BytesIO(data)).get_section_by_name(".BTF").data()


class FakeError(Exception):
    def __init__(self, code: int, message: str, rule: str = "") -> None:
        super().__init__(message)
        self.err = pb.Error(code=code, message=message, rule=rule)


def _event(pid: int, comm: str, filename: str) -> bytes:
    return struct.pack("<4I16s256s", pid, pid, 1000, 1000, comm.encode(), filename.encode())


class FakeBroker:
    """The operations, shared by the Unix and gRPC front ends."""

    GRPC_STATUS = {
        pb.ERROR_PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
        pb.ERROR_UNAVAILABLE: grpc.StatusCode.FAILED_PRECONDITION,
        pb.ERROR_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
        pb.ERROR_UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    }

    def __init__(self, tmp: Path, *, direct: bool = False, with_grpc: bool = True) -> None:
        self.direct = direct
        self.lock = threading.Lock()
        self.next_id = 1
        self.attached: dict[int, str] = {}
        self.detached: list[int] = []
        self.tokens: set[str] = set()
        self.issued = 0
        self.read_pages = 0
        self.syscount_btf = object_btf("syscount")
        self.fence_btf = object_btf("fence")
        sb, fb = Btf.parse(self.syscount_btf), Btf.parse(self.fence_btf)
        self.u32 = sb.find("__u32")
        self.u64 = sb.find("__u64")
        self.lat_key = fb.find("latency_key")
        self.f_u64 = fb.find("__u64")
        # syscount counts: 39 getpid -> 7, 0 read -> 100, 1 write -> 3, 9999 -> 1
        self.counts = {nr: n for nr, n in ((39, 7), (0, 100), (1, 3), (9999, 1))}
        # fence_latency: (i915, ring0, slot 10) -> 4, (i915, ring0, slot 12) -> 9
        self.latency = {("i915", "ring0", 10): 4, ("i915", "ring0", 12): 9}
        self.events = [_event(4242, "true", "/bin/true"), _event(4243, "ls", "/bin/ls")]
        self.sock_path = str(tmp / "control.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(self.sock_path)
        self.listener.listen(16)
        self.stopping = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()
        self.grpc_addr = None
        self.server = None
        if with_grpc:
            self.grpc_addr = f"unix:{tmp / 'grpc.sock'}"
            self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
            pb_grpc.add_BrokerServicer_to_server(_Servicer(self), self.server)
            self.server.add_insecure_port(self.grpc_addr)
            self.server.start()

    def stop(self) -> None:
        self.stopping = True
        self.listener.close()
        if self.server is not None:
            self.server.stop(0)

    # --- Unix front end ---

    def _accept(self) -> None:
        while not self.stopping:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()

    def _session(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    req, fds = framing.recv_message(conn, pb.Request)
                except framing.FramingError:
                    return
                for fd in fds:
                    os.close(fd)
                kind = req.WhichOneof("body")
                resp = pb.Response(id=req.id)
                try:
                    field, reply = self.dispatch(kind, getattr(req, kind), "unix")
                    getattr(resp, field).CopyFrom(reply)
                except FakeError as e:
                    resp.error.CopyFrom(e.err)
                framing.send_message(conn, resp)

    # --- operations ---

    # long: the fake broker's answer to every request kind, one short branch each.
    def dispatch(self, kind: str, body: Any, transport: str) -> tuple[str, Any]:
        if kind == "hello":
            return "hello", pb.HelloReply(
                protocol=1,
                broker_version="fake-1",
                kernel_release="6.18.0-fake",
                features=pb.Features(direct_map_reads=self.direct, bpf_stats=True),
                uid=os.getuid(),
                gid=os.getgid(),
                pid=0 if transport == "grpc" else 1,
                possible_cpus=2,
            )
        if kind == "list_programs":
            return "list_programs", pb.ListProgramsReply(
                programs=[
                    pb.ProgramListing(
                        name="syscount",
                        description="System-call counts per syscall",
                        sha256="827f" * 16,
                        scopes=[pb.SCOPE_SELF],
                        available=True,
                        attach_points=["raw_tracepoint/sys_enter"],
                        maps=[
                            pb.MapDescription(
                                name="counts",
                                show="counter",
                                unit="count",
                                key_label="syscall",
                                description="calls per system call",
                                fd_index=-1,
                            )
                        ],
                    ),
                    pb.ProgramListing(
                        name="vmabind",
                        description="i915 VMA binds",
                        sha256="b2a9" * 16,
                        scopes=[pb.SCOPE_SYSTEM],
                        available=False,
                        unavailable_reason=VMABIND_REASON,
                    ),
                ]
            )
        if kind == "attach":
            return "attach", self._attach(body, transport)
        if kind == "detach":
            with self.lock:
                if body.attachment_id not in self.attached:
                    raise FakeError(pb.ERROR_NOT_FOUND, "no such attachment")
                del self.attached[body.attachment_id]
                self.detached.append(body.attachment_id)
            return "detach", pb.DetachReply(unloaded=True)
        if kind == "read_map":
            return "read_map", self._read_map(body)
        if kind == "stats":
            out = pb.StatsReply(stats_enabled=True)
            for att_id, name in sorted(self.attached.items()):
                if body.attachment_id in (0, att_id):
                    out.programs.add(
                        attachment_id=att_id,
                        program=name,
                        function="sys_enter",
                        prog_id=77,
                        run_cnt=10,
                        run_time_ns=12345,
                    )
            return "stats", out
        if kind == "issue_token":
            with self.lock:
                self.issued += 1
                token = f"tok-{self.issued}"
                self.tokens.add(token)
            return "issue_token", pb.IssueTokenReply(token=token, expires_unix=4_000_000_000)
        raise FakeError(pb.ERROR_INVALID_ARGUMENT, f"unknown request {kind}")

    def _attach(self, req: pb.AttachRequest, transport: str) -> pb.AttachReply:
        name = req.name
        if name == "vmabind":
            raise FakeError(pb.ERROR_UNAVAILABLE, VMABIND_REASON)
        if name == "secret":
            raise FakeError(pb.ERROR_PERMISSION_DENIED, "gfxtest may not use secret", DENY_RULE)
        with self.lock:
            att_id = self.next_id
            self.next_id += 1
            self.attached[att_id] = name
        reply = pb.AttachReply(attachment_id=att_id, program=name, sha256="ab" * 32)
        reply.scope = req.scope or pb.SCOPE_SELF
        if name == "syscount":
            reply.btf = self.syscount_btf
            reply.maps.add(
                name="counts",
                show="counter",
                unit="count",
                key_label="syscall",
                description="Calls per syscall number",
                map_type=1,
                key_size=4,
                value_size=8,
                max_entries=1024,
                fd_index=-1,
                btf_key_type_id=self.u32,
                btf_value_type_id=self.u64,
            )
        elif name == "fence":
            reply.btf = self.fence_btf
            reply.maps.add(
                name="fence_latency",
                show="log2_histogram",
                unit="ns",
                key_label="driver, timeline",
                map_type=1,
                key_size=68,
                value_size=8,
                max_entries=8192,
                fd_index=-1,
                btf_key_type_id=self.lat_key,
                btf_value_type_id=self.f_u64,
            )
        elif name == "execsnoop":
            reply.btf = object_btf("execsnoop")
            reply.maps.add(
                name="events",
                show="events",
                event_type="exec_event",
                map_type=27,
                max_entries=256 * 1024,
                fd_index=-1,
            )
        else:
            raise FakeError(pb.ERROR_NOT_FOUND, f"no program {name!r}")
        return reply

    def _read_map(self, req: pb.ReadMapRequest) -> pb.ReadMapReply:
        with self.lock:
            self.read_pages += 1
            name = self.attached.get(req.attachment_id)
        if name is None:
            raise FakeError(pb.ERROR_NOT_FOUND, "no such attachment")
        if name == "syscount":
            entries = [
                (nr.to_bytes(4, "little"), n.to_bytes(8, "little"))
                for nr, n in sorted(self.counts.items())
            ]
        else:
            entries = [
                (
                    struct.pack("<32s32sI", d.encode(), t.encode(), slot),
                    n.to_bytes(8, "little"),
                )
                for (d, t, slot), n in sorted(self.latency.items())
            ]
        # Pages of two entries: the client must follow the cursor.
        start = int(req.cursor.decode() or 0)
        page = entries[start : start + 2]
        nxt = str(start + 2).encode() if start + 2 < len(entries) else b""
        return pb.ReadMapReply(
            entries=[pb.MapEntry(key=k, value=v) for k, v in page], next_cursor=nxt
        )

    def stream(self, req: pb.StreamEventsRequest) -> Iterator[pb.EventBatch]:
        records = self.events[: req.max_events or len(self.events)]
        for i, data in enumerate(records, 1):
            yield pb.EventBatch(events=[pb.Event(seq=i, data=data)], lost=0)
        yield pb.EventBatch(end=True, lost=3)


class _Servicer(pb_grpc.BrokerServicer):
    def __init__(self, fake: FakeBroker) -> None:
        self.fake = fake

    def _auth(self, context: grpc.ServicerContext) -> None:
        md = dict(context.invocation_metadata())
        token = md.get("authorization", "").removeprefix("Bearer ")
        if token not in self.fake.tokens:
            self._abort(context, FakeError(pb.ERROR_UNAUTHENTICATED, "no valid token"))

    def _abort(self, context: grpc.ServicerContext, e: FakeError) -> None:
        md = [
            ("gfxbpf-error-code", pb.ErrorCode.Name(e.err.code)),
            ("gfxbpf-error-bin", e.err.SerializeToString()),
        ]
        if e.err.rule:
            md.append(("gfxbpf-rule", e.err.rule))
        context.set_trailing_metadata(tuple(md))
        context.abort(
            FakeBroker.GRPC_STATUS.get(e.err.code, grpc.StatusCode.UNKNOWN), e.err.message
        )

    def _do(self, kind: str, req: Any, context: grpc.ServicerContext) -> Any:
        self._auth(context)
        try:
            return self.fake.dispatch(kind, req, "grpc")[1]
        except FakeError as e:
            self._abort(context, e)

    def Hello(self, req, context):  # noqa: N802
        return self._do("hello", req, context)

    def ListPrograms(self, req, context):  # noqa: N802
        return self._do("list_programs", req, context)

    def Attach(self, req, context):  # noqa: N802
        return self._do("attach", req, context)

    def Detach(self, req, context):  # noqa: N802
        return self._do("detach", req, context)

    def ReadMap(self, req, context):  # noqa: N802
        return self._do("read_map", req, context)

    def Stats(self, req, context):  # noqa: N802
        return self._do("stats", req, context)

    def StreamEvents(self, req, context):  # noqa: N802
        self._auth(context)
        yield from self.fake.stream(req)


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeBroker]:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    (tmp_path / "run").mkdir(mode=0o700)
    monkeypatch.delenv("GFXBPF_TOKEN", raising=False)
    monkeypatch.delenv("GFXBPF_SOCKET", raising=False)
    monkeypatch.delenv("GFXBPF_GRPC", raising=False)
    fb = FakeBroker(tmp_path)
    yield fb
    fb.stop()


def _connect(fake: FakeBroker, via: str) -> Broker:
    return Broker.connect(socket=fake.sock_path, grpc=fake.grpc_addr, via=via)


# ------------------------------------------------------------------ library


@pytest.mark.parametrize("via", ["fd", "grpc"])
def test_hello_list_attach_read_detach(fake: FakeBroker, via: str) -> None:
    with _connect(fake, via) as broker:
        assert broker.via == via
        assert broker.hello().broker_version == "fake-1"
        names = [p.name for p in broker.list_programs()]
        assert names == ["syscount", "vmabind"]
        with broker.attach("syscount", scope="self") as att:
            assert att.scope == "self"
            counts = att.maps["counts"]
            assert counts.show == "counter" and counts.description == "Calls per syscall number"
            # BTF decodes __u32 keys and __u64 values to ints; paging followed to the end.
            assert dict(counts.read()) == {39: 7, 0: 100, 1: 3, 9999: 1}
            assert fake.read_pages >= 2
            assert [s.run_cnt for s in att.stats()] == [10]
            att_id = att.id
        assert fake.detached == [att_id]
        assert broker.attachments == []


def test_histogram_keys_decode_to_structs(fake: FakeBroker) -> None:
    with _connect(fake, "fd") as broker, broker.attach("fence") as att:
        entries = att.maps["fence_latency"].read()
    assert ({"driver": "i915", "timeline": "ring0", "slot": 12}, 9) in entries
    assert len(entries) == 2


def test_close_detaches_everything(fake: FakeBroker) -> None:
    broker = _connect(fake, "grpc")
    a = broker.attach("syscount")
    b = broker.attach("fence")
    broker.close()
    assert sorted(fake.detached) == sorted([a.id, b.id])
    assert broker.transport.closed


def test_grpc_events_stream(fake: FakeBroker) -> None:
    with _connect(fake, "grpc") as broker, broker.attach("execsnoop") as att:
        stream = att.open_events()
        got: list[Any] = []
        while not stream.ended:
            got.extend(stream.poll(5))
        assert [e["comm"] for e in got] == ["true", "ls"]
        assert got[0]["filename"] == "/bin/true" and got[0]["pid"] == 4242
        assert stream.lost == 3
        stream.close()


def test_events_max(fake: FakeBroker) -> None:
    with _connect(fake, "grpc") as broker, broker.attach("execsnoop") as att:
        events = list(att.events(max_events=1, timeout=5))
    assert [e["pid"] for e in events] == [4242]


def test_fd_transport_without_ring_fd_says_use_grpc(fake: FakeBroker) -> None:
    with _connect(fake, "fd") as broker, broker.attach("execsnoop") as att:
        with pytest.raises(Exception, match="--via grpc"):
            att.open_events()


@pytest.mark.parametrize("via", ["fd", "grpc"])
def test_both_transports_meet_the_transport_interface(fake: FakeBroker, via: str) -> None:
    with _connect(fake, via) as broker:
        assert isinstance(broker.transport, Transport)
        assert broker.transport.passes_fds == (via == "fd")


def test_unix_transport_streams_no_events(fake: FakeBroker) -> None:
    with _connect(fake, "fd") as broker:
        req = pb.StreamEventsRequest(attachment_id=1, map="events")
        with pytest.raises(ClientError, match="ring buffer 'events'.*--via grpc"):
            broker.transport.stream_events(req)


def test_grpc_transport_sends_no_fds(fake: FakeBroker) -> None:
    r, w = os.pipe()
    try:
        with _connect(fake, "grpc") as broker:
            with pytest.raises(UsageError, match="no fds"):
                broker.transport.attach(pb.AttachRequest(name="syscount"), [r])
    finally:
        os.close(r)
        os.close(w)


def test_grpc_stream_errors_are_client_errors(fake: FakeBroker) -> None:
    with _connect(fake, "grpc") as broker, broker.attach("execsnoop") as att:
        tokens = set(fake.tokens)
        fake.tokens.clear()  # StreamEvents is refused: UNAUTHENTICATED
        try:
            with att.open_events() as stream, pytest.raises(BrokerError) as refused:
                while not stream.ended:
                    stream.poll(5)
        finally:
            fake.tokens |= tokens
        assert refused.value.code == pb.ERROR_UNAUTHENTICATED


def test_table_read_of_ring_buffer_is_refused(fake: FakeBroker) -> None:
    with _connect(fake, "fd") as broker, broker.attach("execsnoop") as att:
        with pytest.raises(UsageError, match="ring buffer"):
            att.maps["events"].read()


@pytest.mark.parametrize("via", ["fd", "grpc"])
def test_errors_carry_code_message_rule(fake: FakeBroker, via: str) -> None:
    with _connect(fake, via) as broker:
        with pytest.raises(BrokerError) as denied:
            broker.attach("secret")
        assert denied.value.code == pb.ERROR_PERMISSION_DENIED
        assert denied.value.rule == DENY_RULE
        assert denied.value.exit_code == EXIT_DENIED
        assert "ask your administrator" in str(denied.value)
        with pytest.raises(BrokerError) as unavailable:
            broker.attach("vmabind")
        assert unavailable.value.code == pb.ERROR_UNAVAILABLE
        assert unavailable.value.exit_code == EXIT_UNAVAILABLE
        assert VMABIND_REASON in str(unavailable.value)


def test_auto_picks_grpc_without_direct_reads_and_fd_with(tmp_path: Path, fake: FakeBroker) -> None:
    with _connect(fake, "auto") as broker:
        assert broker.via == "grpc"
    fake.direct = True
    with _connect(fake, "auto") as broker:
        assert broker.via == "fd" and broker.direct_reads


def test_auto_falls_back_to_unix_reads_without_grpc(tmp_path: Path, fake: FakeBroker) -> None:
    with Broker.connect(socket=fake.sock_path, grpc=f"unix:{tmp_path}/none.sock") as broker:
        assert broker.via == "fd" and not broker.direct_reads
        with broker.attach("syscount") as att:
            assert dict(att.maps["counts"].read())[0] == 100


def test_token_is_cached_and_reissued_when_stale(fake: FakeBroker) -> None:
    for _ in range(3):
        with _connect(fake, "grpc") as broker:
            broker.list_programs()
    assert fake.issued == 1  # one token served three runs
    fake.tokens.clear()  # "the broker restarted": the cached token is refused
    with _connect(fake, "grpc") as broker:
        assert broker.list_programs()
    assert fake.issued == 2


def test_unreachable_broker(tmp_path: Path) -> None:
    with pytest.raises(BrokerUnreachable, match="systemctl start gfxbpf.socket"):
        Broker.connect(socket=str(tmp_path / "missing.sock"))


def test_bad_via_and_attach_arguments(fake: FakeBroker) -> None:
    with pytest.raises(UsageError):
        Broker.connect(socket=fake.sock_path, via="carrier-pigeon")
    with _connect(fake, "fd") as broker:
        with pytest.raises(UsageError):
            broker.attach()
        with pytest.raises(UsageError):
            broker.attach("syscount", scope="galaxy")


def test_stale_grpc_socket_fails_fast(tmp_path: Path, fake: FakeBroker) -> None:
    stale = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(stale))  # bound, never listening: what a dead broker leaves behind
    s.close()
    t0 = time.monotonic()
    with pytest.raises(BrokerUnreachable, match="nothing listens"):
        Broker.connect(socket=fake.sock_path, grpc=f"unix:{stale}", via="grpc")
    assert time.monotonic() - t0 < 5


def test_session_level_error_is_shown(tmp_path: Path) -> None:
    # The broker refuses a session (sessions_per_user) with an id-0 error, then closes.
    path = str(tmp_path / "busy.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    srv.bind(path)
    srv.listen(1)

    def refuse() -> None:
        conn, _ = srv.accept()
        err = pb.Error(
            code=pb.ERROR_RESOURCE_EXHAUSTED,
            message="uid 1000 already has 8 sessions",
            rule="[limits] sessions_per_user = 8",
        )
        framing.send_message(conn, pb.Response(id=0, error=err))
        conn.close()

    t = threading.Thread(target=refuse, daemon=True)
    t.start()
    with pytest.raises(BrokerError) as e:
        Broker.connect(socket=path, via="fd")
    t.join(5)
    srv.close()
    assert e.value.code == pb.ERROR_RESOURCE_EXHAUSTED
    assert "8 sessions" in str(e.value) and "sessions_per_user" in str(e.value)


# ------------------------------------------------------------------ token cache


def test_token_cache_file_is_private(tmp_path: Path) -> None:
    d = tmp_path / "c"
    d.mkdir(mode=0o700)
    cache = TokenCache(d, clock=lambda: 1000.0)
    cache.put("k", "secret-token", 5000)
    assert cache.get("k") == "secret-token"
    assert (os.stat(d / "tokens.json").st_mode & 0o777) == 0o600
    assert TokenCache(d, clock=lambda: 3500.0).get("k") == "secret-token"
    # Under a quarter of its life left: a new command gets a fresh token instead.
    assert TokenCache(d, clock=lambda: 4100.0).get("k") is None
    cache.forget("k")
    assert cache.get("k") is None


def test_token_cache_ignores_unsafe_files(tmp_path: Path) -> None:
    d = tmp_path / "c"
    d.mkdir(mode=0o700)
    (d / "tokens.json").write_text(json.dumps({"k": {"token": "t", "expires": 9e9}}))
    os.chmod(d / "tokens.json", 0o644)  # readable by others: not trusted
    assert TokenCache(d).get("k") is None
    os.chmod(d / "tokens.json", 0o600)
    assert TokenCache(d).get("k") == "t"


# ------------------------------------------------------------------ the command over the fake


def _run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    code = cli.main(argv, out=out)
    return code, out.getvalue()


@pytest.mark.parametrize("via", ["fd", "grpc"])
def test_cli_watch_once_json(fake: FakeBroker, via: str) -> None:
    base = ["--socket", fake.sock_path, "--grpc", fake.grpc_addr or "", "--via", via]
    code, text = _run([*base, "--json", "watch", "syscount", "--once", "--interval", "0.05"])
    assert code == 0
    lines = text.splitlines()
    assert len(lines) == 1
    obj = json.loads(lines[0])
    assert obj["program"] == "syscount"
    rows = obj["maps"]["counts"]
    assert [r["key"] for r in rows] == [0, 39, 1, 9999]  # sorted by value
    assert rows[0]["label"] == "read" and rows[1]["label"] == "getpid"
    assert rows[0]["rate"] == 0.0  # nothing changed during the interval


def test_cli_watch_once_text_and_histogram(fake: FakeBroker) -> None:
    base = ["--socket", fake.sock_path, "--via", "fd"]
    code, text = _run([*base, "watch", "fence", "--once", "--interval", "0.05"])
    assert code == 0
    assert "@fence_latency[i915, ring0]:" in text
    assert "[1.02µs, 2.05µs)" in text
    assert "[4.10µs, 8.19µs)" in text
    code, text = _run([*base, "watch", "syscount", "--once", "--interval", "0.05"])
    assert code == 0 and "getpid" in text and "SYSCALL" in text


def test_cli_dump_json_and_status(fake: FakeBroker) -> None:
    base = ["--socket", fake.sock_path, "--via", "fd"]
    code, text = _run([*base, "dump", "syscount", "--json"])
    assert code == 0
    obj = json.loads(text)
    entries = obj["maps"]["counts"]["entries"]
    assert {"key": 39, "value": 7} in entries
    code, text = _run([*base, "status", "--attach", "syscount", "--wait", "0"])
    assert code == 0
    assert "fake-1" in text and "sys_enter" in text and "1.23 µs" in text  # 12345 ns / 10


def test_cli_errors_exit_codes_and_no_traceback(
    fake: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--socket", fake.sock_path, "--via", "fd"]
    assert cli.main([*base, "watch", "vmabind"], out=io.StringIO()) == EXIT_UNAVAILABLE
    err = capsys.readouterr().err
    assert "i915:i915_vma_bind does not exist on this kernel" in err
    assert "i915 driver must be loaded" in err
    assert "Traceback" not in err
    assert cli.main([*base, "dump", "secret"], out=io.StringIO()) == EXIT_DENIED
    err = capsys.readouterr().err
    assert DENY_RULE in err and "ask your administrator" in err
    code = cli.main(["--socket", fake.sock_path + ".nope", "list"], out=io.StringIO())
    assert code == EXIT_UNREACHABLE
    assert "not running" in capsys.readouterr().err


def test_cli_stream_json_over_grpc(fake: FakeBroker) -> None:
    base = ["--socket", fake.sock_path, "--grpc", fake.grpc_addr or "", "--via", "grpc"]
    code, text = _run([*base, "stream", "execsnoop", "--json", "--duration", "5"])
    assert code == 0
    events = [json.loads(line) for line in text.splitlines()]
    assert [e["event"]["comm"] for e in events] == ["true", "ls"]
    assert all(e["program"] == "execsnoop" for e in events)


def test_cli_list_and_info(fake: FakeBroker) -> None:
    base = ["--socket", fake.sock_path, "--via", "fd"]
    code, text = _run([*base, "list"])
    assert code == 0
    assert "vmabind: " + VMABIND_REASON in text
    code, text = _run([*base, "list", "--json"])
    listing = json.loads(text)["programs"]
    assert listing[1]["available"] is False
    assert listing[1]["unavailable_reason"] == VMABIND_REASON
    code, text = _run([*base, "info", "syscount"])
    assert code == 0 and "raw_tracepoint/sys_enter" in text
    # The maps come from the broker's listing, not from a catalog on this host.
    assert "counts (counter, count, syscall): calls per system call" in text
    code, text = _run([*base, "--json", "info", "syscount"])
    assert json.loads(text)["maps"] == [
        {
            "name": "counts",
            "show": "counter",
            "unit": "count",
            "key_label": "syscall",
            "description": "calls per system call",
            "event_type": None,
        }
    ]
    assert cli.main([*base, "info", "nosuch"], out=io.StringIO()) == 1
