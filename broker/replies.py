"""Replies built from what the broker holds: program listings, AttachReply's
map and program descriptions, ReadMap pages and program stats."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from gfxbpf.bpf import consts as C
from gfxbpf.bpf import syscall as bpfsys
from gfxbpf.bpf.btf.facade import KIND_STRUCT
from gfxbpf.bpf.link import tracefs
from gfxbpf.bpf.maps import CursorError, Map
from gfxbpf.broker import features
from gfxbpf.broker.errors import BrokerError
from gfxbpf.broker.owners import Attachment
from gfxbpf.broker.policy.rules import ProgramEntry
from gfxbpf.catalog import instance as bpfinstance
from gfxbpf.catalog.entries import Catalog, MapEntry
from gfxbpf.proto import gfxbpf_pb2 as pb
from gfxbpf.proto.scopes import SCOPE_ENUMS

# A ReadMap page stays well inside one control-socket datagram (1 MiB).
READ_MAP_MAX_BYTES = 768 * 1024


def catalog_map_description(m: MapEntry) -> pb.MapDescription:
    """What the catalog says of a visible map; Attach adds the kernel map's side."""
    return pb.MapDescription(
        name=m.name,
        show=m.show or "",
        unit=m.unit or "",
        key_label=m.key_label or "",
        description=m.description,
        event_type=m.event_type or "",
        fd_index=-1,
        metrics=m.metrics or (),
        metrics_listed=m.metrics is not None,
    )


def listing(
    catalog: Catalog,
    name: str,
    group: list[ProgramEntry],
    event_exists: Callable[[str, str], bool],
    read_format: Callable[[str, str], tracefs.EventFormat] | None = None,
) -> pb.ProgramListing:
    """One ListPrograms row: the policy entries that admit the caller for name."""
    entry = next((p for p in catalog.programs if p.name == name), None)
    scopes = list(dict.fromkeys(s for e in group for s in e.scopes))
    listing = pb.ProgramListing(
        name=name,
        description=next((e.description for e in group if e.description), ""),
        sha256=group[0].sha256,
        libraries=list(dict.fromkeys(lib for e in group for lib in e.libraries)),
    )
    if entry is None:
        listing.scopes.extend(SCOPE_ENUMS[s] for s in scopes)
        listing.available = False
        listing.unavailable_reason = (
            f"program {name!r} is not in the broker's catalog; only an uploaded object "
            "with the approved sha256 and a catalog program's layout can run"
        )
        return listing
    listing.description = listing.description or entry.description
    listing.scopes.extend(SCOPE_ENUMS[s] for s in scopes if s in entry.scopes)
    listing.attach_points.extend(
        f"{a.kind}/{a.target}" if a.target else a.kind for a in entry.attach
    )
    for p in entry.parameters:
        listing.parameters.append(
            pb.ParameterDescription(
                name=p.name, type=p.type, required=p.required, description=p.description
            )
        )
    listing.maps.extend(catalog_map_description(m) for m in entry.visible_maps)
    listing.requires = entry.requires or ""
    reason = bpfinstance.availability(entry, event_exists, read_format)
    if reason is None and not any(e.sha256 == entry.sha256 for e in group):
        reason = (
            f"the policy approves sha256 {group[0].sha256}, but the catalog's "
            f"{entry.object} is {entry.sha256}: attach by uploading the approved object, "
            f"or re-approve (gfxbpf-admin approve {name})"
        )
    listing.available = reason is None
    listing.unavailable_reason = reason or ""
    return listing


def describe(att: Attachment, joined: bool, pass_fds: bool) -> tuple[pb.AttachReply, list[int]]:
    """AttachReply for att, and the map fds to send with it (when pass_fds):
    duplicates the caller closes once sent, so a revoke that closes the
    instance meanwhile cannot make them name something else. The caller
    pins the instance while this runs."""
    fds: list[int] = []
    try:
        return _describe(att, joined, fds if pass_fds else None), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _describe(att: Attachment, joined: bool, fds: list[int] | None) -> pb.AttachReply:
    shared = att.shared
    entry = shared.entry
    spec = shared.spec
    reply = pb.AttachReply(
        attachment_id=att.id,
        program=entry.name,
        sha256=att.sha256,
        scope=SCOPE_ENUMS[att.scope],
        shared=joined,
        btf=spec.btf_bytes,
        possible_cpus=bpfsys.possible_cpus(),
    )
    if entry.since_map:
        since = shared.inst.obj.map(entry.since_map).lookup(0)
        reply.since_ns = int.from_bytes(since if isinstance(since, bytes) else b"", "little")
    for m in entry.visible_maps:
        kmap = shared.visible[m.name]
        d = catalog_map_description(m)
        d.map_type = kmap.map_type
        d.key_size = kmap.key_size
        d.value_size = kmap.value_size
        d.max_entries = kmap.max_entries
        d.per_cpu = kmap.percpu
        d.btf_key_type_id = kmap.key_type_id
        d.btf_value_type_id = kmap.value_type_id
        if m.event_type and spec.btf is not None:
            d.btf_event_type_id = spec.btf.find(m.event_type, KIND_STRUCT) or 0
        if fds is not None:
            d.fd_index = len(fds)
            fds.append(os.dup(kmap.fileno()))
        reply.maps.append(d)
    for pname, prog in shared.obj.programs.items():
        reply.programs.append(
            pb.ProgramDescription(
                name=pname,
                section=prog.spec.section,
                prog_type=prog.spec.prog_type,
                prog_id=prog.id,
                fd_index=-1,  # a program fd would let its holder attach it elsewhere
            )
        )
    return reply


def readable_map(att: Attachment, asked: str) -> Map:
    """The client-visible map ReadMap names (or the only readable one)."""
    entry = att.shared.entry
    name = asked
    if not name:
        names = [m.name for m in entry.visible_maps if m.show != "events"]
        if len(names) != 1:
            raise BrokerError(
                pb.ERROR_INVALID_ARGUMENT,
                f"name the map to read: {', '.join(names) or 'none is readable'}",
            )
        name = names[0]
    kmap = att.shared.visible.get(name)
    if kmap is None:
        raise BrokerError(
            pb.ERROR_NOT_FOUND,
            f"program {entry.name!r} has no client-visible map {name!r} (visible: "
            f"{', '.join(att.shared.visible) or 'none'})",
        )
    if kmap.map_type in (C.MapType.RINGBUF, C.MapType.PERF_EVENT_ARRAY):
        raise BrokerError(
            pb.ERROR_INVALID_ARGUMENT, f"map {asked!r} is an event stream: use StreamEvents"
        )
    return kmap


def read_page(
    kmap: Map, max_entries: int, limit: int, cursor: bytes, packed: bool = False
) -> pb.ReadMapReply:
    """One ReadMap page (bpf/maps.py Map.read_raw_page), at most limit entries;
    packed: the kernel's key and value buffers as they are, else a MapEntry each."""
    per_entry = kmap.key_size + kmap.buf_size + 16 + (8 * kmap.ncpus if kmap.percpu else 0)
    count = max(1, min(max_entries or limit, limit, READ_MAP_MAX_BYTES // per_entry))
    try:
        page = kmap.read_raw_page(count, cursor)
    except CursorError:
        raise BrokerError(
            pb.ERROR_INVALID_ARGUMENT, "bad ReadMap cursor: pass next_cursor unchanged"
        ) from None
    except bpfsys.BpfError as e:
        raise BrokerError(pb.ERROR_KERNEL, f"reading map: {e}") from None
    if packed:
        return pb.ReadMapReply(
            next_cursor=page.cursor,
            keys=page.keys,
            values=page.values,
            count=page.n,
            ncpus=kmap.ncpus if kmap.percpu else 0,
        )
    reply = pb.ReadMapReply(next_cursor=page.cursor)
    for k, v in kmap.page_items(page):
        if isinstance(v, list):
            reply.entries.append(pb.MapEntry(key=k, per_cpu=v))
        else:
            reply.entries.append(pb.MapEntry(key=k, value=v))
    return reply


def stats(atts: Iterable[Attachment]) -> pb.StatsReply:
    """Run counts and times of every program of atts (zero unless bpf stats are on)."""
    reply = pb.StatsReply(stats_enabled=features.bpf_stats_enabled())
    for att in atts:
        for pname, prog in att.shared.obj.programs.items():
            try:
                info = bpfsys.prog_info(prog.fd)
            except (OSError, ValueError):
                continue  # detached meanwhile
            reply.programs.append(
                pb.ProgramStats(
                    attachment_id=att.id,
                    program=att.program,
                    function=pname,
                    prog_id=info.id,
                    run_cnt=info.run_cnt,
                    run_time_ns=info.run_time_ns,
                    recursion_misses=info.recursion_misses,
                )
            )
    return reply
