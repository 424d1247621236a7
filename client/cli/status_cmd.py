"""gfxclient status: the broker's version, the kernel's features, the caller's
attachments and their programs' run counts.
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from gfxbpf.bpf.consts import SCOPES
from gfxbpf.client.broker import client_version
from gfxbpf.client.cli.arguments import nonnegative_number
from gfxbpf.client.cli.connecting import connect, sleep_renewing
from gfxbpf.client.cli.display import humanize_ns
from gfxbpf.client.cli.output import dump_json
from gfxbpf.client.cli.stopping import StopSignal
from gfxbpf.client.errors import EXIT_OK
from gfxbpf.client.handle import Attachment
from gfxbpf.client.humanize import user_name
from gfxbpf.proto import gfxbpf_pb2 as pb


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--attach",
        action="append",
        default=[],
        metavar="NAME",
        help="attach NAME for the report (repeatable)",
    )
    p.add_argument("--scope", choices=SCOPES, help="scope for --attach")
    p.add_argument(
        "--wait",
        type=nonnegative_number,
        default=1.0,
        metavar="S",
        help="after --attach (default 1)",
    )


def command(args: argparse.Namespace, out: TextIO) -> int:
    with StopSignal() as stop, connect(args) as broker:
        hello = broker.hello()
        for name in args.attach:
            broker.attach(name, scope=args.scope)
        if args.attach and args.wait:
            sleep_renewing(stop, args.wait, broker)
        stats = broker.stats(0)
        atts = broker.attachments
        where = broker.socket_path if broker.via == "fd" else broker.grpc_address
    programs = _program_stats(stats)
    if args.json:
        doc = _status_doc(hello, broker.via, where, atts, stats, programs)
        dump_json(doc, out)
        return EXIT_OK
    yn = {True: "yes", False: "no"}
    lines = [
        f"broker      {hello.broker_version or '?'} (protocol {hello.protocol})",
        f"kernel      {hello.kernel_release or '?'}, {hello.possible_cpus} possible CPUs",
        f"features    direct map reads: {yn[hello.features.direct_map_reads]}, "
        f"bpf stats: {yn[hello.features.bpf_stats]}",
        f"you         uid {hello.uid} ({user_name(hello.uid)}), gid {hello.gid}"
        + (f", pid {hello.pid}" if hello.pid else ""),
        f"transport   {broker.via} ({where}), gfxclient {client_version()}",
    ]
    if atts:
        lines.append("attachments (this session):")
        for a in atts:
            lines.append(
                f"  #{a.id} {a.program}  scope {a.scope}  shared {yn[a.shared]}  "
                f"maps {', '.join(a.maps) or '-'}"
            )
    if programs:
        lines.append("programs:")
        lines.extend(_program_table(programs))
        if not stats.stats_enabled:
            lines.append("  (run counts stay 0: kernel.bpf_stats_enabled is off)")
    else:
        lines.append(
            "programs    none attached"
            + ("" if args.attach else " (gfxclient status --attach NAME reports one)")
        )
    out.write("\n".join(lines) + "\n")
    return EXIT_OK


def _program_stats(stats: pb.StatsReply) -> list[dict[str, Any]]:
    """One dict per attached program: run counts and times (avg_ns None before a run)."""
    programs = []
    for s in stats.programs:
        avg = s.run_time_ns / s.run_cnt if s.run_cnt else None
        programs.append(
            {
                "attachment_id": s.attachment_id,
                "program": s.program,
                "function": s.function,
                "prog_id": s.prog_id,
                "run_cnt": s.run_cnt,
                "run_time_ns": s.run_time_ns,
                "avg_ns": avg,
                "recursion_misses": s.recursion_misses,
            }
        )
    return programs


def _status_doc(
    hello: pb.HelloReply,
    via: str,
    where: str | None,
    atts: list[Attachment],
    stats: pb.StatsReply,
    programs: list[dict[str, Any]],
) -> dict[str, Any]:
    """gfxclient status --json."""
    return {
        "broker_version": hello.broker_version,
        "protocol": hello.protocol,
        "kernel_release": hello.kernel_release,
        "features": {
            "direct_map_reads": hello.features.direct_map_reads,
            "bpf_stats": hello.features.bpf_stats,
        },
        "possible_cpus": hello.possible_cpus,
        "caller": {"uid": hello.uid, "gid": hello.gid, "pid": hello.pid},
        "via": via,
        "address": where,
        "client_version": client_version(),
        "attachments": [
            {
                "attachment_id": a.id,
                "program": a.program,
                "scope": a.scope,
                "shared": a.shared,
                "maps": list(a.maps),
            }
            for a in atts
        ],
        "stats_enabled": stats.stats_enabled,
        "programs": programs,
    }


def _program_table(programs: list[dict[str, Any]]) -> list[str]:
    """The programs' run counts as aligned text rows, with a header."""
    rows = [
        [
            str(p["attachment_id"]),
            p["program"],
            p["function"],
            str(p["prog_id"]),
            f"{p['run_cnt']:,}",
            humanize_ns(p["avg_ns"]) if p["avg_ns"] is not None else "-",
        ]
        for p in programs
    ]
    header = ["ATTACHMENT", "PROGRAM", "FUNCTION", "PROG ID", "RUNS", "AVG/RUN"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  "
        + "  ".join(c.ljust(widths[i]) if i < 3 else c.rjust(widths[i]) for i, c in enumerate(r))
        for r in [header, *rows]
    ]
