"""One map's decoded entries as a snapshot: the model both gfxclient's views
(client/cli/display.py) and the exporter read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def sum_cpus(value: Any) -> Any:
    """A per-CPU value (a list) summed: ints add; structs add member-wise."""
    if not isinstance(value, list) or not value:
        return value
    first = value[0]
    if isinstance(first, bool) or not isinstance(first, int | float | dict):
        return value
    if isinstance(first, dict):
        out: dict[str, Any] = {}
        for k, v in first.items():
            parts = [d.get(k) for d in value if isinstance(d, dict)]
            if all(isinstance(p, int | float) and not isinstance(p, bool) for p in parts):
                out[k] = sum(parts)
            else:
                out[k] = v
        return out
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
        return sum(value)
    return value


@dataclass
class MapData:
    """One map's decoded entries (per-CPU values already summed) and how to show it."""

    name: str
    show: str = "counter"
    unit: str = ""
    key_label: str = ""
    description: str = ""
    entries: list[tuple[Any, Any]] = field(default_factory=list)

    @classmethod
    def from_client_map(cls, cmap: Any, per_cpu_sum: bool = True) -> MapData:
        entries = cmap.read()
        if per_cpu_sum and getattr(cmap, "per_cpu", False):
            entries = [(k, sum_cpus(v)) for k, v in entries]
        return cls(
            name=cmap.name,
            show=cmap.show or "counter",
            unit=cmap.unit,
            key_label=cmap.key_label,
            description=cmap.description,
            entries=entries,
        )
