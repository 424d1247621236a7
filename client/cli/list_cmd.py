"""gfxclient list: the programs the caller may use, and why one cannot run here."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from gfxbpf.client.cli.connecting import connect
from gfxbpf.client.cli.output import dump_json
from gfxbpf.client.errors import EXIT_OK
from gfxbpf.client.handle import scope_name
from gfxbpf.proto import gfxbpf_pb2 as pb


def listing_json(p: pb.ProgramListing) -> dict[str, Any]:
    return {
        "name": p.name,
        "description": p.description,
        "sha256": p.sha256,
        "scopes": [scope_name(s) for s in p.scopes],
        "available": p.available,
        "unavailable_reason": p.unavailable_reason or None,
        "requires": p.requires or None,
        "attach_points": list(p.attach_points),
        "libraries": list(p.libraries),
        "parameters": [
            {"name": x.name, "type": x.type, "required": x.required, "description": x.description}
            for x in p.parameters
        ],
        "maps": [
            {
                "name": m.name,
                "show": m.show,
                "unit": m.unit or None,
                "key_label": m.key_label or None,
                "description": m.description,
                "event_type": m.event_type or None,
            }
            for m in p.maps
        ],
    }


def command(args: argparse.Namespace, out: TextIO) -> int:
    with connect(args) as broker:
        programs = broker.list_programs()
    if args.json:
        dump_json({"programs": [listing_json(p) for p in programs]}, out)
        return EXIT_OK
    if not programs:
        out.write(
            "No programs: the policy names none for you. Ask your administrator to add "
            "you to the policy.\n"
        )
        return EXIT_OK
    rows = [
        [
            p.name,
            ",".join(scope_name(s) for s in p.scopes) or "-",
            "ok" if p.available else "unavailable",
            p.description,
        ]
        for p in programs
    ]
    widths = [max(len(r[i]) for r in [["NAME", "SCOPES", "HERE", ""], *rows]) for i in range(3)]
    header = ["NAME", "SCOPES", "HERE", "DESCRIPTION"]
    for r in [header, *rows]:
        out.write("  ".join(c.ljust(widths[i]) for i, c in enumerate(r[:3])) + "  " + r[3] + "\n")
    unavailable = [p for p in programs if not p.available]
    if unavailable:
        out.write("\nCannot run on this host:\n")
        for p in unavailable:
            out.write(f"  {p.name}: {p.unavailable_reason or 'unavailable (no reason given)'}\n")
    return EXIT_OK
