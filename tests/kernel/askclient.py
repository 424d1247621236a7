"""Attach requests as the user running it, over the Unix socket and gRPC; answers as JSON.

    python askclient.py CONTROL_SOCKET GRPC_ADDRESS < requests.json

stdin: a JSON list of requests, each {"via": "unix" | "grpc", "name" |
"object_path" | "object_size", "scope", "pid_self", "library", "functions",
"library_fd"}. object_size uploads that many zero bytes; pid_self asks for
this process's pid; library_fd (Unix only) is a path this user opens and
passes as the library's fd (without it the request only names library,
as a hostile client may send it).
stdout: one JSON list of answers {"ok", "code", "message", "rule"}; over
gRPC "rule" is the trailing metadata gfxbpf-rule and "error_rule" the rule
inside gfxbpf-error-bin. Deliberately raw (framing and generated stubs
only, like rawclient.py), so the broker is tested, not gfxbpf.client.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

import grpc

from gfxbpf.proto import framing
from gfxbpf.proto import gfxbpf_pb2 as pb
from gfxbpf.proto import gfxbpf_pb2_grpc as pb_grpc

SCOPES = {"self": pb.SCOPE_SELF, "system": pb.SCOPE_SYSTEM, "": pb.SCOPE_UNSPECIFIED}


class Unix:
    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.connect(path)
        self.next_id = 0

    def call(self, fds: list[int], **body: Any) -> pb.Response:
        self.next_id += 1
        framing.send_message(self.sock, pb.Request(id=self.next_id, **body), fds)
        resp, got = framing.recv_message(self.sock, pb.Response)
        for fd in got:
            os.close(fd)
        return resp


def request(spec: dict[str, Any]) -> pb.AttachRequest:
    req = pb.AttachRequest(scope=SCOPES[spec.get("scope", "")], lease_seconds=5)
    if "object_path" in spec:
        with open(spec["object_path"], "rb") as f:
            req.object = f.read()
    elif "object_size" in spec:
        req.object = bytes(spec["object_size"])
    else:
        req.name = spec["name"]
    if spec.get("pid_self"):
        req.params.pid = os.getpid()
    if "library" in spec:
        req.params.library = spec["library"]
    req.params.functions.extend(spec.get("functions", []))
    return req


def ask_unix(unix: Unix, spec: dict[str, Any]) -> dict[str, Any]:
    req = request(spec)
    fds = []
    if "library_fd" in spec:
        fds.append(os.open(spec["library_fd"], os.O_RDONLY | os.O_CLOEXEC))
        req.params.library_fd_index = 0
    try:
        resp = unix.call(fds, attach=req)
    finally:
        for fd in fds:
            os.close(fd)
    if resp.WhichOneof("body") != "error":
        return {"ok": True}
    e = resp.error
    return {"ok": False, "code": pb.ErrorCode.Name(e.code), "message": e.message, "rule": e.rule}


def ask_grpc(stub: Any, token: str, spec: dict[str, Any]) -> dict[str, Any]:
    try:
        stub.Attach(request(spec), metadata=[("authorization", "Bearer " + token)])
    except grpc.RpcError as e:
        md = dict(e.trailing_metadata() or ())
        exact = pb.Error.FromString(md.get("gfxbpf-error-bin", b""))
        return {
            "ok": False,
            "code": md.get("gfxbpf-error-code", ""),
            "message": e.details(),
            "rule": md.get("gfxbpf-rule", ""),
            "error_rule": exact.rule,
            "error_message": exact.message,
        }
    return {"ok": True}


def main() -> None:
    control, grpc_address = sys.argv[1:3]
    specs = json.load(sys.stdin)
    unix = Unix(control)
    token = unix.call([], issue_token=pb.IssueTokenRequest(ttl_seconds=60)).issue_token.token
    stub = pb_grpc.BrokerStub(grpc.insecure_channel(grpc_address))
    out = []
    for spec in specs:
        if spec["via"] == "unix":
            out.append(ask_unix(unix, spec))
        else:
            out.append(ask_grpc(stub, token, spec))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
