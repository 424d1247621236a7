"""speedscope's JSON file format (https://www.speedscope.app/file-format-schema.json):
one "sampled" profile whose samples are stacks of indexes into shared.frames,
root first, each with its weight."""

from __future__ import annotations

import json
from typing import Any

from gfxbpf.client.profiles.model import Profile

__all__ = ["SCHEMA_URL", "speedscope_document"]

SCHEMA_URL = "https://www.speedscope.app/file-format-schema.json"
# Profile.unit -> speedscope's ValueUnit; counts are unitless ("none").
_UNITS = {"samples": "none", "calls": "none", "nanoseconds": "nanoseconds"}


def speedscope_document(profile: Profile, name: str = "gfxbpf profile") -> dict[str, Any]:
    frames: list[dict[str, str]] = []
    index: dict[str, int] = {}
    samples: list[list[int]] = []
    weights: list[int] = []
    for stack, w in sorted(profile.stacks.items()):
        if w <= 0:
            continue
        row = []
        for frame in stack:
            i = index.get(frame)
            if i is None:
                i = index[frame] = len(frames)
                frames.append({"name": frame})
            row.append(i)
        samples.append(row)
        weights.append(w)
    return {
        "$schema": SCHEMA_URL,
        "shared": {"frames": frames},
        "profiles": [
            {
                "type": "sampled",
                "name": f"{name} ({profile.unit})",
                "unit": _UNITS.get(profile.unit, "none"),
                "startValue": 0,
                "endValue": sum(weights),
                "samples": samples,
                "weights": weights,
            }
        ],
        "name": name,
        "activeProfileIndex": 0,
        "exporter": "gfxbpf",
    }


def format_speedscope(profile: Profile) -> str:
    return json.dumps(speedscope_document(profile), separators=(",", ":"))
