"""speedscope's JSON file format (https://www.speedscope.app/file-format-schema.json):
one "sampled" profile per thread (Profile.threads; one for all where the
profile has no threads), whose samples are stacks of indexes into
shared.frames, root first, each with its weight. A frame is its function's
name, with the Python source file and line (as py-spy writes them), or the
ELF file a native function lies in."""

from __future__ import annotations

import json
from typing import Any

from gfxbpf.client.profiles.model import Profile, Thread

__all__ = ["SCHEMA_URL", "profile_name", "speedscope_document"]

SCHEMA_URL = "https://www.speedscope.app/file-format-schema.json"
# Profile.unit -> speedscope's ValueUnit; counts are unitless ("none").
_UNITS = {"samples": "none", "calls": "none", "nanoseconds": "nanoseconds", "bytes": "bytes"}

Stacks = dict[tuple[str, ...], int]


def profile_name(who: Thread) -> str:
    """A thread's profile name in speedscope's list: 'python3 (pid 7) thread pt_main (tid 9)'."""
    process = f"{who.process} (pid {who.pid})" if who.process else f"pid {who.pid}"
    if not who.tid and not who.thread:
        return process
    tid = f" (tid {who.tid})" if who.tid else ""
    return f"{process} thread {who.thread or '?'}{tid}"


class _Frames:
    def __init__(self, profile: Profile) -> None:
        self.info = profile.frames
        self.list: list[dict[str, Any]] = []
        self.index: dict[str, int] = {}

    def __call__(self, name: str) -> int:
        i = self.index.get(name)
        if i is None:
            i = self.index[name] = len(self.list)
            info = self.info.get(name)
            frame: dict[str, Any] = {"name": info.function if info else name}
            if info and (info.file or info.obj):
                frame["file"] = info.file or info.obj
            if info and info.line:
                frame["line"] = info.line
            self.list.append(frame)
        return i


def _by_thread(profile: Profile) -> list[tuple[str, Stacks]]:
    """(profile name, stacks) per thread: by tid where known (a thread renamed
    while sampled, as at exec, is one profile named as most of its samples
    were), else by process and thread name."""
    if not profile.threads:
        return [("all threads", profile.stacks)]
    threads: dict[tuple[int, int, str], Stacks] = {}
    named: dict[tuple[int, int, str], dict[Thread, int]] = {}
    for (who, frames), w in profile.threads.items():
        key = (who.pid, who.tid, "" if who.tid else who.thread)
        stacks = threads.setdefault(key, {})
        stacks[frames] = stacks.get(frames, 0) + w
        names = named.setdefault(key, {})
        names[who] = names.get(who, 0) + w
    return [
        (profile_name(max(named[k], key=named[k].__getitem__)), threads[k]) for k in sorted(threads)
    ]


def _sampled(name: str, unit: str, stacks: Stacks, frames: _Frames) -> dict[str, Any]:
    samples: list[list[int]] = []
    weights: list[int] = []
    for stack, w in sorted(stacks.items()):
        if w > 0:
            samples.append([frames(f) for f in stack])
            weights.append(w)
    return {
        "type": "sampled",
        "name": f"{name} ({unit})",
        "unit": _UNITS.get(unit, "none"),
        "startValue": 0,
        "endValue": sum(weights),
        "samples": samples,
        "weights": weights,
    }


def speedscope_document(profile: Profile, name: str = "gfxbpf profile") -> dict[str, Any]:
    frames = _Frames(profile)
    profiles = [_sampled(n, profile.unit, s, frames) for n, s in _by_thread(profile)]
    heaviest = max(range(len(profiles)), key=lambda i: profiles[i]["endValue"])
    return {
        "$schema": SCHEMA_URL,
        "shared": {"frames": frames.list},
        "profiles": profiles,
        "name": name,
        "activeProfileIndex": heaviest,
        "exporter": "gfxbpf",
    }


def format_speedscope(profile: Profile) -> str:
    return json.dumps(speedscope_document(profile), separators=(",", ":"))
