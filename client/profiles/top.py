"""The hottest functions of a profile, by self and by total weight."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gfxbpf.client.printable import printable

if TYPE_CHECKING:
    from gfxbpf.client.profiles.model import Profile

__all__ = ["format_top", "top_functions"]

_UNIT_LABEL = {"samples": "samples", "calls": "calls", "nanoseconds": "ns"}


def top_functions(profile: Profile, n: int) -> list[tuple[str, int, int]]:
    """(name, self, total) of the n functions with the most self weight (total
    breaks ties). Self: weight of stacks the function is the innermost frame
    of; total: of stacks it appears in (once per stack, however deep it
    recurses). The root frame (the process name) is not a function."""
    self_w: dict[str, int] = {}
    total_w: dict[str, int] = {}
    for frames, w in profile.stacks.items():
        funcs = frames[1:] if len(frames) > 1 else frames
        self_w[funcs[-1]] = self_w.get(funcs[-1], 0) + w
        for name in set(funcs):
            total_w[name] = total_w.get(name, 0) + w
    ranked = sorted(total_w, key=lambda k: (-self_w.get(k, 0), -total_w[k], k))
    return [(k, self_w.get(k, 0), total_w[k]) for k in ranked[: max(n, 0)]]


def _seconds(ns: int) -> str:
    return f"{ns / 1e9:.3f}"


def _pct(part: int, whole: int) -> str:
    return f"{part * 100 / whole:5.1f}%" if whole else "    -"


def format_top(profile: Profile, n: int) -> str:
    """A table for the terminal: self and total weight with their shares. Only
    the table: the caller says what the profile covers and prints its notes.
    Names are escaped (printable): process and symbol names are other users'."""
    total = profile.total()
    unit = _UNIT_LABEL.get(profile.unit, profile.unit)
    show: Callable[[int], str] = str
    if profile.time_kind:  # off-CPU or wall-clock time: seconds read better than ns
        unit, show = "s", _seconds
    rows = top_functions(profile, n)
    width = max([len(show(total)), len(unit), 5])
    head = f"{'SELF':>6} {unit:>{width}}  {'TOTAL':>6} {unit:>{width}}  FUNCTION"
    lines = [head]
    for name, s, t in rows:
        self_w, total_w = show(s), show(t)
        lines.append(
            f"{_pct(s, total):>6} {self_w:>{width}}  {_pct(t, total):>6} {total_w:>{width}}  "
            f"{printable(name)}"
        )
    if not rows:
        lines.append(f"(no {unit})")
    return "\n".join(lines) + "\n"
