"""gfxclient stream: a program's events as lines or JSON lines (Ctrl-C to stop)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, TextIO

from gfxbpf.client.cli.arguments import PROG, add_attach_arguments, count, positive_number
from gfxbpf.client.cli.connecting import attach, connect
from gfxbpf.client.cli.display import format_event, jsonable
from gfxbpf.client.cli.stopping import StopSignal
from gfxbpf.client.errors import EXIT_OK
from gfxbpf.client.printable import json_printable, printable


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_attach_arguments(p)
    p.add_argument("--duration", type=positive_number, metavar="S", help="stop after S seconds")
    p.add_argument("--max", type=count, metavar="N", help="stop after N events")
    p.add_argument("--map", metavar="MAP", help="the ring buffer (default: the only one)")


def command(args: argparse.Namespace, out: TextIO) -> int:
    with StopSignal() as stop, connect(args) as broker:
        att = attach(broker, args)
        stream = att.open_events(args.map, args.max or 0)
        ring = stream.map.name
        print(
            f"{PROG}: streaming {att.program} events from {ring} (attachment {att.id}, "
            f"via {broker.via}); Ctrl-C to stop",
            file=sys.stderr,
            flush=True,
        )
        deadline = None if args.duration is None else time.monotonic() + args.duration
        reported_lost = 0
        try:
            while not stop.stopped and not stream.ended:
                timeout = 0.25
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    timeout = min(timeout, left)
                records = stream.poll(timeout)
                if records:
                    stamp = time.time()
                    for rec in records:
                        out.write(_event_text(args, att.program, ring, rec, stamp) + "\n")
                    out.flush()
                if stream.lost > reported_lost:
                    print(
                        f"{PROG}: {stream.lost - reported_lost} events lost "
                        "(the consumer fell behind)",
                        file=sys.stderr,
                    )
                    reported_lost = stream.lost
        finally:
            stream.close()
    return EXIT_OK


def _event_text(args: argparse.Namespace, program: str, ring: str, rec: Any, stamp: float) -> str:
    if args.json:
        obj = {"timestamp": stamp, "program": program, "map": ring, "event": jsonable(rec)}
        return json_printable(json.dumps(obj, ensure_ascii=False))
    ms = int((stamp % 1) * 1000)
    line = format_event(rec, time.strftime("%H:%M:%S", time.localtime(stamp)) + f".{ms:03d}")
    return printable(line)
