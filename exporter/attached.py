"""One broker session of the exporter: the configured programs attached, their maps read.

A Session connects, lists what this user may run, attaches each configured
program once, and on each scrape reads every map at that moment (events:
the records that arrived since the last scrape). A program that cannot run
here, or that the policy refuses, is remembered as unavailable with the
broker's reason and not asked for again in this session; only transient
failures (a limit, a kernel error, a cuda target that has not loaded libcuda
yet) are retried, with a backoff.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gfxbpf.client import (
    Attachment,
    Broker,
    BrokerError,
    BrokerUnreachable,
    ClientMap,
    EventStream,
    ProtocolError,
)
from gfxbpf.client.errors import UsageError
from gfxbpf.client.grpc_config import TlsFiles
from gfxbpf.client.libcuda import NoLibcudaYet
from gfxbpf.client.mapdata import MapData
from gfxbpf.exporter import jobs, kernels, mapping, tables
from gfxbpf.exporter.backoff import Backoff
from gfxbpf.exporter.config import BrokerConfig, ExporterConfig, ProgramConfig
from gfxbpf.proto import gfxbpf_pb2 as pb

# Errors that end the session (the broker went away, or forgot us): reconnect.
# Anything else while reading a map is that program's error, reported as such.
SESSION_ERRORS = (BrokerUnreachable, ProtocolError, BrokerError)
# Attach failures worth another try in the same session (the others will not change).
TRANSIENT = frozenset({pb.ERROR_RESOURCE_EXHAUSTED, pb.ERROR_KERNEL, pb.ERROR_INTERNAL})


def connect(cfg: BrokerConfig) -> Broker:
    tls = None
    if cfg.tls_ca or cfg.tls_cert:
        tls = TlsFiles(ca=cfg.tls_ca, cert=cfg.tls_cert, key=cfg.tls_key)
    return Broker.connect(socket=cfg.socket, grpc=cfg.grpc, via=cfg.via, tls=tls)


@dataclass
class MapReader:
    """One map of an attached program: how it maps, and (events) its stream."""

    cmap: ClientMap
    shape: mapping.MapShape
    specs: list[mapping.MetricSpec]
    stream: EventStream | None = None


@dataclass
class ProgramState:
    """What the exporter knows of one configured program in this session."""

    config: ProgramConfig
    attachment: Attachment | None = None
    readers: list[MapReader] = field(default_factory=list)
    error: str = ""  # why it is not attached, or why a map of it could not be read
    retry: Backoff | None = None  # None: not retried in this session

    @property
    def available(self) -> bool:
        return self.attachment is not None


def shape_of(program: str, cmap: ClientMap) -> mapping.MapShape:
    """The map's catalog role, plus (tables) the value's numeric members from BTF
    that the catalog lists as metrics (all of them where it lists none)."""
    members: tuple[str, ...] = ()
    if cmap.show == "table" and cmap.desc.value_size:
        listed = tuple(cmap.desc.metrics) if cmap.desc.metrics_listed else None
        zero = cmap.decode_value(bytes(cmap.desc.value_size))
        members = mapping.table_members(zero, listed)
    return mapping.MapShape(
        program, cmap.name, cmap.show, cmap.unit, cmap.key_label, members, cmap.description
    )


class Session:
    """A connected broker and the configured programs' attachments."""

    def __init__(
        self, broker: Broker, config: ExporterConfig, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.broker = broker
        self.config = config
        self.clock = clock
        self.programs = [ProgramState(p) for p in config.programs]
        # Records counted per (program, map); the collector carries them across sessions.
        self.new_events: dict[tuple[str, str], int] = {}
        self._listing: dict[str, pb.ProgramListing] = {}

    def attach_all(self) -> None:
        self._listing = {p.name: p for p in self.broker.list_programs()}
        for state in self.programs:
            self._attach(state)

    def _refuse(self, state: ProgramState, reason: str) -> None:
        state.error = reason
        state.retry = None

    def _later(self, state: ProgramState, reason: str) -> None:
        state.error = reason
        state.retry = state.retry or Backoff(clock=self.clock)
        state.retry.failed()

    def _attach(self, state: ProgramState) -> None:
        cfg = state.config
        listing = self._listing.get(cfg.name)
        if listing is None:
            mine = ", ".join(sorted(self._listing)) or "none"
            return self._refuse(
                state, f"the policy lets this user use no program {cfg.name!r} (it may: {mine})"
            )
        if not listing.available:
            return self._refuse(state, listing.unavailable_reason or "not available on this host")
        shown = [m.name for m in listing.maps]
        missing = [m for m in cfg.maps if m not in shown]
        if missing:
            return self._refuse(
                state, f"no map {missing[0]!r} in {cfg.name} (maps: {', '.join(shown) or 'none'})"
            )
        try:
            library = tables.library_for(cfg)
        except NoLibcudaYet as e:  # it may initialise CUDA after we start
            return self._later(state, f"{e} (here: library = PATH); looked at again later")
        except UsageError as e:
            return self._refuse(state, str(e))
        try:
            att = self.broker.attach(
                cfg.name, scope=cfg.scope, pid=cfg.pid, library=library, functions=cfg.functions
            )
        except BrokerError as e:
            if e.code in TRANSIENT:
                return self._later(state, str(e))
            return self._refuse(state, str(e))
        state.attachment, state.error, state.retry = att, "", None
        state.readers = self._readers(cfg, att)
        return None

    def _readers(self, cfg: ProgramConfig, att: Attachment) -> list[MapReader]:
        readers = []
        for cmap in att.maps.values():
            if cfg.maps and cmap.name not in cfg.maps:
                continue
            shape = shape_of(cfg.name, cmap)
            specs = mapping.metric_specs(shape)
            if not specs:
                continue  # nothing to show (e.g. a table of stack frames): never read it
            stream = att.open_events(cmap.name) if cmap.is_events else None
            readers.append(MapReader(cmap, shape, specs, stream))
        return readers

    def retry_transient(self) -> None:
        for state in self.programs:
            if state.attachment is None and state.retry is not None and state.retry.ready():
                self._attach(state)

    def check(self) -> None:
        """One request to the broker: raises if the session is gone (and renews gRPC leases)."""
        self.broker.stats()

    def read(self, limit_for: Callable[[ProgramConfig], int]) -> mapping.Built:
        """Every attached map read now, as metric families."""
        out = mapping.Built([], {})
        self.new_events = {}
        for state in self.programs:
            if state.attachment is not None:
                state.error = ""
            for reader in state.readers:
                try:
                    self._read_one(state, reader, limit_for(state.config), out)
                except SESSION_ERRORS:
                    raise
                except Exception as e:  # noqa: BLE001 - this map's problem, not the session's
                    state.error = f"reading map {reader.cmap.name}: {type(e).__name__}: {e}"
        return out

    def _read_one(
        self, state: ProgramState, reader: MapReader, limit: int, out: mapping.Built
    ) -> None:
        if reader.stream is not None:
            self.new_events[(state.config.name, reader.cmap.name)] = _drain(reader.stream)
            return
        data = MapData.from_client_map(reader.cmap)
        functions = tables.functions_for(state.config)
        entries = data.entries
        if state.config.name == kernels.PROGRAM:
            assert state.attachment is not None
            names = kernels.kernel_names(state.attachment) if reader.cmap.name == "kernels" else {}
            entries = kernels.relabel(entries, names)
        elif state.config.name == jobs.PROGRAM:
            entries = jobs.relabel(entries)
        built = mapping.build(reader.shape, entries, limit, functions)
        out.families.extend(built.families)
        out.dropped.update(built.dropped)

    def event_specs(self) -> list[tuple[tuple[str, str], mapping.MetricSpec]]:
        return [
            ((s.config.name, r.cmap.name), spec)
            for s in self.programs
            for r in s.readers
            if r.stream is not None
            for spec in r.specs
        ]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.broker.close()


def _drain(stream: EventStream) -> int:
    """Records the stream's thread took off the ring since the last scrape
    (never blocks: a counter may lag the ring by that thread's 20 ms poll,
    and the next scrape counts what it missed)."""
    total = 0
    while True:
        got = len(stream.poll_raw(0))
        total += got
        if not got or stream.ended:
            return total
