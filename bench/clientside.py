"""bench/'s client side: runs as the unprivileged bench user, never as root.

bench/run copies this file next to the workload and starts it with the
deployment's virtual environment. It uses only the public client library
(gfxbpf.client) and, for the ring-buffer consumer, gfxbpf.bpf's reader over
an fd it inherited. Every command prints JSON lines on stdout; commands that
hold something print {"ready": ...} first and then wait for a line (or EOF)
on stdin before going on.

  attach-latency PROGRAM N      N fresh attach+detach, then N joining a held one
  attach-each PROGRAM...        connect, wait for a line; attach each once (timed),
                                wait for a line, detach
  hold PROGRAM [--sessions K] [--drain]
  mapread PROGRAM MAP ROUNDS    read one map via fd batch and via gRPC
  consume FD IDLE               count ring-buffer records until IDLE s of quiet
  profile JSON                  one profile through the library call take_profile:
                                JSON holds a ProfileRequest's fields and "duration"
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import threading
import time
from typing import Any

from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.ringbuf import RingBuffer
from gfxbpf.client import Broker


def say(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def wait_for_driver() -> None:
    sys.stdin.readline()  # a line or EOF: either means go on


def attach_latency(program: str, n: int) -> None:
    """Client round trip of Attach: a fresh load each time (nobody else holds
    the instance), then joining an instance another session keeps alive."""
    fresh, joined = [], []
    with Broker.connect(via="fd") as b:
        for _ in range(n):
            t0 = time.perf_counter()
            att = b.attach(program, scope="system")
            fresh.append(time.perf_counter() - t0)
            assert not att.shared, "another session holds this program: not a fresh load"
            att.detach()
        with Broker.connect(via="fd") as holder:
            holder.attach(program, scope="system")
            for _ in range(n):
                t0 = time.perf_counter()
                att = b.attach(program, scope="system")
                joined.append(time.perf_counter() - t0)
                assert att.shared
                att.detach()
    say({"fresh_s": fresh, "joined_s": joined})


def attach_each(programs: list[str]) -> None:
    """One session attaches each program in turn: the time from request to
    attached (or the refusal), then waits for the driver to read the broker's
    memory before it detaches and goes on. Once connected it says so and waits
    too, so that the driver can read the broker's CPU time before the first."""
    with Broker.connect(via="fd") as b:
        say({"ready": True})
        wait_for_driver()
        for program in programs:
            t0 = time.perf_counter()
            try:
                att = b.attach(program, scope="system")
            except Exception as e:  # a program this host cannot run: reported, not fatal
                say({"program": program, "error": str(e)})
                wait_for_driver()
                continue
            say({"program": program, "attach_s": time.perf_counter() - t0})
            wait_for_driver()
            att.detach()


def hold(program: str, sessions: int, drain: bool) -> None:
    """Keep `sessions` sessions attached to program until told to stop; with
    drain, consume its event stream (as a user of `gfxclient stream` would)."""
    brokers = [Broker.connect(via="fd") for _ in range(sessions)]
    atts = [b.attach(program, scope="system") for b in brokers]
    counted = [0]
    stop = threading.Event()

    def consume() -> None:
        with atts[0].open_events() as stream:
            while not stop.is_set():
                counted[0] += len(stream.poll_raw(0.2))

    drainer = threading.Thread(target=consume) if drain else None
    if drainer:
        drainer.start()
    first = atts[0]
    map_ids = {
        name: bpfsys.map_info(m.fileno()).id for name, m in first.maps.items() if not m.is_events
    }
    say(
        {
            "ready": True,
            "prog_ids": [p.prog_id for p in first.programs],
            "map_ids": map_ids,
            "shared": [a.shared for a in atts],
        }
    )
    wait_for_driver()
    stop.set()
    if drainer:
        drainer.join()
    for b in brokers:
        b.close()
    say({"events": counted[0]})


def _timed_read(read: Any) -> tuple[float, int]:
    t0 = time.perf_counter()
    entries = len(read())
    return time.perf_counter() - t0, entries


def mapread(program: str, map_name: str, rounds: int) -> None:
    """Read one map, decoded, through its read-only fd (batch lookups) and
    through the broker's gRPC ReadMap; raw fd reads too, to show decoding.
    One round per line from the driver, its figures said at once: the driver
    runs its peer between rounds, so that both see the same load."""
    # Both attached before the workload runs: an fd client's instance is its
    # uid's alone (broker/attachments.py instance_uid), so the gRPC one is
    # another instance, which must count the same events to hold as many rows.
    with Broker.connect(via="fd") as fdb, Broker.connect(via="grpc") as gb:
        cmap = fdb.attach(program, scope="system").map(map_name)
        gmap = gb.attach(program, scope="system").map(map_name)
        say({"ready": True, "map_id": bpfsys.map_info(cmap.fileno()).id})
        for _ in range(rounds):
            wait_for_driver()
            fd_s, n_fd = _timed_read(cmap.read)
            raw_s, _ = _timed_read(cmap.raw_items)
            grpc_s, n_grpc = _timed_read(gmap.read)
            say({"entries_fd": n_fd, "entries_grpc": n_grpc, "fd_decoded_s": fd_s,
                 "fd_raw_s": raw_s, "grpc_decoded_s": grpc_s})  # fmt: skip
        wait_for_driver()  # held until the driver's last gfxclient dump has read it too


class _NoStop:
    """take_profile's Stopper that nothing sets: the profile ends with its duration."""

    stopped = False

    def wait(self, timeout: float) -> bool:
        time.sleep(timeout)
        return False


def profile(spec: str) -> None:
    """One profile taken as gfxclient profile takes it, through the library's
    one call, and what it holds."""
    from gfxbpf.client.profiles.engine.request import ProfileRequest
    from gfxbpf.client.profiles.engine.take import take_profile

    fields = json.loads(spec)
    duration = fields.pop("duration", None)
    t0 = time.perf_counter()
    taken = take_profile(
        ProfileRequest(**fields), lambda: Broker.connect(via="fd"), _NoStop(), duration
    )
    wall_s = time.perf_counter() - t0
    stacks, total = len(taken.profile.stacks), taken.profile.total()
    say({"stacks": stacks, "total": total, "lost": taken.lost, "read_s": taken.read_s,
         "wall_s": wall_s})  # fmt: skip


# bench.bpf.c's struct record {u64 ts; u64 nr;}, as a client decodes it.
_RECORD = struct.Struct("=QQ")


def consume(fd: int, idle: float, every: float = 0.0) -> None:
    """Decode records from a ring buffer this process holds only the fd of,
    in runs (RingBuffer.poll_runs), and time the reader's own CPU. every: read
    at most once per that many seconds (a periodic reader), else as they come."""
    received = 0
    first_at = last_at = 0.0
    say({"ready": True})
    cpu0 = time.process_time()
    with RingBuffer(fd) as rb:
        hard_stop = time.monotonic() + 600
        while time.monotonic() < hard_stop:
            runs = rb.poll_runs(idle)  # [] only after `idle` seconds with nothing committed
            now = time.monotonic()
            if not runs:
                if received:
                    break  # quiet: the producer is done
                continue
            if not received:
                first_at = now
            for run in runs:
                received += len(run.unpack(_RECORD))
            last_at = now
            if every:
                time.sleep(every)
    say({"received": received, "first_at": first_at, "last_at": last_at,
         "reader_cpu_s": time.process_time() - cpu0})  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("attach-latency")
    a.add_argument("program")
    a.add_argument("n", type=int)
    e = sub.add_parser("attach-each")
    e.add_argument("programs", nargs="+")
    h = sub.add_parser("hold")
    h.add_argument("program")
    h.add_argument("--sessions", type=int, default=1)
    h.add_argument("--drain", action="store_true")
    m = sub.add_parser("mapread")
    m.add_argument("program")
    m.add_argument("map")
    m.add_argument("rounds", type=int)
    c = sub.add_parser("consume")
    c.add_argument("fd", type=int)
    c.add_argument("idle", type=float)
    c.add_argument("every", type=float, nargs="?", default=0.0)
    sub.add_parser("profile").add_argument("spec")
    args = p.parse_args()
    if args.cmd == "attach-latency":
        attach_latency(args.program, args.n)
    elif args.cmd == "attach-each":
        attach_each(args.programs)
    elif args.cmd == "hold":
        hold(args.program, args.sessions, args.drain)
    elif args.cmd == "mapread":
        mapread(args.program, args.map, args.rounds)
    elif args.cmd == "profile":
        profile(args.spec)
    else:
        consume(args.fd, args.idle, args.every)


if __name__ == "__main__":
    main()
