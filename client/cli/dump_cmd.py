"""gfxclient dump: one snapshot of every visible map of an attachment, decoded with BTF."""

from __future__ import annotations

import argparse
import time
from typing import Any, TextIO

from gfxbpf.client.cli import stack_view
from gfxbpf.client.cli.arguments import add_attach_arguments, function_names, nonnegative_number
from gfxbpf.client.cli.connecting import attach, connect, sleep_renewing
from gfxbpf.client.cli.display import format_key, format_plain, format_value, histogram_lines
from gfxbpf.client.cli.output import dump_json, key_formatter, write_lines
from gfxbpf.client.cli.stopping import StopSignal
from gfxbpf.client.errors import EXIT_OK, UsageError
from gfxbpf.client.handle import Attachment, ClientMap
from gfxbpf.client.mapdata import MapData, sum_cpus


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_attach_arguments(p)
    p.add_argument("map", metavar="MAP", nargs="?", help="only this map")
    p.add_argument(
        "--wait", type=nonnegative_number, default=0.0, metavar="S", help="collect S seconds first"
    )


def command(args: argparse.Namespace, out: TextIO) -> int:
    with StopSignal() as stop, connect(args) as broker:
        att = attach(broker, args)
        if args.map is not None:
            cmap = att.map(args.map)
            if cmap.is_events:
                raise UsageError(
                    f"{args.map} is a ring buffer of events: use `gfxclient stream {args.name}`"
                )
            maps = [cmap]
        else:
            maps = att.table_maps()
        if args.wait:
            sleep_renewing(stop, args.wait, broker)
        functions = function_names(args)
        stamp = time.time()
        maps, stack_tables = stack_view.left_out(maps)
        snaps = [(m, m.read()) for m in maps]
        # Named on the command line: its stacks; else a pointer in place of its rows.
        stacks = [(m, stack_view.read(m)) for m in stack_tables] if args.map else []
        left_out = [] if args.map else stack_tables
        events_only = [m.name for m in att.event_maps()] if args.map is None else []
    if args.json:
        doc = _dump_doc(att, snaps, events_only, stamp)
        doc["maps"].update({m.name: stack_view.as_json(m, s) for m, s in stacks})
        doc["stack_tables_left_out"] = [m.name for m in left_out]
        dump_json(doc, out)
        return EXIT_OK
    lines = _dump_lines(att, snaps, functions)
    for m, s in stacks:
        lines += ["", *stack_view.lines(m, s)]
    for m in left_out:
        lines += ["", stack_view.pointer(m, args.name)]
    for name in events_only:
        lines.append("")
        lines.append(f"{name}: ring buffer of events (gfxclient stream {args.name})")
    write_lines(out, lines)
    return EXIT_OK


Snapshot = list[tuple[ClientMap, list[tuple[Any, Any]]]]


def _dump_doc(
    att: Attachment, snaps: Snapshot, events_only: list[str], stamp: float
) -> dict[str, Any]:
    """gfxclient dump --json: the maps' decoded entries."""
    return {
        "timestamp": stamp,
        "program": att.program,
        "sha256": att.sha256,
        "scope": att.scope,
        "maps": {
            m.name: {
                "show": m.show,
                "unit": m.unit,
                "key_label": m.key_label,
                "description": m.description,
                "per_cpu": m.per_cpu,
                # Decoded values as they are: dump_json writes them (json_line).
                "entries": [{"key": k, "value": v} for k, v in entries],
            }
            for m, entries in snaps
        },
        "event_maps": events_only,
    }


def _dump_lines(att: Attachment, snaps: Snapshot, functions: list[str]) -> list[str]:
    """gfxclient dump: each table map's entries, largest first (histograms drawn)."""
    lines = [f"{att.program} (sha256 {att.sha256[:16]}…, scope {att.scope})"]
    for m, entries in snaps:
        what = ", ".join(x for x in (m.show, m.unit, m.key_label and f"key {m.key_label}") if x)
        lines.append("")
        lines.append(f"{m.name} ({what}): {m.description}" if m.description else m.name)
        fmt = key_formatter(att, m, functions)
        if m.show == "log2_histogram":
            # From the snapshot: the attachment (and its map fds) is gone by now.
            data = MapData(m.name, m.show, m.unit, m.key_label, m.description)
            data.entries = [(k, sum_cpus(v)) for k, v in entries]
            lines.extend(histogram_lines(data, key_format=fmt))
            continue
        if not entries:
            lines.append("  (empty)")
        for k, v in _by_value(entries):
            shown = fmt(k)
            if shown != format_key(k):
                shown = f"{shown} ({format_key(k)})"
            value = format_value(v, m.unit) if not isinstance(v, dict | list) else format_plain(v)
            lines.append(f"  {shown}: {value}")
    return lines


def _by_value(entries: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Largest first: ints by value, structs by their first numeric member."""

    def weight(v: Any) -> float:
        v = sum_cpus(v)
        if isinstance(v, dict):
            v = next((x for x in v.values() if isinstance(x, int | float)), 0)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0

    return sorted(entries, key=lambda kv: -weight(kv[1]))
