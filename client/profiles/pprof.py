"""pprof's gzipped profile.proto (proto/pprof.proto), as Google's pprof reads it.

A Function per (function, file): a Python frame's function name alone with
its source file, so `pprof -list` finds its lines; its line sits in the
Location's Line. A native frame's Function keeps the symbol as the file
spells it (system_name; mangled C++) beside the readable name. A Mapping per
ELF file, with its build id. Each sample is labelled with its pid, tid,
process and thread names (Profile.threads), for -tagfocus and -tagroot.

No address of any kind (kernel or user) is written: frames are aggregated by
name, so Locations and Mappings carry none (memory_start/limit stay 0, and
has_functions tells pprof not to symbolize them again).

pprof's demangler rewrites a Function whose system_name equals its name and
looks like C++ (it strips <...> and (...)): Python's `<module>` would show as
a blank. Names that are no symbol (Python frames, the profiler's own
[bracketed] frames, JIT names) therefore have no system_name, which pprof
reads as "already readable"; symbols keep theirs.
"""

from __future__ import annotations

import gzip
import time
from collections.abc import Iterator

from gfxbpf.client.profiles.model import FrameInfo, Profile, Thread
from gfxbpf.proto import pprof_pb2

__all__ = ["LABELS", "pprof_bytes", "pprof_message"]

# Profile.unit -> the sample types written (value per sample, in this order).
_SAMPLE_TYPES = {
    "samples": [("samples", "count")],
    "calls": [("calls", "count")],
    "nanoseconds": [("time", "nanoseconds")],
}
# The sample labels: numbers (pid, tid) and names (process, thread).
LABELS = ("pid", "tid", "process_name", "thread_name")


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


class _Tables:
    """The profile's mappings, functions and locations, each written once."""

    def __init__(self, msg: pprof_pb2.Profile, s: _Strings, profile: Profile) -> None:
        self.msg, self.s, self.frames = msg, s, profile.frames
        self.mappings: dict[str, int] = {}
        objs = {i.obj for i in profile.frames.values() if i.obj}
        main = _main_binary(profile)  # first: pprof's "File:" is mapping[0]
        for obj in sorted(objs, key=lambda o: (o != main, o)):
            mid = self.mappings[obj] = len(self.mappings) + 1
            msg.mapping.add(
                id=mid,
                filename=s(obj),
                build_id=s(profile.objects.get(obj, "")),
                has_functions=True,  # named already: pprof must not look addresses up
            )
        self.functions: dict[tuple[str, str, str, int], int] = {}
        self.locations: dict[str, int] = {}

    def location(self, name: str) -> int:
        lid = self.locations.get(name)
        if lid is None:
            info = self.frames.get(name) or FrameInfo(name)
            lid = self.locations[name] = len(self.locations) + 1
            loc = self.msg.location.add(id=lid, mapping_id=self.mappings.get(info.obj, 0))
            loc.line.add(function_id=self._function(info), line=info.line)
        return lid

    def _function(self, info: FrameInfo) -> int:
        key = (info.function, info.system_name, info.file, info.start_line)
        fid = self.functions.get(key)
        if fid is None:
            fid = self.functions[key] = len(self.functions) + 1
            s = self.s
            name, system_name, filename = s(info.function), s(info.system_name), s(info.file)
            self.msg.function.add(
                id=fid,
                name=name,
                system_name=system_name,
                filename=filename,
                start_line=info.start_line,
            )
        return fid


def _main_binary(profile: Profile) -> str:
    """The executable most of the weight ran in: the file of the `_start` its
    main threads begin at (other threads begin in libc); "" where no stack
    reaches one. profile.proto: "mapping[0] will be the main binary"."""
    weight: dict[str, int] = {}
    for frames, w in profile.stacks.items():
        for name in frames:
            obj = profile.frames[name].obj if name in profile.frames else ""
            if obj:  # the stack's outermost frame in a file
                if name == "_start":
                    weight[obj] = weight.get(obj, 0) + w
                break
    return max(weight, key=lambda o: weight[o]) if weight else ""


def _samples(profile: Profile) -> Iterator[tuple[Thread | None, tuple[str, ...], int]]:
    if profile.threads:
        for (who, frames), w in sorted(profile.threads.items(), key=lambda kv: kv[0][1]):
            yield who, frames, w
    else:
        for frames, w in sorted(profile.stacks.items()):
            yield None, frames, w


def _label(sample: pprof_pb2.Sample, s: _Strings, who: Thread) -> None:
    for key, num in (("pid", who.pid), ("tid", who.tid)):
        if num:
            sample.label.add(key=s(key), num=num, num_unit=s(key))
    for key, text in (("process_name", who.process), ("thread_name", who.thread)):
        if text:
            sample.label.add(key=s(key), str=s(text))


def _sample_types(msg: pprof_pb2.Profile, s: _Strings, profile: Profile) -> bool:
    """Write the sample types and period; whether a cpu time value follows the count."""
    types = list(_SAMPLE_TYPES.get(profile.unit, [(profile.unit, "count")]))
    if profile.unit == "nanoseconds" and profile.time_kind:
        types = [(profile.time_kind, "nanoseconds")]  # off_cpu, wall: pprof -sample_index
    if profile.unit == "bytes":  # as Go's heap profiles name them
        types = [(profile.space_kind or "alloc_space", "bytes")]
    cpu = bool(profile.unit == "samples" and profile.period_ns)
    if cpu:
        types.append(("cpu", "nanoseconds"))  # samples x period: the CPU time they stand for
        msg.period_type.type = s("cpu")
        msg.period_type.unit = s("nanoseconds")
        msg.period = int(profile.period_ns or 0)
    for kind, unit in types:
        msg.sample_type.add(type=s(kind), unit=s(unit))
    return cpu


def pprof_message(profile: Profile) -> pprof_pb2.Profile:
    msg = pprof_pb2.Profile()
    s = _Strings(msg)
    cpu = _sample_types(msg, s, profile)
    tables = _Tables(msg, s, profile)
    for who, frames, weight in _samples(profile):
        if weight <= 0:
            continue
        # pprof wants the innermost frame first
        locs = [tables.location(name) for name in reversed(frames)]
        values = [weight, weight * int(profile.period_ns or 0)] if cpu else [weight]
        sample = msg.sample.add(location_id=locs, value=values)
        if who is not None:
            _label(sample, s, who)
    msg.time_nanos = time.time_ns()
    if profile.duration_s is not None:
        msg.duration_nanos = int(profile.duration_s * 1e9)
        msg.time_nanos -= msg.duration_nanos  # when the profile started
    for note in profile.notes:
        msg.comment.append(s(note))
    return msg


def pprof_bytes(profile: Profile) -> bytes:
    return gzip.compress(pprof_message(profile).SerializeToString(), compresslevel=6)
