"""A seeded mutation fuzzer for the broker, run as an ordinary user.

It takes a corpus of valid requests (every request kind, with attachment ids
and cursors the broker really handed out), mutates their bytes (bit flips,
byte edits, inserts, deletes, truncation, splices, huge varints) and sends
them through both transports:

- the Unix control socket: each mutant is one datagram, sometimes with fds
  attached (SCM_RIGHTS); every datagram must be answered (or the session
  closed by the broker, after which it reconnects and counts it);
- gRPC: each mutant is the raw body of a call to one of the Broker methods,
  with the caller's real token, no token, or a mutated one.

It prints one JSON line of counts. "internal" counts ERROR_INTERNAL / gRPC
INTERNAL-with-"internal error" answers: a broker bug, which the test refuses.

    python fuzzclient.py CONTROL_SOCKET GRPC_ADDRESS --seconds 4 --seed 1
    # by hand, the long mode: --seconds 600 (any seed)

tests/kernel/test_fuzz.py runs it as gfxtest-mallory while another user is
served, and checks the broker's fds and threads afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import grpc

from gfxbpf.proto import framing
from gfxbpf.proto import gfxbpf_pb2 as pb

REPLY_TIMEOUT = 10.0  # a datagram unanswered this long counts as lost
GRPC_TIMEOUT = 5.0
PROGRAMS = ("syscount", "execsnoop", "clonecount", "ucalls", "nosuch", "")
METHODS = ("Hello", "ListPrograms", "Attach", "Detach", "ReadMap", "Stats", "StreamEvents")
INTERESTING = (
    b"\x00",
    b"\xff",
    b"\x7f",
    b"\x80",
    b"\xff\xff\xff\xff\x0f",  # varint 2**32-1
    b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # varint 2**64-1
    b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",  # an over-long varint
)


# ---------------------------------------------------------------- the corpus


def request_bodies(rng: random.Random, ids: list[int], cursors: list[bytes]) -> list[Any]:
    """One valid message of every request kind, with values the broker knows."""
    aid = rng.choice(ids) if ids else rng.randrange(1, 64)
    name = rng.choice(PROGRAMS)
    scope = rng.choice((pb.SCOPE_UNSPECIFIED, pb.SCOPE_SELF, pb.SCOPE_SYSTEM, 7))
    params = pb.AttachParams(
        pid=rng.choice((0, os.getpid(), 1, -1, 2**31 - 1)),
        library=rng.choice(("", "/usr/lib/x86_64-linux-gnu/libc.so.6", "/etc/shadow", "rel")),
        functions=rng.sample(("getpid", "getppid", "malloc", "*", "x" * 600), rng.randrange(0, 3)),
    )
    return [
        pb.HelloRequest(protocol=rng.choice((0, 1, 2)), client_version="fuzz"),
        pb.ListProgramsRequest(),
        pb.AttachRequest(name=name, scope=scope, params=params),
        pb.AttachRequest(object=rng.randbytes(rng.randrange(0, 256)), scope=scope),
        pb.DetachRequest(attachment_id=aid),
        pb.ReadMapRequest(
            attachment_id=aid,
            map=rng.choice(("", "counts", "events", "nosuch")),
            cursor=rng.choice(cursors) if cursors else b"",
            max_entries=rng.choice((0, 1, 5000, 2**32 - 1)),
        ),
        pb.StatsRequest(attachment_id=rng.choice((0, aid))),
        pb.StreamEventsRequest(attachment_id=aid, max_events=rng.choice((0, 1, 10))),
        pb.IssueTokenRequest(ttl_seconds=rng.choice((0, 1, 2**32 - 1))),
    ]


def mutate(rng: random.Random, data: bytes, other: bytes) -> bytes:
    """One to four random edits of data (other: a second message to splice from)."""
    buf = bytearray(data)
    for _ in range(rng.randrange(1, 5)):
        op = rng.randrange(8)
        pos = rng.randrange(len(buf) + 1)
        if op == 0 and buf:  # flip a bit
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1 and buf:  # replace a byte
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        elif op == 2:  # insert random bytes
            buf[pos:pos] = rng.randbytes(rng.randrange(1, 16))
        elif op == 3 and buf:  # delete a range
            buf[pos : pos + rng.randrange(1, 16)] = b""
        elif op == 4:  # truncate
            del buf[pos:]
        elif op == 5:  # an interesting varint or byte
            buf[pos:pos] = rng.choice(INTERESTING)
        elif op == 6 and other:  # splice in part of another message
            start = rng.randrange(len(other))
            buf[pos:pos] = other[start : start + rng.randrange(1, 32)]
        elif op == 7 and buf:  # duplicate a chunk (repeated fields, last-one-wins)
            start = rng.randrange(len(buf))
            buf[pos:pos] = buf[start : start + rng.randrange(1, 32)]
    return bytes(buf)


# ---------------------------------------------------------------- Unix socket


class UnixFuzzer:
    def __init__(self, path: str, rng: random.Random, counts: Counter[str]) -> None:
        self.path = path
        self.rng = rng
        self.counts = counts
        self.sock: socket.socket | None = None  # the session mutants go to
        self.learner: socket.socket | None = None  # a well-behaved session, open throughout
        self.ids: list[int] = []
        self.cursors: list[bytes] = []
        self.token = ""

    def connect(self) -> socket.socket:
        if self.sock is None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self.sock.settimeout(REPLY_TIMEOUT)
            self.sock.connect(self.path)
            self.counts["unix_connects"] += 1
        return self.sock

    def drop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def call(self, req: pb.Request) -> pb.Response | None:
        """A well-formed request on the learning session (ids, cursors, a token)."""
        try:
            if self.learner is None:
                self.learner = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                self.learner.settimeout(REPLY_TIMEOUT)
                self.learner.connect(self.path)
            framing.send_message(self.learner, req)
            resp, fds = framing.recv_message(self.learner, pb.Response)
        except (OSError, framing.FramingError):
            return None
        for fd in fds:
            os.close(fd)
        return resp

    def learn(self) -> None:
        """Make real attachments, a real cursor and a token for the mutants to use."""
        self.call(pb.Request(id=1, hello=pb.HelloRequest(protocol=1, client_version="fuzz")))
        for name, scope in (("syscount", pb.SCOPE_SELF), ("clonecount", pb.SCOPE_SYSTEM)):
            resp = self.call(pb.Request(id=2, attach=pb.AttachRequest(name=name, scope=scope)))
            if resp is not None and resp.WhichOneof("body") == "attach":
                self.ids.append(resp.attach.attachment_id)
        for aid in self.ids:
            page = pb.ReadMapRequest(attachment_id=aid, max_entries=1)
            resp = self.call(pb.Request(id=3, read_map=page))
            if resp is not None and resp.WhichOneof("body") == "read_map":
                self.cursors.append(resp.read_map.next_cursor)
        resp = self.call(pb.Request(id=4, issue_token=pb.IssueTokenRequest(ttl_seconds=600)))
        if resp is not None and resp.WhichOneof("body") == "issue_token":
            self.token = resp.issue_token.token
            self.counts["learned_token"] = 1

    def mutant(self) -> bytes:
        rng = self.rng
        bodies = request_bodies(rng, self.ids, self.cursors)
        req, other = (_wrap(rng.randrange(2**64), b) for b in rng.sample(bodies, 2))
        if rng.random() < 0.1:
            return req.SerializeToString()  # now and then a valid one, to go deeper
        return mutate(rng, req.SerializeToString(), other.SerializeToString())

    def fds_to_send(self) -> list[int]:
        """Sometimes pass fds along, which the broker must close, never use."""
        if self.rng.random() > 0.15:
            return []
        r, w = os.pipe()
        return [r, w, os.open("/dev/null", os.O_RDONLY)][: self.rng.randrange(1, 4)]

    def step(self) -> None:
        data = self.mutant()
        fds = self.fds_to_send()
        try:
            sock = self.connect()
            if fds:
                sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, bytes(_ints(fds)))])
            else:
                sock.send(data)
            self.counts["unix_sent"] += 1
            # A zero-length datagram reads as end-of-file on SOCK_SEQPACKET:
            # the broker then ends that session, like any client hanging up.
            self.counts["unix_empty"] += not data
            resp, got = framing.recv_message(sock, pb.Response)
        except TimeoutError:
            self.counts["unix_unanswered"] += 1
            self.drop()
            return
        except (OSError, framing.FramingError) as e:
            self.counts["unix_closed_by_broker"] += 1
            self.counts[f"unix_closed_{type(e).__name__}"] += 1
            self.drop()
            return
        finally:
            for fd in fds:
                os.close(fd)
        for fd in got:
            os.close(fd)
        self.counts["unix_answered"] += 1
        body = resp.WhichOneof("body")
        if body == "error":
            self.counts["unix_" + pb.ErrorCode.Name(resp.error.code)] += 1
            if resp.error.code == pb.ERROR_INTERNAL:
                self.counts["internal"] += 1
                if self.counts["internal"] <= 5:
                    print(f"internal error: {resp.error.message}", file=sys.stderr)
        else:
            self.counts[f"unix_ok_{body}"] += 1
            if body == "attach":
                self.ids.append(resp.attach.attachment_id)


def _wrap(req_id: int, body: Any) -> pb.Request:
    """body as the Request oneof field of its type."""
    req = pb.Request(id=req_id)
    for f in pb.Request.DESCRIPTOR.oneofs_by_name["body"].fields:
        if f.message_type is body.DESCRIPTOR:
            getattr(req, f.name).CopyFrom(body)
    return req


def _error_code(e: grpc.RpcError) -> str:
    """The broker's ErrorCode name from the trailing metadata ("" when it set none)."""
    for key, value in e.trailing_metadata() or ():  # type: ignore[attr-defined]
        if key == "gfxbpf-error-code":
            return value if isinstance(value, str) else value.decode()
    return ""


def _ints(fds: list[int]) -> bytes:
    import array

    return array.array("i", fds).tobytes()


# ---------------------------------------------------------------- gRPC


class GrpcFuzzer:
    def __init__(
        self, address: str, rng: random.Random, counts: Counter[str], unix: UnixFuzzer
    ) -> None:
        self.rng = rng
        self.counts = counts
        self.unix = unix
        self.channel = grpc.insecure_channel(address)
        ident: Callable[[bytes], bytes] = lambda b: b  # noqa: E731 - raw bodies both ways
        self.unary = {
            m: self.channel.unary_unary(
                f"/gfxbpf.v1.Broker/{m}", request_serializer=ident, response_deserializer=ident
            )
            for m in METHODS
            if m != "StreamEvents"
        }
        self.attached: list[tuple[int, list[tuple[str, str]]]] = []
        self.stream = self.channel.unary_stream(
            "/gfxbpf.v1.Broker/StreamEvents", request_serializer=ident, response_deserializer=ident
        )

    def metadata(self) -> list[tuple[str, str]]:
        rng = self.rng
        token = self.unix.token
        roll = rng.random()
        if roll < 0.6 and token:
            return [("authorization", f"Bearer {token}")]
        if roll < 0.7:
            return []
        if roll < 0.8:
            return [("authorization", "Bearer " + "".join(rng.sample(token or "abc", 3)))]
        if roll < 0.9:
            return [("authorization", rng.choice(("", "Basic x", "Bearer", "bearer  " + token)))]
        return [("authorization", f"Bearer {token}"), ("authorization", "Bearer x")]

    def step(self) -> None:
        rng = self.rng
        method = rng.choice(METHODS)
        bodies = request_bodies(rng, self.unix.ids, self.unix.cursors)
        index = {
            "Hello": 0,
            "ListPrograms": 1,
            "Attach": rng.choice((2, 3)),
            "Detach": 4,
            "ReadMap": 5,
            "Stats": 6,
            "StreamEvents": 7,
        }[method]
        data = bodies[index].SerializeToString()
        if rng.random() < 0.85:
            data = mutate(rng, data, rng.choice(bodies).SerializeToString())
        md = self.metadata()
        self.counts["grpc_sent"] += 1
        try:
            if method == "StreamEvents":
                for _ in self.stream(data, metadata=md, timeout=0.5):
                    pass
            else:
                reply = self.unary[method](data, metadata=md, timeout=GRPC_TIMEOUT)
                if method == "Attach":
                    self.attached.append((pb.AttachReply.FromString(reply).attachment_id, md))
            self.counts["grpc_ok"] += 1
        except grpc.RpcError as e:
            code = e.code()
            details = e.details() or ""
            if code == grpc.StatusCode.DEADLINE_EXCEEDED and method == "StreamEvents":
                self.counts["grpc_stream_timeout"] += 1
                return
            self.counts[f"grpc_{code.name}"] += 1
            if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN) and (
                _error_code(e) != "ERROR_KERNEL"
            ):
                # Not the kernel refusing: the broker (or grpc on its behalf,
                # e.g. for a body it could not parse) failed. A bug.
                self.counts["internal"] += 1
                if self.counts["internal"] <= 5:
                    print(f"internal error: {method}: {code.name}: {details}", file=sys.stderr)

    def close(self) -> None:
        """Detach what mutants attached over gRPC (else it lives until its lease ends)."""
        for aid, md in self.attached:
            req = pb.DetachRequest(attachment_id=aid).SerializeToString()
            with contextlib.suppress(grpc.RpcError):
                self.unary["Detach"](req, metadata=md, timeout=GRPC_TIMEOUT)
        self.channel.close()


def victim(path: str, address: str, seconds: float) -> dict[str, Any]:
    """Another user's view while the fuzzer runs: Hello round trips on both transports."""
    unix = UnixFuzzer(path, random.Random(0), Counter())
    unix.learn()
    channel = grpc.insecure_channel(address) if address != "-" else None
    md = [("authorization", f"Bearer {unix.token}")]
    times: dict[str, list[float]] = {"unix": [], "grpc": []}
    failures: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        resp = unix.call(pb.Request(id=9, hello=pb.HelloRequest(protocol=1)))
        times["unix"].append(time.perf_counter() - t0)
        if resp is None or resp.WhichOneof("body") != "hello":
            failures.append(f"unix: {resp}")
        if channel is not None:
            hello = channel.unary_unary(
                "/gfxbpf.v1.Broker/Hello",
                request_serializer=pb.HelloRequest.SerializeToString,
                response_deserializer=pb.HelloReply.FromString,
            )
            t0 = time.perf_counter()
            try:
                hello(pb.HelloRequest(protocol=1), metadata=md, timeout=GRPC_TIMEOUT)
            except grpc.RpcError as e:
                failures.append(f"grpc: {e.code().name}: {e.details()}")
            times["grpc"].append(time.perf_counter() - t0)
        time.sleep(0.01)
    if unix.learner is not None:
        unix.learner.close()
    out: dict[str, Any] = {"failures": failures[:20], "nfailures": len(failures)}
    for name, ts in times.items():
        if ts:
            ts.sort()
            out[name] = {
                "n": len(ts),
                "p99_ms": round(ts[int(0.99 * (len(ts) - 1))] * 1000, 3),
                "max_ms": round(ts[-1] * 1000, 3),
            }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("socket", help="the broker's control socket")
    ap.add_argument("grpc", help="the broker's gRPC address (unix:/path), or '-' for none")
    ap.add_argument("--seconds", type=float, default=4.0, help="how long to fuzz")
    ap.add_argument("--seed", type=int, default=1, help="random seed (same seed, same mutants)")
    ap.add_argument(
        "--victim", action="store_true", help="be the other user: time Hello round trips instead"
    )
    args = ap.parse_args(argv)
    if args.victim:
        print(json.dumps(victim(args.socket, args.grpc, args.seconds)), flush=True)
        return 0
    rng = random.Random(args.seed)
    counts: Counter[str] = Counter()
    unix = UnixFuzzer(args.socket, rng, counts)
    # Real attachments in another session of the same user: mutants naming
    # them must get NOT_FOUND, never another session's data.
    unix.learn()
    fuzz_grpc = GrpcFuzzer(args.grpc, rng, counts, unix) if args.grpc != "-" else None
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        if fuzz_grpc is not None and rng.random() < 0.4:
            fuzz_grpc.step()
        else:
            unix.step()
    unix.drop()
    if unix.learner is not None:
        unix.learner.close()
    if fuzz_grpc is not None:
        fuzz_grpc.close()
    with contextlib.suppress(BrokenPipeError):
        print(json.dumps(dict(sorted(counts.items()))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
