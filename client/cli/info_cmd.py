"""gfxclient info: one program's description, attach points, maps and parameters."""

from __future__ import annotations

import argparse
from typing import TextIO

from gfxbpf.client.cli.connecting import connect
from gfxbpf.client.cli.list_cmd import listing_json
from gfxbpf.client.cli.output import dump_json
from gfxbpf.client.errors import EXIT_OK
from gfxbpf.client.handle import scope_name


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME")


def command(args: argparse.Namespace, out: TextIO) -> int:
    with connect(args) as broker:
        p = broker.program(args.name)
    if args.json:
        dump_json(listing_json(p), out)
        return EXIT_OK
    lines = [
        f"{p.name}: {p.description}",
        f"  sha256        {p.sha256}",
        f"  scopes        {', '.join(scope_name(s) for s in p.scopes) or '-'}",
        "  here          "
        + ("available" if p.available else f"unavailable: {p.unavailable_reason}"),
        "  attach points " + (", ".join(p.attach_points) or "-"),
    ]
    if p.requires:
        lines.insert(4, f"  needs         {p.requires}")
    if p.libraries:
        lines.append("  libraries     " + ", ".join(p.libraries))
    if p.parameters:
        lines.append("  parameters:")
        for x in p.parameters:
            req = "required" if x.required else "optional"
            lines.append(f"    --{x.name} ({x.type}, {req}): {x.description}")
    if p.maps:
        lines.append("  maps:")
        for m in p.maps:
            extra = ", ".join(x for x in (m.show, m.unit, m.key_label) if x)
            lines.append(f"    {m.name} ({extra}): {m.description}")
    else:
        lines.append("  maps          none a client can see")
    out.write("\n".join(lines) + "\n")
    return EXIT_OK
