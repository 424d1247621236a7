"""Write a frozen map through a BPF program of one's own (issue #26, item 4).

Run as a test user with the venv python, next to rawclient.py, on a host
where kernel.unprivileged_bpf_disabled is 0; prints one JSON line:

    python progwrite.py SOCKET PROGRAM SCOPE MAP SLOT VALUE
        attach PROGRAM (a per-CPU array map MAP of u64 counts), load a socket
        filter (no capability needed at that sysctl) whose code calls
        bpf_map_update_elem(MAP, SLOT, VALUE) on the passed fd, run it once
        on a packet to itself, and report what its own fd shows at SLOT.
        Freezing stops only bpf(2) writes, so the program's write lands.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

from gfxbpf.bpf import asm as I
from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.consts import BPF_PSEUDO_MAP_FD
from gfxbpf.bpf.maps import Map

PROG_TYPE_SOCKET_FILTER = 1
SO_ATTACH_BPF = 50
MAP_UPDATE_ELEM = 2  # helper id


def _filter(map_fd: int, slot: int, value: int) -> bytes:
    """*(u32 *)(fp-4) = slot; *(u64 *)(fp-16) = value;
    map_update_elem(map, fp-4, fp-16, BPF_ANY); return 0."""
    code = [
        I.Insn(0x62, 10, 0, -4, slot),  # st [r10-4], slot (u32)
        *I.ld_imm64(1, value),
        I.Insn(0x7B, 10, 1, -16, 0),  # stx [r10-16], r1 (u64)
        *I.ld_imm64(1, map_fd, BPF_PSEUDO_MAP_FD),
        I.Insn(0xBF, 2, 10, 0, 0),  # r2 = r10
        I.Insn(0x07, 2, 0, 0, -4),  # r2 += -4
        I.Insn(0xBF, 3, 10, 0, 0),  # r3 = r10
        I.Insn(0x07, 3, 0, 0, -16),  # r3 += -16
        I.Insn(0xB7, 4, 0, 0, 0),  # r4 = BPF_ANY
        I.Insn(0x85, 0, 0, 0, MAP_UPDATE_ELEM),
        I.Insn(0xB7, 0, 0, 0, 0),  # r0 = 0
        I.Insn(0x95),  # exit
    ]
    return I.encode(code)


def _run_once(prog_fd: int) -> None:
    """One datagram to itself through a socket the filter is attached to."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.bind(("127.0.0.1", 0))
        rx.setsockopt(socket.SOL_SOCKET, SO_ATTACH_BPF, prog_fd)
        tx.sendto(b"x", rx.getsockname())
        rx.settimeout(0.5)
        try:
            rx.recv(16)  # the filter returns 0: the packet is dropped, but it ran
        except TimeoutError:
            pass
    finally:
        rx.close()
        tx.close()


def main() -> None:
    from rawclient import SCOPES, Failed, RawClient

    sock, program, scope, map_name, slot_s, value_s = sys.argv[1:7]
    slot, value = int(slot_s), int(value_s)
    out: dict[str, Any] = {
        "unprivileged_bpf_disabled": open("/proc/sys/kernel/unprivileged_bpf_disabled")
        .read()
        .strip()
    }
    c = RawClient(sock)
    try:
        a = c.attach(name=program, scope=SCOPES[scope])
    except Failed as e:
        print(json.dumps({**out, "attach": e.err.message}))
        return
    out["id"] = a.attachment_id
    out["shared"] = a.shared
    _, fd = c.map_fd(a.attachment_id, map_name)
    try:
        prog = bpfsys.prog_load(PROG_TYPE_SOCKET_FILTER, _filter(fd, slot, value), "GPL")
    except OSError as e:
        out["load"] = str(e)
    else:
        out["load"] = "ok"
        _run_once(prog)
        os.close(prog)
    v = Map.from_fd(fd).lookup(slot.to_bytes(4, "little"))
    cpus = v if isinstance(v, list) else [v or b""]
    out["own_view"] = sum(int.from_bytes(bytes(x)[:8], "little") for x in cpus)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
