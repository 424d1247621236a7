"""pprof's gzipped profile.proto (proto/pprof.proto): one Function and one
Location per frame name. Frames carry names only, no addresses, so no address
of any kind (kernel or user) is written."""

from __future__ import annotations

import gzip
import time

from gfxbpf.client.profiles.model import Profile
from gfxbpf.proto import pprof_pb2

__all__ = ["pprof_bytes", "pprof_message"]

# Profile.unit -> the sample types written (value per sample, in this order).
_SAMPLE_TYPES = {
    "samples": [("samples", "count")],
    "calls": [("calls", "count")],
    "nanoseconds": [("time", "nanoseconds")],
}


class _Strings:
    def __init__(self, msg: pprof_pb2.Profile) -> None:
        self.msg = msg
        self.index: dict[str, int] = {}
        self("")  # entry 0 must be the empty string

    def __call__(self, s: str) -> int:
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.msg.string_table)
            self.msg.string_table.append(s)
        return i


def pprof_message(profile: Profile) -> pprof_pb2.Profile:
    msg = pprof_pb2.Profile()
    s = _Strings(msg)
    types = list(_SAMPLE_TYPES.get(profile.unit, [(profile.unit, "count")]))
    if profile.unit == "nanoseconds" and profile.time_kind:
        types = [(profile.time_kind, "nanoseconds")]  # off_cpu, wall: pprof -sample_index
    cpu = profile.unit == "samples" and profile.period_ns
    if cpu:
        types.append(("cpu", "nanoseconds"))  # samples x period: the CPU time they stand for
        msg.period_type.type = s("cpu")
        msg.period_type.unit = s("nanoseconds")
        msg.period = int(profile.period_ns or 0)
    for kind, unit in types:
        msg.sample_type.add(type=s(kind), unit=s(unit))
    ids: dict[str, int] = {}
    for frames, weight in sorted(profile.stacks.items()):
        if weight <= 0:
            continue
        locs = []
        for name in reversed(frames):  # pprof wants the innermost frame first
            fid = ids.get(name)
            if fid is None:
                fid = ids[name] = len(ids) + 1
                msg.function.add(id=fid, name=s(name), system_name=s(name))
                msg.location.add(id=fid).line.add(function_id=fid)
            locs.append(fid)
        values = [weight, weight * int(profile.period_ns or 0)] if cpu else [weight]
        msg.sample.add(location_id=locs, value=values)
    msg.time_nanos = time.time_ns()
    if profile.duration_s is not None:
        msg.duration_nanos = int(profile.duration_s * 1e9)
    for note in profile.notes:
        msg.comment.append(s(note))
    return msg


def pprof_bytes(profile: Profile) -> bytes:
    return gzip.compress(pprof_message(profile).SerializeToString(), compresslevel=6)
