"""From the catalog's map roles to Prometheus metric families (pure: no I/O).

One rule per `show` (catalog/catalog.toml), so a new program maps with no code change:

Names are `gfxbpf_<program>_<map>` (a map named `<program>_x` gives
`gfxbpf_<program>_x`), then:

- "counter": a counter `gfxbpf_<program>_<map>[_<unit>]_total`, one series per
  key; values in ns become `_seconds` (divided by 1e9), bytes keep `_bytes`.
  A map already named for its unit is not named twice (cuda's time_ns gives
  `gfxbpf_cuda_time_seconds_total`, its bytes `gfxbpf_cuda_bytes_total`).
- "log2_histogram": a histogram `gfxbpf_<program>_<map>_<unit>` (`_seconds`,
  `_bytes`; no suffix for plain counts) with `le` at the slots' upper edges,
  2^(s+1) (slot s counts 2^s <= v < 2^(s+1)); `_count` is the +Inf bucket. No
  `_sum`: a log2 histogram does not keep one, and an estimate would mislead.
- "table": one metric per numeric member of the value struct (BTF member
  names; where the catalog lists the map's `metrics`, only those: a lookup
  table such as py_codes lists none, cudakernels' refused only its polls and
  the time of the last): a counter (the catalog's tables accumulate) unless the member is
  named like a level (one of its `_`-separated words is in LEVEL_WORDS: cur,
  live, peak, depth, max, ...), which becomes a gauge (cuda's memory live
  and peak). A member with `bytes` in its name gets the `_bytes` unit; a
  member ending in `_ns` becomes `_seconds`.
- "events": a counter `gfxbpf_<program>_<map>_total` of records consumed.

Per-CPU maps arrive summed over CPUs (gfxbpf.client.mapdata.MapData). An
array holds every key from the start, so a counter (or a histogram's label
set) still at 0 is left out until it counts something.

Labels come from the key: a scalar key is labelled by the catalog's key_label,
a struct key by its BTF member names (a histogram's `slot` member excepted);
a process (tgid) is `pid`. Syscall numbers become names; a function index
becomes the function's name (Functions: ucalls' configured functions, or a
function table's, which adds each function's role and copy direction).
Each metric keeps at most `limit` series (histograms: label sets), the
largest first; the rest are counted as dropped.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from gfxbpf.client.syscalls import syscall_name

PREFIX = "gfxbpf"
# unit -> (metric name suffix, factor from the map's values to the base unit)
UNITS: dict[str, tuple[str, float]] = {
    "ns": ("seconds", 1e-9),
    "bytes": ("bytes", 1.0),
    "count": ("", 1.0),
    "": ("", 1.0),
}
# Member-name words that mean a level (a gauge), not an accumulation.
LEVEL_WORDS = frozenset(
    {"cur", "current", "live", "peak", "inflight", "depth", "level", "max", "min", "last"}
)
MAX_SLOT = 127
# Key labels named as people say them: the kernel's tgid (and the catalog's
# "process") is what ps and nvidia-smi call a pid.
LABEL_ALIASES = {"tgid": "pid", "process": "pid"}


def sanitize(text: str) -> str:
    """A Prometheus name fragment: [a-zA-Z0-9_], not starting with a digit."""
    out = re.sub(r"[^a-zA-Z0-9_]+", "_", text).strip("_").lower()
    if not out:
        return "key"
    return "_" + out if out[0].isdigit() else out


@dataclass(frozen=True)
class MapShape:
    """What the mapping needs to know about one visible map (catalog + BTF)."""

    program: str
    map: str
    show: str
    unit: str = ""
    key_label: str = ""
    value_members: tuple[str, ...] = ()  # numeric members of a struct value ("table")
    description: str = ""  # the catalog's, for HELP

    @property
    def base(self) -> str:
        """gfxbpf_<program>_<map>, without repeating the program (fence_latency of fence)."""
        short = self.map.removeprefix(self.program + "_")
        return _name(self.program, short)


@dataclass(frozen=True)
class MetricSpec:
    """One Prometheus metric family a map feeds."""

    kind: str  # "counter", "gauge", "histogram"
    name: str  # the family name (a counter's samples add _total)
    help: str
    member: str | None = None  # "table": the value member it reads
    scale: float = 1.0

    def sample_names(self) -> set[str]:
        """The names its samples carry in a scrape."""
        if self.kind == "counter":
            return {self.name + "_total"}
        if self.kind == "histogram":
            return {self.name + "_bucket", self.name + "_count"}
        return {self.name}


def _member_unit(member: str) -> tuple[str, str, float]:
    """(member name without its unit, unit suffix, scale) for a table member."""
    if member.endswith("_ns"):
        return member[: -len("_ns")], "seconds", 1e-9
    if "bytes" in member.split("_"):
        # bound_bytes -> bound + _bytes; bytes alone -> _bytes, not _bytes_bytes
        return "_".join(p for p in member.split("_") if p != "bytes"), "bytes", 1.0
    return member, "", 1.0


def _name(*parts: str) -> str:
    return "_".join(sanitize(p) for p in (PREFIX, *parts) if p)


def _join(*parts: str) -> str:
    return "_".join(p for p in parts if p)


def metric_specs(shape: MapShape) -> list[MetricSpec]:
    """The metric families one map feeds (an unknown show or unit feeds none)."""
    where = f"{shape.program} {shape.map}: {shape.description or shape.show}"
    if shape.show == "events":
        return [MetricSpec("counter", shape.base, f"{where} (records)")]
    if shape.show in ("counter", "log2_histogram"):
        if shape.unit not in UNITS:
            return []
        suffix, scale = UNITS[shape.unit]
        kind = "counter" if shape.show == "counter" else "histogram"
        base = shape.base
        if suffix and base.endswith("_" + shape.unit):
            base = base[: -len(shape.unit) - 1]  # time_ns -> time_seconds, bytes -> bytes once
        return [MetricSpec(kind, _join(base, suffix), where, None, scale)]
    if shape.show == "table":
        specs = []
        for member in shape.value_members:
            base, suffix, scale = _member_unit(member)
            kind = "gauge" if LEVEL_WORDS & set(member.lower().split("_")) else "counter"
            name = _join(shape.base, sanitize(base) if base else "", suffix)
            specs.append(MetricSpec(kind, name, f"{where} ({member})", member, scale))
        return specs
    return []


def numeric_members(value: Any) -> tuple[str, ...]:
    """The numeric members of a decoded struct value (a table's columns)."""
    if not isinstance(value, dict):
        return ()
    return tuple(
        k for k, v in value.items() if isinstance(v, int | float) and not isinstance(v, bool)
    )


def table_members(value: Any, listed: Sequence[str] | None) -> tuple[str, ...]:
    """A table's metrics: its value's numeric members, only those the catalog
    lists (in its order) where it lists some (`metrics`; None: it lists none)."""
    members = numeric_members(value)
    return members if listed is None else tuple(m for m in listed if m in members)


# ------------------------------------------------------------------ labels


def _label_value(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    return str(value)


@dataclass(frozen=True)
class Functions:
    """How a key's function index reads: the function's name and, for a
    program whose functions come from a table (cuda), the labels the table
    gives every function (role, direction; "" where one has none, so that
    every series of a metric carries the same label names)."""

    names: tuple[str, ...] = ()
    attributes: tuple[str, ...] = ()  # label names after "function"
    values: tuple[tuple[str, ...], ...] = ()  # per index: one value per attribute

    def labels(self, index: int) -> list[tuple[str, str]]:
        known = 0 <= index < len(self.names)
        name = self.names[index] if known else str(index)
        extra = self.values[index] if known and index < len(self.values) else ()
        return [("function", name)] + [
            (a, extra[i] if i < len(extra) else "") for i, a in enumerate(self.attributes)
        ]


NO_FUNCTIONS = Functions()


def _member_labels(name: str, value: Any, functions: Functions) -> list[tuple[str, str]]:
    """Numbers as people know them: syscall numbers as names, function indexes as names."""
    name = LABEL_ALIASES.get(name, name)
    if isinstance(value, int) and not isinstance(value, bool):
        if name == "syscall":
            return [(name, syscall_name(value))]
        if name == "function":
            return functions.labels(value)
    return [(name, _label_value(value))]


def key_labels(
    key: Any, key_label: str, functions: Functions = NO_FUNCTIONS, *, histogram: bool = False
) -> list[tuple[str, str]]:
    """[(label name, value)] for one decoded key; a histogram's slot is left out."""
    if isinstance(key, dict):
        out = []
        for member, value in key.items():
            if histogram and member == "slot":
                continue
            out.extend(_member_labels(sanitize(member), value, functions))
        return out
    if histogram:
        return []
    return _member_labels(sanitize(key_label) if key_label else "key", key, functions)


def _safe_names(names: Iterable[str], histogram: bool) -> list[str]:
    # "le" belongs to the histogram; a key member named so is renamed.
    return [n + "_key" if histogram and n == "le" else n for n in names]


def _slot(key: Any) -> int | None:
    slot = key.get("slot") if isinstance(key, dict) else key
    if isinstance(slot, int) and not isinstance(slot, bool) and 0 <= slot <= MAX_SLOT:
        return slot
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


# ------------------------------------------------------------------ families


@dataclass
class Built:
    """The families of one map, and how many series each left out."""

    families: list[Metric]
    dropped: dict[str, int]


def _top(series: dict[tuple[str, ...], float], limit: int) -> tuple[list[Any], int]:
    """The `limit` largest series, in label order; how many were left out."""
    ranked = sorted(series.items(), key=lambda kv: (-kv[1], kv[0]))
    kept = sorted(ranked[:limit])
    return kept, max(0, len(ranked) - limit)


def _scalar_family(
    spec: MetricSpec, entries: Sequence[tuple[Any, Any]], shape: MapShape, functions: Functions
) -> tuple[list[str], dict[tuple[str, ...], float]]:
    names: list[str] | None = None
    series: dict[tuple[str, ...], float] = {}
    for key, value in entries:
        raw = value.get(spec.member) if spec.member and isinstance(value, dict) else value
        number = _number(raw)
        if number is None or (number == 0 and spec.kind == "counter"):
            continue  # arrays hold every key: a counter still at 0 is no series yet
        labels = key_labels(key, shape.key_label, functions)
        if names is None:
            names = [n for n, _ in labels]
        values = tuple(v for _, v in labels)
        series[values] = series.get(values, 0.0) + number * spec.scale
    return names or [], series


def scalar_family(
    spec: MetricSpec,
    shape: MapShape,
    entries: Sequence[tuple[Any, Any]],
    limit: int,
    functions: Functions = NO_FUNCTIONS,
) -> tuple[Metric, int]:
    """A counter or gauge family over (key, value) entries; (family, series dropped)."""
    names, series = _scalar_family(spec, entries, shape, functions)
    kept, dropped = _top(series, limit)
    family: Metric
    if spec.kind == "counter":
        family = CounterMetricFamily(spec.name, spec.help, labels=names)
    else:
        family = GaugeMetricFamily(spec.name, spec.help, labels=names)
    for values, number in kept:
        family.add_metric(list(values), number)
    return family, dropped


def split_slots(
    entries: Sequence[tuple[Any, Any]], shape: MapShape, functions: Functions = NO_FUNCTIONS
) -> tuple[list[str], dict[tuple[str, ...], dict[int, int]]]:
    """(label names, {label values: {slot: count}}) of a log2 histogram's entries."""
    names: list[str] | None = None
    groups: dict[tuple[str, ...], dict[int, int]] = {}
    for key, value in entries:
        slot, count = _slot(key), _number(value)
        if slot is None or count is None:
            continue
        labels = key_labels(key, shape.key_label, functions, histogram=True)
        if names is None:
            names = _safe_names((n for n, _ in labels), histogram=True)
        bucket = groups.setdefault(tuple(v for _, v in labels), {})
        bucket[slot] = bucket.get(slot, 0) + int(count)
    return names or [], groups


def histogram_family(
    spec: MetricSpec,
    shape: MapShape,
    entries: Sequence[tuple[Any, Any]],
    limit: int,
    functions: Functions = NO_FUNCTIONS,
) -> tuple[Metric, int]:
    """A histogram family: every label set gets buckets up to the map's highest slot."""
    names, groups = split_slots(entries, shape, functions)
    totals = {labels: float(sum(s.values())) for labels, s in groups.items() if sum(s.values())}
    kept, dropped = _top(totals, limit)
    top = max((max(s) for s in groups.values() if s), default=-1)
    edges = [floatToGoString((1 << (s + 1)) * spec.scale) for s in range(top + 1)]
    family = HistogramMetricFamily(spec.name, spec.help, labels=names)
    for values, total in kept:
        slots = groups[values]
        running, buckets = 0, []
        for s, edge in enumerate(edges):
            running += slots.get(s, 0)
            buckets.append((edge, float(running)))
        buckets.append(("+Inf", total))
        family.add_metric(list(values), buckets, None)
        # _count without _sum (prometheus_client pairs them; see the module doc).
        family.add_sample(spec.name + "_count", dict(zip(names, values, strict=True)), total)
    return family, dropped


def build(
    shape: MapShape,
    entries: Sequence[tuple[Any, Any]],
    limit: int,
    functions: Functions = NO_FUNCTIONS,
) -> Built:
    """Every family one table-like map feeds, from its decoded (per-CPU summed) entries."""
    out = Built([], {})
    for spec in metric_specs(shape):
        if spec.kind == "histogram":
            family, dropped = histogram_family(spec, shape, entries, limit, functions)
        else:
            family, dropped = scalar_family(spec, shape, entries, limit, functions)
        out.families.append(family)
        if dropped:
            out.dropped[spec.name] = dropped
    return out


def events_family(spec: MetricSpec, count: int) -> Metric:
    family = CounterMetricFamily(spec.name, spec.help)
    family.add_metric([], float(count))
    return family
