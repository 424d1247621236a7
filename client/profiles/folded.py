"""Collapsed stacks ("folded"): one `root;...;leaf WEIGHT` line per stack, the
text flamegraph.pl and inferno read (and `perf script | stackcollapse-perf`
writes). The weight is the last space-separated field, so names may hold
spaces; the symbolizer keeps ';' and newlines out of them."""

from __future__ import annotations

from collections.abc import Iterable

from gfxbpf.client.profiles.model import Profile

__all__ = ["FoldedError", "format_folded", "parse_folded", "read_folded"]


class FoldedError(ValueError):
    pass


def format_folded(profile: Profile) -> str:
    lines = [f"{';'.join(frames)} {w}\n" for frames, w in sorted(profile.stacks.items()) if w > 0]
    return "".join(lines)


def parse_folded(lines: Iterable[str]) -> dict[tuple[str, ...], int]:
    """Folded text back to stacks; a stack seen twice adds up. Raises FoldedError
    naming the first bad line."""
    stacks: dict[tuple[str, ...], int] = {}
    for n, line in enumerate(lines, 1):
        line = line.rstrip("\n")
        if not line.strip():
            continue
        frames, _, count = line.rpartition(" ")
        try:
            weight = int(count)
        except ValueError:
            raise FoldedError(f"line {n}: {line[:80]!r} does not end in a count") from None
        if not frames:
            raise FoldedError(f"line {n}: no frames before the count")
        key = tuple(frames.split(";"))
        stacks[key] = stacks.get(key, 0) + weight
    return stacks


def read_folded(path: str) -> dict[tuple[str, ...], int]:
    with open(path, encoding="utf-8") as f:
        return parse_folded(f)
