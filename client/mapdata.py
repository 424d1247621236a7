"""One map's decoded entries as a snapshot: the model both gfxclient's views
(client/cli/display.py) and the exporter read."""

from __future__ import annotations

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


class MapData:
    """One map's decoded entries (per-CPU values already summed) and how to show it."""

    # A plain class, not a dataclass: importing dataclasses (and inspect with
    # it) costs every gfxclient command ~5 ms before any work (issue 37).
    __slots__ = ("name", "show", "unit", "key_label", "description", "entries")

    def __init__(
        self,
        name: str,
        show: str = "counter",
        unit: str = "",
        key_label: str = "",
        description: str = "",
        entries: list[tuple[Any, Any]] | None = None,
    ) -> None:
        self.name = name
        self.show = show
        self.unit = unit
        self.key_label = key_label
        self.description = description
        self.entries: list[tuple[Any, Any]] = [] if entries is None else entries

    def _fields(self) -> tuple[Any, ...]:
        return tuple(getattr(self, n) for n in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return type(other) is MapData and self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass was

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"MapData({inner})"

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
