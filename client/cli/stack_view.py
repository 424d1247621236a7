"""Stack tables (BPF_MAP_TYPE_STACK_TRACE, e.g. profile's `stacks`) in
`gfxclient dump` and `gfxclient watch`.

A stack table holds thousands of rows of return addresses: as map rows they
are screens of hex that say nothing. dump and watch leave them out and point
to `gfxclient profile`, which names the frames; `gfxclient dump NAME MAP`
naming the table shows each stack as a short list of addresses.
"""

from __future__ import annotations

from typing import Any

from gfxbpf.client.handle import ClientMap
from gfxbpf.client.profiles import read as profile_read

# Addresses shown per stack in text; the rest are counted.
SHOWN_FRAMES = 8


def left_out(maps: list[ClientMap]) -> tuple[list[ClientMap], list[ClientMap]]:
    """(the maps to show as tables, the stack tables among them)."""
    return [m for m in maps if not m.is_stack_table], [m for m in maps if m.is_stack_table]


def pointer(m: ClientMap, program: str) -> str:
    """One line in place of a stack table's rows."""
    return (
        f"{m.name}: user stack table (return addresses, left out): "
        f"`gfxclient profile` names its frames; `gfxclient dump {program} {m.name}` "
        "lists the addresses"
    )


def read(m: ClientMap) -> list[tuple[int, tuple[int, ...]]]:
    """(stack id, user addresses innermost first), by id."""
    return sorted(profile_read.stack_table(m.raw_items()).items())


def lines(m: ClientMap, stacks: list[tuple[int, tuple[int, ...]]]) -> list[str]:
    """dump's text for a stack table named on the command line."""
    out = [f"{m.name} ({len(stacks)} stacks, innermost frame first; named: gfxclient profile)"]
    if not stacks:
        out.append("  (empty)")
    for sid, addrs in stacks:
        shown = " ".join(f"{a:#x}" for a in addrs[:SHOWN_FRAMES])
        more = f" … +{len(addrs) - SHOWN_FRAMES}" if len(addrs) > SHOWN_FRAMES else ""
        out.append(f"  {sid}: {len(addrs)} frames: {shown}{more}")
    return out


def as_json(m: ClientMap, stacks: list[tuple[int, tuple[int, ...]]]) -> dict[str, Any]:
    """dump --json's entry for a stack table named on the command line."""
    return {
        "show": "stacks",
        "description": m.description,
        "stacks": [{"id": sid, "frames": [f"{a:#x}" for a in addrs]} for sid, addrs in stacks],
    }
