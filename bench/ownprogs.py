"""bench/'s own BPF programs (bench.bpf.c), loaded by gfxbpf.bpf as root.

They are not catalog programs and the broker never sees them: the empty
programs are the floor for per-event cost, and stream_sys_enter feeds the
ring-buffer measurement.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from gfxbpf.bpf.link.attach import Attachment, attach_tracepoint
from gfxbpf.bpf.loader import LoadedObject, load
from gfxbpf.bpf.object import ObjectSpec


def tally(obj: LoadedObject) -> tuple[int, int]:
    """stream_sys_enter's (records written, records the ring had no room for)."""
    counts = dict(obj.map("tally").read())
    return counts[0], counts[1]


def run_time(obj: LoadedObject, program: str) -> tuple[int, int] | None:
    """(run_cnt, run_time_ns) of one loaded program; None unless
    kernel.bpf_stats_enabled counted them."""
    fd = obj.programs[program].fd
    info = dict(line.split(":", 1) for line in open(f"/proc/self/fdinfo/{fd}") if ":" in line)
    cnt, ns = int(info.get("run_cnt", 0)), int(info.get("run_time_ns", 0))
    return (cnt, ns) if cnt else None


@contextlib.contextmanager
def attached(
    obj_path: Path,
    programs: list[str],
    variables: dict[str, int] | None = None,
    ring_bytes: int | None = None,
) -> Iterator[LoadedObject]:
    """Load `programs` of the bench object and attach each to the tracepoint
    its section names (tracepoint/CATEGORY/EVENT); detach and unload after."""
    spec = ObjectSpec.from_file(str(obj_path))
    for name, value in (variables or {}).items():
        spec.set_variable(name, value)
    if ring_bytes is not None:
        spec.maps["records"].max_entries = ring_bytes
    atts: list[Attachment] = []
    with load(spec, programs=programs) as obj:
        try:
            for name in programs:
                prog = obj.programs[name]
                _, category, event = prog.spec.section.split("/")
                atts.append(attach_tracepoint(prog.fd, category, event))
            yield obj
        finally:
            for a in atts:
                a.close()
