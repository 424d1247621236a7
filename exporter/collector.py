"""The prometheus-client Collector: each scrape reads the maps at that moment.

There is no polling thread: collect() runs in the HTTP server's thread when
Prometheus asks, checks the session with one broker request, reads every
attached map and turns it into families (mapping.py). If the broker is gone,
the scrape says so (gfxbpf_up 0, gfxbpf_last_error_info) and the next
scrapes reconnect and re-attach, no more often than the backoff allows.
Nothing raised while reading ever reaches /metrics as a traceback.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gfxbpf.client import Broker, BrokerUnreachable
from gfxbpf.exporter import mapping
from gfxbpf.exporter.attached import Session, connect
from gfxbpf.exporter.backoff import Backoff
from gfxbpf.exporter.config import ExporterConfig

# The collector's own metrics (tests derive the emitted names from these).
UP = "gfxbpf_up"
LAST_ERROR = "gfxbpf_last_error_info"
AVAILABLE = "gfxbpf_program_available"
PROGRAM_ERROR = "gfxbpf_program_error_info"
DROPPED = "gfxbpf_dropped_series"  # a counter: gfxbpf_dropped_series_total
RECONNECTS = "gfxbpf_reconnects"  # a counter: gfxbpf_reconnects_total
READ_SECONDS = "gfxbpf_scrape_read_seconds"
STATUS_SAMPLES = frozenset(
    {UP, LAST_ERROR, AVAILABLE, PROGRAM_ERROR, DROPPED + "_total", RECONNECTS + "_total"}
    | {READ_SECONDS}
)
MAX_ERROR_TEXT = 300
BUSY_SECONDS = 5.0  # how long a scrape waits for one still reading


def one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_TEXT else text[: MAX_ERROR_TEXT - 1] + "…"


class GfxbpfCollector(Collector):
    """Reads the configured programs' maps through the broker on every scrape."""

    def __init__(
        self,
        config: ExporterConfig,
        connector: Callable[[], Broker] | None = None,
        clock: Callable[[], float] = time.monotonic,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.connector = connector or (lambda: connect(config.broker))
        self.clock = clock
        self.log = log or (lambda msg: print(f"gfxbpf-exporter: {msg}", file=sys.stderr))
        self.session: Session | None = None
        self.backoff = Backoff(clock=clock)
        self.last_error = ""
        self.lost_reason = ""  # why the last session ended, until a new one is up
        self.reconnects = 0
        self.dropped: dict[str, int] = {}  # cumulative series left out, per metric
        self.events: dict[tuple[str, str], int] = {}  # records seen, per (program, map)
        self.read_seconds = 0.0
        self._lock = threading.Lock()  # scrapes may overlap; the session is not shared
        self.busy_wait = BUSY_SECONDS

    # ------------------------------------------------------------ the session

    def open(self) -> bool:
        """Connect and attach (if the backoff allows); True when a session is up."""
        if self.session is not None:
            return True
        if not self.backoff.ready():
            return False
        try:
            broker = self.connector()
        except Exception as e:  # noqa: BLE001 - reported as a metric, retried later
            return self._failed(f"cannot connect to the broker: {e}")
        session = Session(broker, self.config, self.clock)
        try:
            session.attach_all()
        except Exception as e:  # noqa: BLE001 - as above
            session.close()
            return self._failed(f"attaching: {e}")
        self.session = session
        self.backoff.reset()
        self.last_error = self.lost_reason = ""
        for state in session.programs:
            if state.error:
                self.log(f"{state.config.name}: not attached: {one_line(state.error)}")
        return True

    def _failed(self, message: str) -> bool:
        if self.lost_reason and message != self.lost_reason:
            message = f"{self.lost_reason}; then {message}"
        message = one_line(message)
        if message != self.last_error:
            self.log(message)
        self.last_error = message
        self.backoff.failed()
        return False

    def _lost(self, error: Exception) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None
            self.reconnects += 1
        self.lost_reason = f"lost the broker session: {type(error).__name__}: {error}"
        self._failed(self.lost_reason)
        if isinstance(error, BrokerUnreachable):
            self.backoff.reset()  # the broker went away: the first reconnect is tried at once

    def close(self) -> None:
        with self._lock:
            if self.session is not None:
                self.session.close()
                self.session = None

    # ------------------------------------------------------------ a scrape

    def collect(self) -> Iterator[Metric]:
        # A broker that stopped answering holds a scrape until the client's
        # timeout; later scrapes wait a while, then answer without reading
        # rather than piling up threads behind it.
        if not self._lock.acquire(timeout=self.busy_wait):
            up = GaugeMetricFamily(UP, "1 while the exporter holds a broker session")
            up.add_metric([], 0.0)
            error = GaugeMetricFamily(
                LAST_ERROR, "Why the broker session is down", labels=["error"]
            )
            error.add_metric(
                [f"an earlier scrape still waits for the broker (after {self.busy_wait:g} s)"], 1
            )
            yield from (up, error)
            return
        try:
            families = self._read()
            families.extend(self._status())
        finally:
            self._lock.release()
        yield from families

    def _read(self) -> list[Metric]:
        start = self.clock()
        families: list[Metric] = []
        for attempt in range(2):  # a lost session is reopened once within the scrape
            if not self.open() or self.session is None:
                break
            try:
                self.session.check()
                self.session.retry_transient()
                built = self.session.read(self.config.limit_for)
            except Exception as e:  # noqa: BLE001 - never a traceback on /metrics
                self._lost(e)
                if attempt == 0 and self.backoff.ready():
                    continue
                break
            families = built.families
            for name, n in built.dropped.items():
                self.dropped[name] = self.dropped.get(name, 0) + n
            for key, n in self.session.new_events.items():
                self.events[key] = self.events.get(key, 0) + n
            families.extend(self._events())
            break
        self.read_seconds = self.clock() - start
        return families

    def _events(self) -> list[Metric]:
        assert self.session is not None
        return [
            mapping.events_family(spec, self.events.get(key, 0))
            for key, spec in self.session.event_specs()
        ]

    def _status(self) -> list[Metric]:
        up = GaugeMetricFamily(UP, "1 while the exporter holds a broker session")
        up.add_metric([], 1.0 if self.session is not None else 0.0)
        out: list[Metric] = [up]
        error = GaugeMetricFamily(
            LAST_ERROR, "Why the broker session is down (while it is)", labels=["error"]
        )
        if self.session is None and self.last_error:
            error.add_metric([self.last_error], 1.0)
        out.append(error)
        out.extend(self._programs())
        dropped = CounterMetricFamily(
            DROPPED, "Series left out by max_series, summed over scrapes", labels=["metric"]
        )
        for name, n in sorted(self.dropped.items()):
            dropped.add_metric([name], float(n))
        out.append(dropped)
        reconnects = CounterMetricFamily(RECONNECTS, "Broker sessions lost and reopened")
        reconnects.add_metric([], float(self.reconnects))
        out.append(reconnects)
        read = GaugeMetricFamily(READ_SECONDS, "Time this scrape spent reading the maps")
        read.add_metric([], self.read_seconds)
        out.append(read)
        return out

    def _programs(self) -> list[Metric]:
        available = GaugeMetricFamily(
            AVAILABLE, "1 if the configured program is attached", labels=["program"]
        )
        errors = GaugeMetricFamily(
            PROGRAM_ERROR, "Why a configured program is not attached", labels=["program", "error"]
        )
        states = self.session.programs if self.session is not None else []
        attached = {s.config.name: s for s in states}
        for p in self.config.programs:
            state = attached.get(p.name)
            available.add_metric([p.name], 1.0 if state is not None and state.available else 0.0)
            if state is not None and state.error:
                errors.add_metric([p.name, one_line(state.error)], 1.0)
        return [available, errors]
