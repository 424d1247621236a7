"""`gfxclient watch cuda`: find the target's libcuda, and show the program's
maps as people think of CUDA work: launches, copies by direction, device
memory live and peak, time blocked in synchronization.

The function table (gfxbpf.catalog.cuda_api) names the map keys: the broker
attaches by the same table, and a key's function member is its index.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gfxbpf.catalog import cuda_api
from gfxbpf.client.cli.display import (
    clip,
    format_key,
    histogram_lines,
    humanize_bytes,
    humanize_count,
    humanize_ns,
)
from gfxbpf.client.libcuda import FUNCTION_NAMES, PROGRAM, function_of
from gfxbpf.client.mapdata import MapData

_ARROWS = {"htod": "H→D", "dtoh": "D→H", "dtod": "D→D", "any": "unified"}


@dataclass
class ProcessView:
    """One process's figures, summed over the table's functions."""

    pid: int
    functions: dict[str, dict[str, int]] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)

    def total(self, role: str, what: str, direction: str | None = None) -> int:
        out = 0
        for i in cuda_api.by_role(role):
            fn = cuda_api.FUNCTIONS[i]
            if direction is not None and fn.direction != direction:
                continue
            out += self.functions.get(fn.name, {}).get(what, 0)
        return out

    def summary(self) -> dict[str, Any]:
        copies = {
            d: {"calls": self.total("copy", "calls", d), "bytes": self.total("copy", "bytes", d)}
            for d in cuda_api.DIRECTIONS
        }
        return {
            "launches": self.total("launch", "calls"),
            "launch_ns": self.total("launch", "time_ns"),
            "copies": copies,
            "copy_ns": self.total("copy", "time_ns"),
            "allocations": self.total("alloc", "calls"),
            "frees": self.total("free", "calls"),
            "memory": dict(self.memory),
            "sync_calls": self.total("sync", "calls"),
            "sync_ns": self.total("sync", "time_ns"),
            "errors": sum(v.get("errors", 0) for v in self.functions.values()),
            "functions": {name: dict(v) for name, v in sorted(self.functions.items())},
        }


def processes(snap: dict[str, MapData]) -> dict[int, ProcessView]:
    """Per-process views from one snapshot of the cuda maps."""
    out: dict[int, ProcessView] = {}

    def view(pid: int) -> ProcessView:
        return out.setdefault(pid, ProcessView(pid))

    for mname in ("calls", "time_ns", "bytes", "errors"):
        data = snap.get(mname)
        for key, value in data.entries if data else ():
            idx = key.get("function", -1) if isinstance(key, dict) else -1
            if not 0 <= idx < len(FUNCTION_NAMES) or not isinstance(value, int):
                continue
            fn = view(int(key.get("tgid", 0))).functions.setdefault(FUNCTION_NAMES[idx], {})
            fn[mname] = fn.get(mname, 0) + value
    mem = snap.get("memory")
    for key, value in mem.entries if mem else ():
        pid = key if isinstance(key, int) else 0
        if isinstance(value, dict):
            view(pid).memory = {k: v for k, v in value.items() if isinstance(v, int)}
    return out


def function_name(key: Any) -> str:
    """A function index (a key member, or a histogram's label text) as its name."""
    fn = function_of(key)
    return fn.name if fn is not None else str(key)


def key_text(key: Any) -> str:
    """A cuda map key for dump and watch --map: the function by name."""
    if isinstance(key, dict) and "function" in key:
        rest = {k: v for k, v in key.items() if k != "function"}
        named = {**rest, "function": function_name(key)}
        return ", ".join(f"{k}={v}" for k, v in named.items()) if rest else function_name(key)
    if isinstance(key, str) and key.isdigit():  # a histogram's label: the function index
        return function_name(key)
    return format_key(key)


def _rate(cur: int, prev: int | None, dt: float) -> float | None:
    if prev is None or dt <= 0 or cur < prev:
        return None
    return (cur - prev) / dt


class CudaWatch:
    """The watch loop's state for cuda (the interface of cli.Watch)."""

    def __init__(self, att: Any, maps: list[Any], interval: float, library: str) -> None:
        self.att = att
        self.maps = maps
        self.interval = interval
        self.library = library
        self.skipped = list(att.reply.skipped_functions)
        self.cur: dict[int, dict[str, Any]] = {}
        self.prev: dict[int, dict[str, Any]] = {}
        self.latency: MapData | None = None
        self.t = self.prev_t = 0.0

    def sample(self) -> None:
        snap = {m.name: MapData.from_client_map(m) for m in self.maps}
        self.prev, self.prev_t = self.cur, self.t
        self.t = time.monotonic()
        self.cur = {pid: v.summary() for pid, v in processes(snap).items()}
        self.latency = snap.get("latency")

    @property
    def dt(self) -> float:
        return self.t - self.prev_t if self.prev_t else 0.0

    def _with_rates(self, pid: int, s: dict[str, Any]) -> dict[str, Any]:
        old = self.prev.get(pid) if self.prev_t else None
        out = dict(s)
        out["launches_per_s"] = _rate(s["launches"], old["launches"] if old else None, self.dt)
        out["copy_bytes_per_s"] = {
            d: _rate(c["bytes"], old["copies"][d]["bytes"] if old else None, self.dt)
            for d, c in s["copies"].items()
        }
        return out

    def json_line(self) -> dict[str, Any]:
        return {
            "timestamp": time.time(),
            "program": PROGRAM,
            "attachment": self.att.id,
            "library": self.library,
            "interval": round(self.dt, 6) if self.dt else None,
            "skipped_functions": self.skipped,
            "processes": {str(p): self._with_rates(p, s) for p, s in sorted(self.cur.items())},
        }

    def frame(self, width: int, height: int | None, limit: int | None) -> list[str]:
        lines = [
            f"gfxclient watch cuda · {self.library} · attachment {self.att.id} · "
            f"every {self.interval:g}s · {time.strftime('%H:%M:%S')}"
        ]
        if not self.cur:
            lines.append("  (no CUDA calls seen yet)")
        for pid, s in sorted(self.cur.items()):
            lines.extend(_process_lines(pid, self._with_rates(pid, s)))
        if self.latency is not None and self.latency.entries:
            lines.append("")
            bar = max(10, min(40, width - 34))
            lines.extend(histogram_lines(self.latency, width=bar, key_format=function_name))
        if self.skipped:
            lines.append("")
            lines.append(f"not probed ({len(self.skipped)}): " + "; ".join(self.skipped))
        return clip(lines, width, height)


def _per_s(rate: float | None, fmt: Any) -> str:
    return f" ({fmt(rate)}/s)" if rate is not None else ""


def _process_lines(pid: int, s: dict[str, Any]) -> list[str]:
    launches = s["launches"]
    mean = f", mean {humanize_ns(s['launch_ns'] / launches)}" if launches else ""
    lines = [
        "",
        f"process {pid}",
        f"  launches  {humanize_count(launches)}{_per_s(s['launches_per_s'], humanize_count)}"
        f"{mean}",
    ]
    for d, c in s["copies"].items():
        if not c["calls"]:
            continue
        rate = _per_s(s["copy_bytes_per_s"][d], humanize_bytes)
        lines.append(
            f"  copies {_ARROWS[d]:>7}  {humanize_count(c['calls'])} calls, "
            f"{humanize_bytes(c['bytes'])}{rate}"
        )
    m = s["memory"]
    lines.append(
        f"  memory    live {humanize_bytes(m.get('live', 0))}, peak "
        f"{humanize_bytes(m.get('peak', 0))} ({s['allocations']} allocations, "
        f"{s['frees']} frees)" + (f", {m['untracked']} untracked" if m.get("untracked") else "")
    )
    lines.append(
        f"  sync      {humanize_ns(s['sync_ns'])} blocked in {s['sync_calls']} calls"
        + (f" · {s['errors']} calls returned an error" if s["errors"] else "")
    )
    return lines
