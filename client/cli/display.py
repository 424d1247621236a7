"""Rendering maps for people: counter tables with rates, log2 histograms, units.

Pure functions over decoded map entries (no I/O except the Screen class), so
every piece is unit-tested. Map kinds follow the catalog's `show`:
- "counter": integer values, a table sorted by value with per-second rates;
- "table": struct values, one column per member, sorted by the first;
- "log2_histogram": keys end in `slot` (or are the slot), drawn like
  bpftrace's `hist()`: `[1KiB, 2KiB)   12 |@@@@      |`;
- "events": ring buffers, shown by `gfxclient stream`, not here.
Numbers read as people read them come from gfxbpf.client.humanize.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TextIO

from gfxbpf.client.humanize import BINARY as _BINARY
from gfxbpf.client.humanize import humanize_bytes, humanize_count, humanize_ns
from gfxbpf.client.mapdata import MapData
from gfxbpf.client.printable import json_printable, printable

BAR_WIDTH = 52  # bpftrace's histogram bar width
_COUNT_SUFFIX = ("K", "M", "G", "T", "P", "E")

KeyFormatter = Callable[[Any], str]


def format_value(value: Any, unit: str = "") -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return format_plain(value)
    if unit == "bytes":
        return humanize_bytes(value)
    if unit == "ns":
        return humanize_ns(value)
    return humanize_count(value)


def format_rate(rate: float | None, unit: str = "") -> str:
    """A per-second rate: '-' when unknown."""
    if rate is None:
        return "-"
    if unit == "bytes":
        return humanize_bytes(rate) + "/s"
    if unit == "ns":
        return humanize_ns(rate) + "/s"
    if abs(rate) >= 1000:
        return f"{rate:,.0f}/s"
    return f"{rate:,.1f}/s"


def _pow2_label(n: int, names: Sequence[str], small_suffix: str = "") -> str:
    """Exact power-of-two edges as bpftrace writes them: 1024 -> '1K' (or '1KiB')."""
    if n < 1024:
        return f"{n}{small_suffix}"
    i = -1
    while n >= 1024 and n % 1024 == 0 and i + 1 < len(names):
        n //= 1024
        i += 1
    return f"{n}{names[i]}"


def hist_edge(value: int, unit: str = "") -> str:
    """A bucket edge label: bytes '4KiB', ns '1.02µs', else bpftrace's '4K'."""
    if unit == "bytes":
        return _pow2_label(value, _BINARY, "B")
    if unit == "ns":
        return humanize_ns(value).replace(" ", "")
    return _pow2_label(value, _COUNT_SUFFIX)


def slot_bounds(slot: int) -> tuple[int, int]:
    """Slot s holds 2^s <= v < 2^(s+1); slot 0 also holds 0 (gfxbpf.h)."""
    return (0 if slot == 0 else 1 << slot), 1 << (slot + 1)


# ------------------------------------------------------------------ values and keys


def format_plain(value: Any) -> str:
    """A decoded value as text for a terminal (strings escaped: printable())."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        items = ", ".join(f"{printable(str(k))}: {format_plain(v)}" for k, v in value.items())
        return "{" + items + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(format_plain(v) for v in value) + "]"
    return str(value)


def format_key(key: Any) -> str:
    """A key for a table cell: a one-member struct shows its member; more: 'a=1, b=2'."""
    if isinstance(key, dict):
        if len(key) == 1:
            return format_key(next(iter(key.values())))
        return ", ".join(f"{printable(str(k))}={format_key(v)}" for k, v in key.items())
    return format_plain(key)


# Values JSON takes as they are (the common case: checked first, by exact type).
_PLAIN = frozenset({int, str, bool, type(None)})


def jsonable(value: Any) -> Any:
    """Decoded BTF values as JSON-compatible data (bytes become hex)."""
    if type(value) in _PLAIN:
        return value
    if isinstance(value, dict):
        return {
            k if type(k) is str else str(k): v if type(v) in _PLAIN else jsonable(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [v if type(v) in _PLAIN else jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def json_line(obj: Any) -> str:
    """obj as JSON text, with decoded BTF values inside written as jsonable()
    writes them, without a copy of every entry first (issue #15: 10,000-entry
    dumps). The C encoder takes the common case whole, bytes through its
    default hook; a non-finite float (jsonable writes it as a string) makes
    it refuse, and then the document goes through jsonable(). Decoded values'
    dict keys are member names, so the encoder's own key rules never apply."""
    try:
        text = json.dumps(
            obj, ensure_ascii=False, allow_nan=False, check_circular=False, default=_bytes_hex
        )
    except ValueError:
        text = json.dumps(jsonable(obj), ensure_ascii=False)
    return json_printable(text)


def _bytes_hex(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def key_id(key: Any) -> str:
    """A stable hashable identity for a decoded key (to match keys across snapshots)."""
    return json.dumps(jsonable(key), sort_keys=True)


# ------------------------------------------------------------------ snapshots


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def first_numeric_member(value: Any) -> str | None:
    if isinstance(value, dict):
        for k, v in value.items():
            if _number(v) is not None:
                return k
    return None


def rates(
    prev: MapData | None, cur: MapData, seconds: float
) -> dict[str, float | dict[str, float]]:
    """Per-second change of each key's value (struct values: of each numeric member).

    A key absent before counts from 0 (it appeared during the interval). A
    value that went down (map cleared, LRU eviction) has no meaningful rate
    and is left out.
    """
    if prev is None or seconds <= 0:
        return {}
    before = {key_id(k): v for k, v in prev.entries}
    out: dict[str, float | dict[str, float]] = {}
    for k, v in cur.entries:
        kid = key_id(k)
        old = before.get(kid)
        if isinstance(v, dict):
            members: dict[str, float] = {}
            for name, x in v.items():
                if _number(x) is None:
                    continue
                o = old.get(name, 0) if isinstance(old, dict) else 0
                o = o if _number(o) is not None else 0
                if x >= o:
                    members[name] = (x - o) / seconds
            out[kid] = members
        elif _number(v) is not None:
            o = old if _number(old) is not None else 0
            if v >= o:
                out[kid] = (v - o) / seconds
    return out


# ------------------------------------------------------------------ tables


def _layout(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> list[str]:
    """Columns padded to their widest cell; the first `left` columns left-aligned."""
    widths = [len(h) for h in header]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.ljust(widths[i]) if i < left else c.rjust(widths[i]) for i, c in enumerate(cells)
        ]
        return "  ".join(parts).rstrip()

    return [line(header)] + [line(r) for r in rows]


def render_counter(
    data: MapData,
    rate_map: dict[str, Any] | None = None,
    *,
    key_format: KeyFormatter = format_key,
    limit: int | None = None,
) -> list[str]:
    """A table sorted by value (largest first) with a per-second rate column."""
    rate_map = rate_map or {}
    rows = []
    ordered = sorted(data.entries, key=lambda kv: (-(_number(kv[1]) or 0), key_id(kv[0])))
    shown = ordered if limit is None else ordered[:limit]
    for k, v in shown:
        r = rate_map.get(key_id(k)) if rate_map else None
        rows.append(
            [
                key_format(k),
                format_value(v, data.unit),
                format_rate(r if isinstance(r, int | float) else None, data.unit),
            ]
        )
    label = (data.key_label or "key").upper()
    value_head = "COUNT" if data.unit in ("", "count") else data.unit.upper()
    if not rows:
        return [f"  (no entries yet under {label.lower()})"]
    out = ["  " + line for line in _layout([label, value_head, "RATE"], rows)]
    if len(shown) < len(ordered):
        out.append(f"  ... {len(ordered) - len(shown)} more")
    return out


def _member_unit(name: str, unit: str) -> str:
    if unit:
        return unit
    lowered = name.lower()
    if "bytes" in lowered or lowered.endswith("_size"):
        return "bytes"
    if lowered.endswith("_ns") or lowered.endswith("ns_total"):
        return "ns"
    return ""


def render_table(
    data: MapData,
    rate_map: dict[str, Any] | None = None,
    *,
    key_format: KeyFormatter = format_key,
    limit: int | None = None,
) -> list[str]:
    """Struct values: one column per member, sorted by the first numeric member,
    with the per-second rate of that member."""
    if not data.entries:
        return [f"  (no entries yet under {(data.key_label or 'key')})"]
    if not all(isinstance(v, dict) for _, v in data.entries):
        return render_counter(data, rate_map, key_format=key_format, limit=limit)
    rate_map = rate_map or {}
    members = list(data.entries[0][1].keys())
    sort_by = first_numeric_member(data.entries[0][1])
    ordered = sorted(
        data.entries,
        key=lambda kv: (-(_number(kv[1].get(sort_by)) or 0) if sort_by else 0, key_id(kv[0])),
    )
    shown = ordered if limit is None else ordered[:limit]
    header = [(data.key_label or "key").upper()] + [m.upper() for m in members]
    if sort_by:
        header.append(f"{sort_by.upper()}/S")
    rows = []
    for k, v in shown:
        row = [key_format(k)] + [format_value(v.get(m), _member_unit(m, "")) for m in members]
        if sort_by:
            r = rate_map.get(key_id(k))
            rr = r.get(sort_by) if isinstance(r, dict) else None
            row.append(format_rate(rr, _member_unit(sort_by, "")).removesuffix("/s"))
        rows.append(row)
    out = ["  " + line for line in _layout(header, rows)]
    if len(shown) < len(ordered):
        out.append(f"  ... {len(ordered) - len(shown)} more")
    return out


# ------------------------------------------------------------------ histograms


def split_histogram(entries: Iterable[tuple[Any, Any]]) -> dict[str, dict[int, int]]:
    """{group label: {slot: count}} from entries keyed by a slot or a struct ending in slot.

    The group label joins the key's other members (e.g. 'i915, ring0'); ""
    when the key is only the slot.
    """
    groups: dict[str, dict[int, int]] = {}
    for k, v in entries:
        count = _number(v)
        if count is None:
            continue
        if isinstance(k, dict):
            slot = k.get("slot")
            rest = [format_key(x) for name, x in k.items() if name != "slot"]
            label = ", ".join(rest)
        else:
            slot, label = k, ""
        if not isinstance(slot, int) or isinstance(slot, bool) or not 0 <= slot < 128:
            continue
        bucket = groups.setdefault(label, {})
        bucket[slot] = bucket.get(slot, 0) + int(count)
    return groups


def render_histogram(
    name: str,
    buckets: dict[int, int],
    unit: str = "",
    *,
    group: str = "",
    width: int = BAR_WIDTH,
) -> list[str]:
    """bpftrace's hist() layout: '@name[group]:' then '[lo, hi)  count |@@@  |'.

    Empty slots between the first and last used ones are shown (as zero);
    the bar of the largest bucket is `width` characters.
    """
    title = f"@{name}[{group}]:" if group else f"@{name}:"
    used = sorted(s for s, c in buckets.items() if c > 0)
    if not used:
        return [title, "  (empty)"]
    slots = range(used[0], used[-1] + 1)
    peak = max(buckets.get(s, 0) for s in slots)
    labels = []
    for s in slots:
        lo, hi = slot_bounds(s)
        labels.append(f"[{hist_edge(lo, unit)}, {hist_edge(hi, unit)})")
    label_w = max(len(x) for x in labels)
    counts = [buckets.get(s, 0) for s in slots]
    count_w = max(8, max(len(str(c)) for c in counts))
    width = max(width, 1)
    lines = [title]
    for label, c in zip(labels, counts, strict=True):
        bar = "@" * (c * width // peak if peak else 0)
        lines.append(f"{label.ljust(label_w)} {str(c).rjust(count_w)} |{bar.ljust(width)}|")
    return lines


def histogram_lines(
    data: MapData, *, width: int = BAR_WIDTH, key_format: KeyFormatter | None = None
) -> list[str]:
    groups = split_histogram(data.entries)
    if not groups:
        return [f"@{data.name}:", "  (empty)"]
    lines: list[str] = []
    # Busiest histogram first.
    for label in sorted(groups, key=lambda g: (-sum(groups[g].values()), g)):
        if lines:
            lines.append("")
        shown = key_format(label) if key_format and label else label
        lines.extend(
            render_histogram(data.name, groups[label], data.unit, group=shown, width=width)
        )
    return lines


def histogram_json(data: MapData) -> list[dict[str, Any]]:
    out = []
    for label, buckets in split_histogram(data.entries).items():
        for slot in sorted(buckets):
            lo, hi = slot_bounds(slot)
            out.append(
                {"key": label or None, "slot": slot, "low": lo, "high": hi, "value": buckets[slot]}
            )
    return out


# ------------------------------------------------------------------ frames


def render_map(
    data: MapData,
    rate_map: dict[str, Any] | None = None,
    *,
    key_format: KeyFormatter = format_key,
    limit: int | None = None,
    width: int = 100,
) -> list[str]:
    """One map's section: a heading and its table or histograms."""
    heading = data.name + (f" — {data.description}" if data.description else "")
    if data.show == "log2_histogram":
        bar = max(10, min(BAR_WIDTH, width - 34))
        return [heading, *histogram_lines(data, width=bar, key_format=key_format)]
    if data.show == "table":
        return [heading, *render_table(data, rate_map, key_format=key_format, limit=limit)]
    if data.show == "events":
        return [heading, "  (ring buffer of events: see `gfxclient stream`)"]
    return [heading, *render_counter(data, rate_map, key_format=key_format, limit=limit)]


def entries_json(
    data: MapData, rate_map: dict[str, Any] | None = None, key_format: KeyFormatter | None = None
) -> list[dict[str, Any]]:
    """A map's entries for `watch --json`: counters/tables sorted by value, with rates."""
    if data.show == "log2_histogram":
        return histogram_json(data)
    rate_map = rate_map or {}
    rows = []
    for k, v in data.entries:
        row: dict[str, Any] = {"key": jsonable(k), "value": jsonable(v)}
        if key_format is not None:
            label = key_format(k)
            if label != format_key(k):
                row["label"] = label
        r = rate_map.get(key_id(k))
        row["rate"] = r if r is not None else None
        rows.append(row)

    def sort_key(row: dict[str, Any]) -> Any:
        v = row["value"]
        if isinstance(v, dict):
            member = first_numeric_member(v)
            v = v.get(member) if member else 0
        return -(_number(v) or 0)

    rows.sort(key=sort_key)
    return rows


def clip(lines: list[str], width: int, height: int | None) -> list[str]:
    """Lines cut to the terminal, so a redraw never scrolls."""
    out = [ln if len(ln) <= width else ln[: max(width - 1, 0)] + "…" for ln in lines]
    if height is not None and len(out) > height:
        hidden = len(out) - (height - 1)
        out = out[: height - 1] + [f"... {hidden} more lines (enlarge the terminal)"[:width]]
    return out


def format_event(event: Any, timestamp: str = "") -> str:
    """One ring-buffer record as a line: 'HH:MM:SS.mmm pid=1 comm=bash ...';
    a value with a space or a quote is quoted, control characters escaped."""
    parts = [timestamp] if timestamp else []
    if isinstance(event, dict):
        for k, v in event.items():
            text = format_plain(v)
            if text == "" or any(c.isspace() for c in text) or '"' in text:
                text = '"' + text.replace('"', '\\"') + '"'
            parts.append(f"{printable(str(k))}={text}")
    else:
        parts.append(format_plain(event))
    return " ".join(parts)


# ------------------------------------------------------------------ terminal


HIDE_CURSOR = "\x1b[?25l"
SHOW_CURSOR = "\x1b[?25h"
ALT_SCREEN_ON = "\x1b[?1049h"
ALT_SCREEN_OFF = "\x1b[?1049l"
HOME = "\x1b[H"
CLEAR_SCREEN = "\x1b[2J"
CLEAR_EOL = "\x1b[K"
CLEAR_BELOW = "\x1b[J"


class Screen:
    """A full-screen view in plain ANSI: the alternate screen, cursor hidden, redraws
    from home. stop() always restores the cursor and the normal screen."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.active = False

    def start(self) -> None:
        self._write(ALT_SCREEN_ON + HIDE_CURSOR + HOME + CLEAR_SCREEN)
        self.active = True

    def draw(self, lines: Sequence[str]) -> None:
        # One write per frame: the terminal never shows half a frame for long.
        # Lines are escaped again here: only this class's own sequences go out raw.
        lines = [printable(ln) for ln in lines]
        body = "".join(f"{ln}{CLEAR_EOL}\n" for ln in lines[:-1])
        if lines:
            body += lines[-1] + CLEAR_EOL
        self._write(HOME + body + CLEAR_BELOW)

    def stop(self) -> None:
        if self.active:
            self.active = False
            self._write(SHOW_CURSOR + ALT_SCREEN_OFF)

    def _write(self, text: str) -> None:
        try:
            self.out.write(text)
            self.out.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def __enter__(self) -> Screen:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
