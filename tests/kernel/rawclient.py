"""A tiny broker client for the integration tests, on gfxbpf.proto.framing directly.

It deliberately does not use gfxbpf.client (tested separately): it speaks
the protocol by hand, so broker tests do not depend on the client library.
Run as a test user with the venv python:

    python rawclient.py SOCKET            # JSON commands on stdin, one reply per line
    python rawclient.py SOCKET loop SECONDS PROGRAMS_JSON   # stress loop, one JSON line

Commands (JSON objects with "cmd"): hello, list, attach {name | object_path, scope,
pid, library, functions, library_fd (default true: open library, pass its fd)},
detach {id}, read_fd {id, map}, read_rpc {id, map}, write_fd {id, map}, scan {id},
events {id, map, want_pids, timeout}, stats {id}, getppid {n}, exec {n},
garbage {data_hex}, rpc_raw {request_hex}, quit.
Replies: {"ok": true, ...} or {"ok": false, "code": NAME, "message": ..., "rule": ...}.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import struct
import subprocess
import sys
import time
from typing import Any

from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.maps import Map
from gfxbpf.bpf.ringbuf import RingBuffer
from gfxbpf.proto import framing
from gfxbpf.proto import gfxbpf_pb2 as pb

KERNEL_MIN = 0xFFFF_8000_0000_0000  # x86-64 kernel half (0xffff8... and above)
RINGBUF = 27
EXEC_EVENT = struct.Struct("<IIII16s256s")
SCOPES = {"self": pb.SCOPE_SELF, "system": pb.SCOPE_SYSTEM, "": pb.SCOPE_UNSPECIFIED}


class Failed(Exception):
    def __init__(self, err: pb.Error) -> None:
        super().__init__(err.message)
        self.err = err


class RawClient:
    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.connect(path)
        self.next_id = 1
        self.attachments: dict[int, tuple[pb.AttachReply, list[int]]] = {}
        # Detached attachments whose fds this client kept (detach keep_fds).
        self.kept: dict[int, tuple[pb.AttachReply, list[int]]] = {}

    def call(self, send_fds: tuple[int, ...] = (), **body: Any) -> tuple[pb.Response, list[int]]:
        rid = self.next_id
        self.next_id += 1
        try:
            framing.send_message(self.sock, pb.Request(id=rid, **body), send_fds)
        except framing.PeerClosed:
            pass  # the broker may have answered (e.g. a session limit) and closed
        resp, fds = framing.recv_message(self.sock, pb.Response)
        if resp.WhichOneof("body") == "error":
            for fd in fds:
                os.close(fd)
            raise Failed(resp.error)
        assert resp.id == rid, (resp.id, rid)
        return resp, fds

    def attach(self, send_fds: tuple[int, ...] = (), **kw: Any) -> pb.AttachReply:
        resp, fds = self.call(send_fds, attach=pb.AttachRequest(**kw))
        self.attachments[resp.attach.attachment_id] = (resp.attach, fds)
        return resp.attach

    def detach(self, att_id: int, keep_fds: bool = False) -> pb.DetachReply:
        resp, _ = self.call(detach=pb.DetachRequest(attachment_id=att_id))
        held = self.attachments.pop(att_id)
        if keep_fds:
            self.kept[att_id] = held
        else:
            for fd in held[1]:
                os.close(fd)
        return resp.detach

    def map_fd(self, att_id: int, name: str) -> tuple[pb.MapDescription, int]:
        reply, fds = self.attachments.get(att_id) or self.kept[att_id]
        for m in reply.maps:
            if m.name == name or not name:
                return m, fds[m.fd_index]
        raise KeyError(name)

    def read_fd(self, att_id: int, name: str) -> dict[str, str]:
        m, fd = self.map_fd(att_id, name)
        kmap = Map.from_fd(fd)
        out = {}
        for k in kmap.keys():
            v = kmap.lookup(k)
            if v is not None:
                out[k.hex()] = b"".join(v).hex() if isinstance(v, list) else bytes(v).hex()
        return out

    def read_rpc(self, att_id: int, name: str, page: int = 0) -> tuple[dict[str, str], int]:
        """(entries, pages) through ReadMap, page entries at a time (0: the default)."""
        out: dict[str, str] = {}
        cursor = b""
        pages = 0
        while True:
            resp, _ = self.call(
                read_map=pb.ReadMapRequest(
                    attachment_id=att_id, map=name, cursor=cursor, max_entries=page
                )
            )
            pages += 1
            for e in resp.read_map.entries:
                out[e.key.hex()] = (b"".join(e.per_cpu) if e.per_cpu else e.value).hex()
            cursor = resp.read_map.next_cursor
            if not cursor:
                return out, pages


def kernel_looking(data: bytes) -> list[str]:
    """Every 8-byte aligned little-endian value in the kernel half of the address space."""
    out = []
    for off in range(0, len(data) - 7, 8):
        (v,) = struct.unpack_from("<Q", data, off)
        if v >= KERNEL_MIN and v != 0xFFFF_FFFF_FFFF_FFFF:
            out.append(f"{v:#x}")
    return out


_NUMBER = re.compile(r"\b(?:0x)?[0-9a-fA-F]{16}\b|\b[0-9]{19,20}\b")


def kernel_looking_text(text: str) -> list[str]:
    """Numbers in text (16 hex digits, or 19-20 decimal ones) in the kernel half."""
    out = []
    for m in _NUMBER.finditer(text):
        word = m.group(0)
        is_hex = word.lower().startswith("0x") or not word.isdigit() or len(word) == 16
        try:
            v = int(word, 16) if is_hex else int(word)
        except ValueError:
            continue
        if KERNEL_MIN <= v < 0xFFFF_FFFF_FFFF_FFFF:
            out.append(word)
    return out


def err_reply(e: Failed) -> dict[str, Any]:
    return {
        "ok": False,
        "code": pb.ErrorCode.Name(e.err.code),
        "message": e.err.message,
        "rule": e.err.rule,
    }


def drain_events(fd: int, want_pids: set[int], timeout: float) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    seen: set[int] = set()
    with RingBuffer(fd) as ring:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for rec in ring.poll(0.1):
                pid, tgid, uid, gid, comm, fname = EXEC_EVENT.unpack_from(
                    rec.ljust(EXEC_EVENT.size, b"\0")
                )
                events.append(
                    {
                        "pid": pid,
                        "tgid": tgid,
                        "uid": uid,
                        "gid": gid,
                        "comm": comm.split(b"\0", 1)[0].decode("latin-1"),
                        "filename": fname.split(b"\0", 1)[0].decode("latin-1"),
                        "suspicious": kernel_looking(rec),
                    }
                )
                seen.add(pid)
            if want_pids and want_pids <= seen:
                # Give a little more time for stray events to show up.
                deadline = min(deadline, time.monotonic() + 0.3)
    return events


def attach_exiting(c: RawClient, cmd: dict[str, Any]) -> dict[str, Any]:
    """Issue 35 item 5's loop: attach cmd["name"] to a child that exits during the
    load (a `sleep` of cmd["life"] s), each time with another stack_bytes so no
    warm instance fits, for cmd["seconds"] s or until cmd["refusals"] refusals
    RESOURCE_EXHAUSTED. Outcomes by error code ("OK": attached, then detached)."""
    codes: dict[str, int] = {}
    refusal: dict[str, Any] = {}
    i, deadline = 0, time.monotonic() + cmd["seconds"]
    while time.monotonic() < deadline and codes.get("ERROR_RESOURCE_EXHAUSTED", 0) < cmd.get(
        "refusals", 1 << 30
    ):
        child = subprocess.Popen(["sleep", str(cmd["life"])])
        i += 1
        try:
            a = c.attach(
                name=cmd["name"],
                scope=SCOPES["self"],
                params=pb.AttachParams(pid=child.pid, stack_bytes=1024 + 8 * (i % 800)),
            )
            c.detach(a.attachment_id)
            code = "OK"
        except Failed as e:
            code = pb.ErrorCode.Name(e.err.code)
            if code == "ERROR_RESOURCE_EXHAUSTED" and not refusal:
                refusal = err_reply(e)
        finally:
            child.wait()
        codes[code] = codes.get(code, 0) + 1
    return {"ok": True, "codes": codes, "refusal": refusal}


# long: one branch per command of this test client, each a few lines; a table
# of functions would only spread them apart.
def handle(c: RawClient, cmd: dict[str, Any]) -> dict[str, Any]:  # noqa: C901
    op = cmd["cmd"]
    if op == "hello":
        resp, _ = c.call(hello=pb.HelloRequest(protocol=1, client_version="rawclient"))
        h = resp.hello
        return {"ok": True, "uid": h.uid, "pid": h.pid, "direct": h.features.direct_map_reads}
    if op == "list":
        resp, _ = c.call(list_programs=pb.ListProgramsRequest())
        return {
            "ok": True,
            "programs": {
                p.name: {"available": p.available, "reason": p.unavailable_reason}
                for p in resp.list_programs.programs
            },
        }
    if op == "attach":
        kw: dict[str, Any] = {"scope": SCOPES[cmd.get("scope", "")]}
        if "object_path" in cmd:
            with open(cmd["object_path"], "rb") as f:
                kw["object"] = f.read()
        else:
            kw["name"] = cmd["name"]
        knobs = ("pid", "library", "functions", "frequency", "stack_bytes", "min_block_us")
        params = {k: cmd[k] for k in knobs if k in cmd}
        lib_fd = -1
        if "library" in cmd and cmd.get("library_fd", True):
            # As gfxbpf.client does: open the library as this user, pass the fd.
            lib_fd = os.open(cmd["library"], os.O_RDONLY | os.O_CLOEXEC)
            params["library_fd_index"] = 0
        if params:
            kw["params"] = pb.AttachParams(**params)
        try:
            a = c.attach(send_fds=(lib_fd,) if lib_fd >= 0 else (), **kw)
        finally:
            if lib_fd >= 0:
                os.close(lib_fd)
        return {
            "ok": True,
            "id": a.attachment_id,
            "shared": a.shared,
            "sha256": a.sha256,
            "prog_ids": [p.prog_id for p in a.programs],
            "prog_fd_indexes": [p.fd_index for p in a.programs],
            "maps": {m.name: {"fd_index": m.fd_index, "map_type": m.map_type} for m in a.maps},
            "nfds": len(c.attachments[a.attachment_id][1]),
        }
    if op == "detach":
        return {"ok": True, "unloaded": c.detach(cmd["id"], cmd.get("keep_fds", False)).unloaded}
    if op == "attach_exiting":
        return attach_exiting(c, cmd)
    if op == "cycles":  # n attach/detach pairs in a row, without a round trip to the test
        unloaded = 0
        for _ in range(cmd["n"]):
            a = c.attach(name=cmd["name"], scope=SCOPES[cmd.get("scope", "")])
            unloaded += c.detach(a.attachment_id).unloaded
        return {"ok": True, "unloaded": unloaded}
    if op == "read_fd":
        return {"ok": True, "entries": c.read_fd(cmd["id"], cmd.get("map", ""))}
    if op == "read_rpc":
        entries, pages = c.read_rpc(cmd["id"], cmd.get("map", ""), cmd.get("page", 0))
        return {"ok": True, "entries": entries, "pages": pages}
    if op == "write_fd":
        m, fd = c.map_fd(cmd["id"], cmd.get("map", ""))
        try:
            bpfsys.map_update_elem(fd, b"\0" * m.key_size, b"\0" * m.value_size)
        except OSError as e:
            return {"ok": True, "errno": errno.errorcode.get(e.errno or 0, str(e.errno))}
        return {"ok": True, "errno": None}
    if op == "scan":
        # Everything readable through the fds: every key and value of every
        # map (ring buffers: their pending records).
        reply, fds = c.attachments[cmd["id"]]
        found: dict[str, list[str]] = {}
        scanned = 0
        for m in reply.maps:
            fd = fds[m.fd_index]
            if m.map_type == RINGBUF:
                with RingBuffer(fd) as ring:
                    blobs = ring.drain()
            else:
                kmap = Map.from_fd(fd)
                blobs = []
                for k in kmap.keys():
                    v = kmap.lookup(k)
                    blobs.append(k)
                    if v is not None:
                        blobs.append(b"".join(v) if isinstance(v, list) else bytes(v))
            for b in blobs:
                scanned += len(b)
                hits = kernel_looking(b)
                if hits:
                    found.setdefault(m.name, []).extend(hits)
        return {"ok": True, "found": found, "bytes": scanned}
    if op == "events":
        m, fd = c.map_fd(cmd["id"], cmd.get("map", ""))
        return {
            "ok": True,
            "events": drain_events(fd, set(cmd.get("want_pids", [])), cmd.get("timeout", 3.0)),
        }
    if op == "stats":
        resp, _ = c.call(stats=pb.StatsRequest(attachment_id=cmd.get("id", 0)))
        return {
            "ok": True,
            "programs": [[p.function, p.prog_id, p.run_cnt] for p in resp.stats.programs],
        }
    if op == "getppid":
        for _ in range(cmd["n"]):
            os.getppid()
        return {"ok": True}
    if op == "getpid":
        for _ in range(cmd["n"]):
            os.getpid()  # libc getpid(): a uprobe target
        return {"ok": True, "pid": os.getpid()}
    if op == "exec":
        pids = []
        for _ in range(cmd["n"]):
            p = subprocess.Popen([cmd.get("path", "/bin/true")])
            pids.append(p.pid)
            p.wait()
        return {"ok": True, "pids": pids}
    if op == "fork":
        for _ in range(cmd["n"]):  # glibc fork() is a clone() syscall
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
        return {"ok": True}
    if op == "garbage":
        c.sock.send(bytes.fromhex(cmd["data_hex"]))
        resp, fds = framing.recv_message(c.sock, pb.Response)
        return {"ok": True, "reply": pb.ErrorCode.Name(resp.error.code)}
    if op == "stream_rpc":
        resp, _ = c.call(stream_events=pb.StreamEventsRequest(attachment_id=cmd["id"]))
        return {"ok": True}
    raise ValueError(f"unknown command {op!r}")


def serve(path: str) -> None:
    c = RawClient(path)
    print(json.dumps({"ok": True, "ready": True, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            break
        try:
            out = handle(c, cmd)
        except Failed as e:
            out = err_reply(e)
        except Exception as e:
            out = {"ok": False, "code": "CLIENT_" + type(e).__name__, "message": str(e)}
        print(json.dumps(out), flush=True)


def loop(path: str, seconds: float, programs: list[dict[str, Any]]) -> None:
    """attach / read (fd) / detach, cycling through programs, for seconds."""
    c = RawClient(path)
    deadline = time.monotonic() + seconds
    cycles = 0
    errors: list[str] = []
    i = 0
    while time.monotonic() < deadline:
        spec = programs[i % len(programs)]
        i += 1
        try:
            a = c.attach(name=spec["name"], scope=SCOPES[spec.get("scope", "")])
            for m in a.maps:
                if m.map_type != RINGBUF:
                    c.read_fd(a.attachment_id, m.name)
            c.detach(a.attachment_id)
            cycles += 1
        except Failed as e:
            errors.append(f"{pb.ErrorCode.Name(e.err.code)}: {e.err.message}")
        except Exception as e:  # report, do not die: the test counts them
            errors.append(f"{type(e).__name__}: {e}")
            break
        if len(errors) > 20:
            break
    print(json.dumps({"cycles": cycles, "errors": errors[:20]}), flush=True)


def main() -> None:
    path = sys.argv[1]
    if len(sys.argv) > 2 and sys.argv[2] == "loop":
        loop(path, float(sys.argv[3]), json.loads(sys.argv[4]))
    else:
        serve(path)


if __name__ == "__main__":
    main()
