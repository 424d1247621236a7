"""The exporter's TOML configuration: where the broker is, where to listen, what to attach.

    listen = "127.0.0.1:9438"
    max_series_per_metric = 1000

    [broker]
    socket = "/run/gfxbpf/control.sock"   # or: grpc = "host:port" + tls_* files

    [[program]]
    name = "syscount"
    scope = "system"
    maps = ["counts"]          # default: every map the program shows

Errors name the file, the entry and the field (ConfigError), never a traceback.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gfxbpf.client.libcuda import PROGRAM as CUDA

DEFAULT_LISTEN = "127.0.0.1:9438"
DEFAULT_MAX_SERIES = 1000
VIAS = ("auto", "fd", "grpc")
SCOPES = ("self", "system")

_TOP_KEYS = {"listen", "listen_tls", "max_series_per_metric", "broker", "program"}
_TLS_KEYS = {"cert", "key", "client_ca"}
_BROKER_KEYS = {"socket", "grpc", "via", "tls_ca", "tls_cert", "tls_key"}
_PROGRAM_KEYS = {"name", "scope", "maps", "pid", "library", "functions", "max_series"}


class ConfigError(ValueError):
    """A bad configuration: the message says which file, entry and field, and what to do."""


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


class _Where:
    """Builds ConfigErrors that name the file and the entry."""

    def __init__(self, source: str, entry: str = "") -> None:
        self.source = source
        self.entry = entry

    def fail(self, key: str, problem: str) -> ConfigError:
        at = f"{self.entry}.{key}" if self.entry else key
        return ConfigError(f"{self.source}: {at}: {problem}")

    def keys(self, table: dict[str, Any], allowed: set[str]) -> None:
        unknown = sorted(set(table) - allowed)
        if unknown:
            raise self.fail(unknown[0], f"unknown key (allowed: {', '.join(sorted(allowed))})")

    def string(self, table: dict[str, Any], key: str, default: str | None = None) -> str | None:
        value = table.get(key, default)
        if value is not None and (not isinstance(value, str) or not value):
            raise self.fail(key, f"must be a non-empty string, not {value!r}")
        return value

    def positive(self, table: dict[str, Any], key: str, default: int | None) -> int | None:
        value = table.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.fail(key, f"must be a positive integer, not {value!r}")
        return value

    def strings(self, table: dict[str, Any], key: str) -> tuple[str, ...]:
        value = table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.fail(key, f"must be a list of non-empty strings, not {value!r}")
        return tuple(value)


def parse_listen(text: str, where: _Where) -> tuple[str, int]:
    """'HOST:PORT' or ':PORT' (all addresses); IPv6 as '[::1]:PORT'."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise where.fail("listen", f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9438 or :9438)")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port_text)


def _broker(table: Any, source: str) -> BrokerConfig:
    where = _Where(source, "[broker]")
    if not isinstance(table, dict):
        raise where.fail("broker", "must be a table ([broker])")
    where.keys(table, _BROKER_KEYS)
    via = where.string(table, "via", "auto")
    if via not in VIAS:
        raise where.fail("via", f"{via!r} is not one of {', '.join(VIAS)}")
    cfg = BrokerConfig(
        socket=where.string(table, "socket"),
        grpc=where.string(table, "grpc"),
        via=via or "auto",
        tls_ca=where.string(table, "tls_ca"),
        tls_cert=where.string(table, "tls_cert"),
        tls_key=where.string(table, "tls_key"),
    )
    if (cfg.tls_cert is None) != (cfg.tls_key is None):
        raise where.fail("tls_cert", "give both tls_cert and tls_key (or neither)")
    if cfg.tls_cert is not None and (cfg.grpc is None or cfg.grpc.startswith("unix:")):
        raise where.fail("grpc", 'mTLS files need a TCP gRPC address (grpc = "host:port")')
    return cfg


def _listen_tls(table: Any, source: str) -> ListenTls | None:
    if table is None:
        return None
    where = _Where(source, "[listen_tls]")
    if not isinstance(table, dict):
        raise where.fail("listen_tls", "must be a table ([listen_tls])")
    where.keys(table, _TLS_KEYS)
    cert, key = where.string(table, "cert"), where.string(table, "key")
    if cert is None or key is None:
        raise where.fail(
            "cert" if cert is None else "key", "missing: HTTPS needs both cert and key"
        )
    return ListenTls(cert, key, where.string(table, "client_ca"))


def _program(table: Any, index: int, source: str) -> ProgramConfig:
    where = _Where(source, f"[[program]] #{index}")
    if not isinstance(table, dict):
        raise where.fail("program", "must be a table ([[program]])")
    name = where.string(table, "name")
    if name is None:
        raise where.fail("name", "missing: the catalog program to attach (gfxclient list)")
    where.entry = f'[[program]] #{index} "{name}"'
    where.keys(table, _PROGRAM_KEYS)
    scope = where.string(table, "scope")
    if scope is not None and scope not in SCOPES:
        raise where.fail("scope", f"{scope!r} is not one of {', '.join(SCOPES)}")
    program = ProgramConfig(
        name=name,
        scope=scope,
        maps=where.strings(table, "maps"),
        pid=where.positive(table, "pid", None),
        library=where.string(table, "library"),
        functions=where.strings(table, "functions"),
        max_series=where.positive(table, "max_series", None),
    )
    if name == CUDA:
        _check_cuda(program, where)
    return program


def _check_cuda(program: ProgramConfig, where: _Where) -> None:
    """cuda traces one process of the caller's own user (the catalog: scope self only)."""
    if program.pid is None:
        raise where.fail(
            "pid",
            "missing: cuda traces one process, which must run as the exporter's own user "
            "(its libcuda is found in /proc/PID/maps unless library is given)",
        )
    if program.scope not in (None, "self"):
        raise where.fail("scope", 'cuda runs with scope "self" only: a process of this user')
    if program.functions:
        raise where.fail("functions", "cuda probes the functions of its own table: leave it out")


def parse_config(text: str, source: str = "<config>") -> ExporterConfig:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{source}: not valid TOML: {e}") from None
    where = _Where(source)
    where.keys(data, _TOP_KEYS)
    listen = where.string(data, "listen", DEFAULT_LISTEN)
    host, port = parse_listen(listen or DEFAULT_LISTEN, where)
    limit = where.positive(data, "max_series_per_metric", DEFAULT_MAX_SERIES)
    entries = data.get("program", [])
    if not isinstance(entries, list) or not entries:
        raise where.fail("program", "no [[program]] entries: name at least one program to attach")
    programs = tuple(_program(t, i + 1, source) for i, t in enumerate(entries))
    seen: set[str] = set()
    for i, p in enumerate(programs):
        if p.name in seen:
            raise _Where(source, f'[[program]] #{i + 1} "{p.name}"').fail(
                "name", "listed twice: each program is attached once (its metrics have one name)"
            )
        seen.add(p.name)
    return ExporterConfig(
        host=host,
        port=port,
        max_series_per_metric=limit or DEFAULT_MAX_SERIES,
        broker=_broker(data.get("broker", {}), source),
        programs=programs,
        source=source,
        tls=_listen_tls(data.get("listen_tls"), source),
    )


def load_config(path: str | Path) -> ExporterConfig:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the configuration: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    return parse_config(text, str(path))
