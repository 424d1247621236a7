"""The exporter's TOML configuration: where the broker is, where to listen, what to attach.

    listen = "127.0.0.1:9438"
    max_series_per_metric = 1000

    [broker]
    socket = "/run/gfxbpf/control.sock"   # or: grpc = "host:port" + tls_* files

    [[program]]
    name = "syscount"
    scope = "system"
    maps = ["counts"]          # default: every map the program shows

Every problem is found before the file is refused (gfxbpf.tomlcheck.checks),
each naming the file, the entry and the field (ConfigError), never a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gfxbpf.client.libcuda import PROGRAM as CUDA
from gfxbpf.tomlcheck import checks
from gfxbpf.tomlcheck.checks import Entry, FileProblems, Problems, show

DEFAULT_LISTEN = "127.0.0.1:9438"
DEFAULT_MAX_SERIES = 1000
VIAS = ("auto", "fd", "grpc")
SCOPES = ("self", "system")

_TOP_KEYS = {"listen", "listen_tls", "max_series_per_metric", "broker", "program"}
_TLS_KEYS = {"cert", "key", "client_ca"}
_BROKER_KEYS = {"socket", "grpc", "via", "tls_ca", "tls_cert", "tls_key"}
_PROGRAM_KEYS = {"name", "scope", "maps", "pid", "library", "functions", "max_series"}


class ConfigError(FileProblems):
    """A bad configuration: .problems says which file, entry and field, and what to do."""


@dataclass(frozen=True)
class BrokerConfig:
    socket: str | None = None  # None: the client library's default
    grpc: str | None = None
    via: str = "auto"
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None


@dataclass(frozen=True)
class ListenTls:
    """HTTPS for /metrics; with client_ca, only scrapers holding a certificate it signed."""

    cert: str
    key: str
    client_ca: str | None = None


@dataclass(frozen=True)
class ProgramConfig:
    name: str
    scope: str | None = None  # None: the policy picks
    maps: tuple[str, ...] = ()  # empty: every map the program shows
    pid: int | None = None
    library: str | None = None
    functions: tuple[str, ...] = ()
    max_series: int | None = None  # None: the file's max_series_per_metric


@dataclass(frozen=True)
class ExporterConfig:
    host: str
    port: int
    max_series_per_metric: int
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    programs: tuple[ProgramConfig, ...] = ()
    source: str = "<config>"
    tls: ListenTls | None = None

    def limit_for(self, program: ProgramConfig) -> int:
        return program.max_series or self.max_series_per_metric


def parse_listen(text: str, at: Entry) -> tuple[str, int] | None:
    """'HOST:PORT' or ':PORT' (all addresses); IPv6 as '[::1]:PORT'."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        at.add("listen", f"{show(text)} is not HOST:PORT (e.g. 127.0.0.1:9438 or :9438)")
        return None
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port_text)


def _positive(at: Entry, table: dict[str, Any], key: str) -> int | None:
    return at.integer(table, key, 1, None, "a positive integer")


def _broker(table: dict[str, Any] | None, problems: Problems) -> BrokerConfig:
    if table is None:
        return BrokerConfig()
    at = problems.entry("[broker]")
    at.unknown_keys(table, _BROKER_KEYS)
    via = at.choice(table, "via", VIAS)
    cfg = BrokerConfig(
        socket=at.string(table, "socket"),
        grpc=at.string(table, "grpc"),
        via=via or "auto",
        tls_ca=at.string(table, "tls_ca"),
        tls_cert=at.string(table, "tls_cert"),
        tls_key=at.string(table, "tls_key"),
    )
    if (cfg.tls_cert is None) != (cfg.tls_key is None):
        at.add("tls_cert", "give both tls_cert and tls_key (or neither)")
    elif cfg.tls_cert is not None and (cfg.grpc is None or cfg.grpc.startswith("unix:")):
        at.add("grpc", 'mTLS files need a TCP gRPC address (grpc = "host:port")')
    return cfg


def _listen_tls(table: dict[str, Any] | None, problems: Problems) -> ListenTls | None:
    if table is None:
        return None
    at = problems.entry("[listen_tls]")
    at.unknown_keys(table, _TLS_KEYS)
    cert = at.string(table, "cert", True, "HTTPS needs both cert and key")
    key = at.string(table, "key", True, "HTTPS needs both cert and key")
    client_ca = at.string(table, "client_ca")
    if cert is None or key is None:
        return None
    return ListenTls(cert, key, client_ca)


def _program(index: int, table: dict[str, Any], problems: Problems) -> ProgramConfig | None:
    name = table.get("name")
    where = f"[[program]] #{index}"
    if isinstance(name, str) and name:
        where += f" {show(name)}"
    at = problems.entry(where)
    at.string(table, "name", True, "the catalog program to attach (gfxclient list)")
    at.unknown_keys(table, _PROGRAM_KEYS)
    program = ProgramConfig(
        name=name if isinstance(name, str) else "",
        scope=at.choice(table, "scope", SCOPES),
        maps=at.strings(table, "maps") or (),
        pid=_positive(at, table, "pid"),
        library=at.string(table, "library"),
        functions=at.strings(table, "functions") or (),
        max_series=_positive(at, table, "max_series"),
    )
    if name == CUDA:
        _check_cuda(program, table, at)
    return program if at.ok else None


def _check_cuda(program: ProgramConfig, table: dict[str, Any], at: Entry) -> None:
    """cuda traces one process of the caller's own user (the catalog: scope self only)."""
    if "pid" not in table:
        at.add(
            "pid",
            "missing: cuda traces one process, which must run as the exporter's own user "
            "(its libcuda is found in /proc/PID/maps unless library is given)",
        )
    if program.scope not in (None, "self"):
        at.add("scope", 'cuda runs with scope "self" only: a process of this user')
    if program.functions:
        at.add("functions", "cuda probes the functions of its own table: leave it out")


def _programs(data: dict[str, Any], top: Entry, problems: Problems) -> tuple[ProgramConfig, ...]:
    """The [[program]] entries: at least one, each program once."""
    if data.get("program", []) == []:
        top.add("program", "no [[program]] entries: name at least one program to attach")
    entries = top.tables(data, "program", "program")
    seen: set[str] = set()
    programs = []
    for i, t in entries:
        program = _program(i, t, problems)
        if program is None:
            continue
        if program.name in seen:
            problems.add(
                f"[[program]] #{i} {show(program.name)}",
                "name",
                "listed twice: each program is attached once (its metrics have one name)",
            )
        seen.add(program.name)
        programs.append(program)
    return tuple(programs)


def parse_config(text: str, source: str = "<config>") -> ExporterConfig:
    data = checks.parse_toml(text, source, ConfigError)
    problems = Problems(source)
    top = problems.entry("top level")
    top.unknown_keys(data, _TOP_KEYS)
    listen = top.string(data, "listen") or DEFAULT_LISTEN
    address = parse_listen(listen, top)
    limit = _positive(top, data, "max_series_per_metric")
    programs = _programs(data, top, problems)
    broker = _broker(top.table(data, "broker"), problems)
    tls = _listen_tls(top.table(data, "listen_tls"), problems)
    problems.raise_if_any(ConfigError)
    assert address is not None
    return ExporterConfig(
        host=address[0],
        port=address[1],
        max_series_per_metric=limit or DEFAULT_MAX_SERIES,
        broker=broker,
        programs=programs,
        source=source,
        tls=tls,
    )


def load_config(path: str | Path) -> ExporterConfig:
    return parse_config(checks.read_text(path, ConfigError, "configuration"), str(path))
