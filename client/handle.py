"""An attachment and its maps, as the client sees them.

Over the Unix socket the broker passes fds of frozen maps (read-write fds,
but no bpf(2) call can change a frozen map) and each ring buffer's own fd:
maps are read directly with BPF_MAP_LOOKUP_BATCH/ELEM (gfxbpf.bpf.maps.Map)
when the kernel lets an unprivileged holder do so,
and through the broker's ReadMap otherwise. Over gRPC, maps come through
ReadMap (paged) and events through StreamEvents (events.EventStream). Keys
and values are decoded with the object's BTF from AttachReply.btf.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from gfxbpf.bpf.btf.facade import Btf, BtfError
from gfxbpf.bpf.consts import MapType
from gfxbpf.bpf.gcpause import gc_paused
from gfxbpf.bpf.maps import Map, RawPage
from gfxbpf.client.errors import BrokerUnreachable, ClientError, ProtocolError, UsageError
from gfxbpf.client.events import EventStream
from gfxbpf.client.transport import Transport
from gfxbpf.proto import gfxbpf_pb2 as pb
from gfxbpf.proto.scopes import SCOPE_NAMES


class BrokerLink(Protocol):
    """What an attachment needs of its broker: client.broker.Broker is one
    (a protocol, so this module does not import the one that imports it)."""

    transport: Transport
    via: str
    direct_reads: bool

    def _forget(self, att: Attachment) -> None: ...


# Errnos that mean "this process may not read the map fd itself".
_NO_DIRECT = frozenset({errno.EPERM, errno.EACCES, errno.EINVAL, errno.ENOSYS})
# Entries a broker's pages may add up to beyond max_entries (the map grew).
READ_SLACK = 4096

Value = bytes | list[bytes]


def scope_name(scope: int) -> str:
    return SCOPE_NAMES.get(scope, "unspecified")


def raw_int(data: bytes) -> Any:
    """Undecorated bytes: little-endian ints for the usual sizes, else hex."""
    if len(data) in (1, 2, 4, 8):
        return int.from_bytes(data, "little")
    return data.hex()


def fold_counters(keys: list[Any], per_cpu: list[Any], ncpus: int) -> list[tuple[Any, Any]]:
    """A per-CPU counting map read like a shared one: each key's ncpus values
    (per_cpu holds them key by key) summed, keys whose sum is 0 left out (a
    per-CPU array has every slot, counted or not)."""
    out = []
    for i, k in enumerate(keys):
        total = sum(per_cpu[i * ncpus : (i + 1) * ncpus])
        if total:
            out.append((k, total))
    return out


def _round8(n: int) -> int:
    return (n + 7) & ~7


class ClientMap:
    """One client-visible map of an attachment.

    read() -> [(key, value)] decoded with BTF (per-CPU maps: a list with one
    value per possible CPU, except counters: see below); raw_items() -> the
    undecoded bytes.

    A per-CPU map shown as a counter (syscount's per-CPU array) reads like a
    shared one: values summed over CPUs, zero counts left out, per_cpu False.
    """

    def __init__(
        self, attachment: Attachment, desc: pb.MapDescription, fd: int | None, btf: Btf | None
    ) -> None:
        self.attachment = attachment
        self.desc = desc
        self.name = desc.name
        self.show = desc.show
        self.unit = desc.unit
        self.key_label = desc.key_label
        self.description = desc.description
        # Counters kept per CPU only to spare the program atomics: summed here.
        self.folded = desc.per_cpu and desc.show == "counter"
        self.per_cpu = desc.per_cpu and not self.folded
        self.map_type = desc.map_type
        self.btf = btf
        self._fd = fd
        self._map: Map | None = None
        self._direct = fd is not None and attachment.broker.direct_reads
        self._kdec = self._decoder(desc.btf_key_type_id)
        self._vdec = self._decoder(desc.btf_value_type_id)
        self._stride = _round8(desc.value_size) if desc.per_cpu else desc.value_size
        self._kbatch = self._batch_decoder(desc.btf_key_type_id, desc.key_size)
        self._vbatch = self._batch_decoder(desc.btf_value_type_id, self._stride)

    def __repr__(self) -> str:
        how = "fd" if self._fd is not None else "broker"
        return f"<ClientMap {self.name!r} show={self.show!r} via={how}>"

    @property
    def fd(self) -> int | None:
        """The map's fd the broker passed (None: it is read through the broker)."""
        return self._fd

    @property
    def is_events(self) -> bool:
        return self.show == "events" or self.map_type == MapType.RINGBUF

    @property
    def is_stack_table(self) -> bool:
        """Return addresses by stack id: gfxclient profile names them (stack_view.py)."""
        return self.map_type == MapType.STACK_TRACE

    def fileno(self) -> int:
        if self._fd is None:
            raise UsageError(f"map {self.name!r} has no fd here (it is read through the broker)")
        return self._fd

    def _decoder(self, type_id: int) -> Any:
        if self.btf is None or not type_id:
            return None
        try:
            return self.btf.decoder(type_id)
        except BtfError:
            return None

    def _batch_decoder(self, type_id: int, stride: int) -> Any:
        if self.btf is None or not type_id:
            return None
        try:
            return self.btf.batch_decoder(type_id, stride)
        except BtfError:
            return None

    # --- reading ---

    def _kernel_map(self) -> Map:
        if self._map is None:
            d = self.desc
            self._map = Map(
                self.fileno(),
                name=d.name,
                map_type=d.map_type,
                key_size=d.key_size,
                value_size=d.value_size,
                max_entries=d.max_entries,
            )
        return self._map

    def raw_pages(self) -> list[RawPage]:
        """The whole map as RawPages: two buffers per page, keys and values."""
        if self.is_events:
            raise UsageError(
                f"map {self.name!r} is a ring buffer of events: read it with events() "
                "(gfxclient stream), not as a table"
            )
        if self._direct:
            try:
                return self._kernel_map().raw_pages()
            except OSError as e:
                if e.errno not in _NO_DIRECT:
                    raise ClientError(f"reading map {self.name!r} through its fd: {e}") from e
                # This kernel does not let us read the fd: ask the broker from now on.
                self._direct = False
        return self._read_through_broker()

    def lookup_many(self, keys: Iterable[bytes]) -> list[tuple[bytes, Value]] | None:
        """(key, value) of each key present, read through the map's fd (a few
        ids out of a large stack table); None when this map is read through the
        broker, which pages the whole map (use raw_items())."""
        if not self._direct:
            return None
        kmap = self._kernel_map()
        out: list[tuple[bytes, Value]] = []
        try:
            out.extend(kmap.lookup_many(keys))
        except OSError as e:
            if e.errno not in _NO_DIRECT:
                raise ClientError(f"reading map {self.name!r} through its fd: {e}") from e
            self._direct = False
            return None
        return out

    def raw_items(self) -> list[tuple[bytes, Value]]:
        """Every (key, value) as bytes; per-CPU values are lists of bytes."""
        ks, vs, stride = self.desc.key_size, self.desc.value_size, self._stride
        out: list[tuple[bytes, Value]] = []
        for p in self.raw_pages():
            keys = [p.keys[i : i + ks] for i in range(0, p.n * ks, ks)]
            if self.desc.per_cpu:
                ncpus = self._ncpus(p)
                flat = [p.values[i : i + vs] for i in range(0, p.n * ncpus * stride, stride)]
                values: list[Value] = [flat[i : i + ncpus] for i in range(0, len(flat), ncpus)]
            else:
                values = [p.values[i : i + vs] for i in range(0, p.n * vs, vs)]
            out.extend(zip(keys, values, strict=True))
        return out

    def _ncpus(self, page: RawPage) -> int:
        """Slots per value of a per-CPU page (the reader's possible CPUs)."""
        if not page.n:
            return 1
        ncpus = len(page.values) // (page.n * self._stride)
        if ncpus < 1 or len(page.values) != page.n * ncpus * self._stride:
            raise ProtocolError(
                f"map {self.name!r}: {len(page.values)} value bytes for {page.n} per-CPU values "
                f"of {self._stride} bytes"
            )
        return ncpus

    def _read_through_broker(self) -> list[RawPage]:
        pages: list[RawPage] = []
        cursor = b""
        seen = 0
        limit = max(self.desc.max_entries, 1) + READ_SLACK
        while True:
            reply = self.attachment.broker.transport.read_map(
                pb.ReadMapRequest(
                    attachment_id=self.attachment.id,
                    map=self.name,
                    max_entries=0,  # the broker's largest page
                    cursor=cursor,
                    packed=True,
                )
            )
            page = self._page_of(reply)
            pages.append(page)
            seen += page.n
            if not reply.next_cursor:
                return pages
            if reply.next_cursor == cursor or seen > limit:
                raise ProtocolError(
                    f"ReadMap of {self.name!r} does not end (cursor repeats or more entries "
                    f"than the map's {self.desc.max_entries})"
                )
            cursor = reply.next_cursor

    def _page_of(self, reply: pb.ReadMapReply) -> RawPage:
        """A ReadMap reply as a RawPage: packed buffers as they came, or (a broker
        older than packed replies) its per-entry messages joined."""
        if reply.count or not reply.entries:
            ks = self.desc.key_size
            if len(reply.keys) != reply.count * ks:
                raise ProtocolError(
                    f"ReadMap of {self.name!r}: {len(reply.keys)} key bytes for {reply.count} keys"
                )
            per_cpu = reply.ncpus if self.desc.per_cpu else 1
            if len(reply.values) != reply.count * per_cpu * self._stride:
                raise ProtocolError(
                    f"ReadMap of {self.name!r}: {len(reply.values)} value bytes for "
                    f"{reply.count} values ({per_cpu} per key, {self._stride} bytes each)"
                )
            return RawPage(reply.keys, reply.values, reply.count, reply.next_cursor)
        stride = self._stride
        keys = b"".join(e.key for e in reply.entries)
        if self.desc.per_cpu:
            values = b"".join(v.ljust(stride, b"\0") for e in reply.entries for v in e.per_cpu)
        else:
            values = b"".join(e.value for e in reply.entries)
        return RawPage(keys, values, len(reply.entries), reply.next_cursor)

    def decode_key(self, data: bytes) -> Any:
        if self._kdec is not None:
            try:
                return self._kdec(data)
            except BtfError:
                pass
        return raw_int(data)

    def decode_value(self, data: Value) -> Any:
        if isinstance(data, list):
            return [self.decode_value(v) for v in data]
        if self._vdec is not None:
            try:
                return self._vdec(data)
            except BtfError:
                pass
        return raw_int(data)

    def read(self) -> list[tuple[Any, Any]]:
        """Every (key, value), decoded (a per-CPU counter: summed, zeros left out)."""
        out: list[tuple[Any, Any]] = []
        pages = self.raw_pages()
        with gc_paused():  # a dict and a str per row: nothing for the collector
            for page in pages:
                out.extend(self._decode_page(page))
        return out

    def _decode_page(self, page: RawPage) -> list[tuple[Any, Any]]:
        """One page, decoded buffer by buffer (bpf.btf batch decoders)."""
        ks, n = self.desc.key_size, page.n
        keys = self._decode_all(self._kbatch, self.decode_key, page.keys, n, ks, ks)
        if not self.desc.per_cpu:
            vs = self.desc.value_size
            values = self._decode_all(self._vbatch, self.decode_value, page.values, n, vs, vs)
            return list(zip(keys, values, strict=True))
        ncpus = self._ncpus(page)
        flat = self._decode_all(
            self._vbatch,
            self.decode_value,
            page.values,
            n * ncpus,
            self._stride,
            self.desc.value_size,
        )
        if self.folded and all(type(v) is int for v in flat[:ncpus]):
            return fold_counters(keys, flat, ncpus)
        return [(k, flat[i * ncpus : (i + 1) * ncpus]) for i, k in enumerate(keys)]

    @staticmethod
    def _decode_all(batch: Any, one: Any, buf: bytes, n: int, stride: int, size: int) -> list[Any]:
        """n values from buf: the batch decoder, or one at a time if it has none or fails."""
        if batch is not None:
            try:
                return list(batch(buf, n))
            except BtfError:
                pass
        return [one(buf[i : i + size]) for i in range(0, n * stride, stride)]

    def items(self) -> Iterator[tuple[Any, Any]]:
        return iter(self.read())

    def close(self) -> None:
        if self._map is not None:
            self._map.close()  # closes the fd too
            self._map = None
            self._fd = None
        elif self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.close(fd)


class Attachment:
    """A program the broker attached for us: maps, events, stats; detach() ends it."""

    def __init__(self, broker: BrokerLink, reply: pb.AttachReply, fds: list[int]) -> None:
        self.broker = broker
        self.reply = reply
        self.id = reply.attachment_id
        self.program = reply.program
        self.sha256 = reply.sha256
        self.scope = scope_name(reply.scope)
        self.shared = reply.shared
        self.lease_expires = reply.lease_expires_unix
        self.programs = list(reply.programs)
        self.detached = False
        self.btf: Btf | None = None
        if reply.btf:
            try:
                self.btf = Btf.parse(reply.btf)
            except BtfError:
                self.btf = None  # values then show as raw ints / hex
        self.maps: dict[str, ClientMap] = {}
        used: set[int] = set()
        for d in reply.maps:
            fd = None
            if d.fd_index >= 0:
                if d.fd_index >= len(fds):
                    raise ProtocolError(
                        f"map {d.name!r}: fd_index {d.fd_index} but only {len(fds)} fds came"
                    )
                fd = fds[d.fd_index]
                used.add(d.fd_index)
            self.maps[d.name] = ClientMap(self, d, fd, self.btf)
        # Program fds (if a broker ever passes them) and strays: not ours to keep.
        for i, fd in enumerate(fds):
            if i not in used:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._streams: list[EventStream] = []

    def __repr__(self) -> str:
        return f"<Attachment {self.id} {self.program!r} scope={self.scope} maps={list(self.maps)}>"

    # --- maps ---

    def map(self, name: str) -> ClientMap:
        try:
            return self.maps[name]
        except KeyError:
            have = ", ".join(self.maps) or "none"
            raise UsageError(
                f"{self.program or 'the program'} has no map {name!r} (maps: {have})"
            ) from None

    def table_maps(self) -> list[ClientMap]:
        return [m for m in self.maps.values() if not m.is_events]

    def event_maps(self) -> list[ClientMap]:
        return [m for m in self.maps.values() if m.is_events]

    # --- events ---

    def open_events(self, map: str | None = None, max_events: int = 0) -> EventStream:
        """An EventStream over the named ring buffer (default: the only one)."""
        if map is None:
            rings = self.event_maps()
            if not rings:
                raise UsageError(f"{self.program or 'the program'} has no ring buffer of events")
            if len(rings) > 1:
                names = ", ".join(m.name for m in rings)
                raise UsageError(f"name the ring buffer: {names}")
            cmap = rings[0]
        else:
            cmap = self.map(map)
            if not cmap.is_events:
                raise UsageError(f"map {map!r} is not a ring buffer of events")
        stream = EventStream(self.broker.transport, self.id, cmap, max_events)
        self._streams.append(stream)
        return stream

    def events(
        self, map: str | None = None, *, timeout: float | None = None, max_events: int = 0
    ) -> Iterator[Any]:
        """Decoded records as they come; stops after timeout seconds (None: never)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.open_events(map, max_events) as stream:
            while not stream.ended:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return
                yield from stream.poll(None if left is None else min(left, 1.0))

    # --- stats and lifetime ---

    def stats(self) -> list[pb.ProgramStats]:
        return list(self.broker.transport.stats(self.id).programs)

    def renew(self) -> None:
        """Renew a gRPC lease (any call naming the attachment does); no-op over the socket."""
        if self.broker.via == "grpc" and not self.detached:
            self.broker.transport.stats(self.id)

    def detach(self) -> bool:
        """Detach (idempotent); True if the kernel instance went away with us."""
        if self.detached:
            return False
        self.detached = True
        for s in self._streams:
            s.close()
        for m in self.maps.values():
            m.close()
        self.broker._forget(self)
        transport = self.broker.transport
        if transport is None or transport.closed:
            return False  # the session is gone: the broker already detached
        try:
            return transport.detach(self.id).unloaded
        except BrokerUnreachable:
            return False

    close = detach

    def __enter__(self) -> Attachment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()
