"""gfxbpf-exporter's configuration, command line and scrape-time resilience (a fake broker)."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import generate_latest

from gfxbpf.client import BrokerError, BrokerUnreachable
from gfxbpf.exporter import main as exporter_main
from gfxbpf.exporter.collector import GfxbpfCollector
from gfxbpf.exporter.config import ConfigError, parse_config
from gfxbpf.proto import gfxbpf_pb2 as pb

GOOD = """
listen = ":9500"
max_series_per_metric = 20
[broker]
socket = "/run/x.sock"
[[program]]
name = "syscount"
scope = "system"
maps = ["counts"]
[[program]]
name = "execsnoop"
[[program]]
name = "vmabind"
"""


# ------------------------------------------------------------------ configuration


def test_a_good_config() -> None:
    cfg = parse_config(GOOD, "x.toml")
    assert (cfg.host, cfg.port, cfg.max_series_per_metric) == ("0.0.0.0", 9500, 20)
    assert cfg.broker.socket == "/run/x.sock" and cfg.broker.via == "auto"
    assert [p.name for p in cfg.programs] == ["syscount", "execsnoop", "vmabind"]
    assert cfg.programs[0].maps == ("counts",) and cfg.programs[0].scope == "system"
    assert cfg.programs[1].scope is None


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        ("listen = 'nowhere'\n[[program]]\nname = 'a'", "listen", "HOST:PORT"),
        (
            "[[program]]\nname = 'a'\nscope = 'world'",
            "[[program]] #1 \"a\": field 'scope'",
            "self, system",
        ),
        ("[[program]]\nname = 'a'\nmaps = 'counts'", "[[program]] #1 \"a\": field 'maps'", "array"),
        (
            "[[program]]\nname = 'a'\ncolour = 1",
            "[[program]] #1 \"a\": field 'colour'",
            "unknown key",
        ),
        ("[[program]]\nscope = 'self'", "[[program]] #1: field 'name'", "missing"),
        (
            "[[program]]\nname = 'a'\n[[program]]\nname = 'a'",
            "#2 \"a\": field 'name'",
            "listed twice",
        ),
        ("max_series_per_metric = 0\n[[program]]\nname = 'a'", "max_series_per_metric", "positive"),
        (
            "[broker]\nvia = 'carrier pigeon'\n[[program]]\nname='a'",
            "[broker]: field 'via'",
            "auto",
        ),
        (
            "[broker]\ntls_cert = 'c'\n[[program]]\nname='a'",
            "[broker]: field 'tls_cert'",
            "tls_key",
        ),
        (
            "[broker]\ntls_cert='c'\ntls_key='k'\n[[program]]\nname='a'",
            "[broker]: field 'grpc'",
            "TCP",
        ),
        ("listen = ':1'", "program", "no [[program]]"),
        ("[[program]\nname = 'a'", "TOML syntax error", ""),
    ],
)
def test_bad_configs_say_where_and_what(text: str, where: str, what: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(text, "exp.toml")
    msg = str(e.value)
    assert msg.startswith("exp.toml: ") and where in msg and what in msg, msg


def test_every_problem_is_reported_at_once() -> None:
    text = "listen = 'x'\ncolour = 1\n[[program]]\nname = 'a'\npid = 0\n[broker]\nvia = 'x'\n"
    with pytest.raises(ConfigError) as e:
        parse_config(text, "exp.toml")
    fields = [line.split(": field ")[1].split(":")[0] for line in e.value.problems]
    assert fields == ["'colour'", "'listen'", "'pid'", "'via'"], e.value.problems
    assert all(line.startswith("exp.toml: ") for line in e.value.problems)


def test_check_config_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.toml"
    good.write_text(GOOD)
    out = io.StringIO()
    assert exporter_main.main(["--check-config", str(good)], out) == 0
    assert "valid" in out.getvalue() and "syscount (scope system): counts" in out.getvalue()
    out = io.StringIO()
    assert exporter_main.main(["--check-config", str(good), "--json"], out) == 0
    assert json.loads(out.getvalue())["programs"][0]["maps"] == ["counts"]
    bad = tmp_path / "bad.toml"
    bad.write_text("[[program]]\nname = 'a'\nscope = 'world'\n")
    assert exporter_main.main(["--check-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: [[program]] #1" in err and "Traceback" not in err
    assert exporter_main.main(["--check-config", str(tmp_path / "missing.toml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_once_scrapes_one_wait_after_attaching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--once: attach, let --wait seconds of activity happen, then scrape (a
    scrape right after the attach would show counters near zero)."""
    good = tmp_path / "good.toml"
    good.write_text(GOOD)
    calls: list[Any] = []

    class Fake:
        def __init__(self, config: Any) -> None:
            pass

        def open(self) -> bool:
            calls.append("open")
            return True

        def collect(self) -> list[Any]:
            calls.append("scrape")
            return []

        def close(self) -> None:
            calls.append("close")

    monkeypatch.setattr(exporter_main, "GfxbpfCollector", Fake)
    monkeypatch.setattr(exporter_main.time, "sleep", lambda s: calls.append(("sleep", s)))
    for argv, wait in (([], 1.0), (["--wait", "2.5"], 2.5)):
        calls.clear()
        assert exporter_main.main(["--config", str(good), "--once", *argv], io.StringIO()) == 0
        assert calls == ["open", ("sleep", wait), "scrape", "close"]
    assert exporter_main.main(["--config", str(good), "--once", "--wait", "-1"]) == 2


def test_help_teaches_the_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert exporter_main.main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "--check-config" in text and "[[program]]" in text and "max_series_per_metric" in text


# ------------------------------------------------------------------ a fake broker


class FakeStream:
    def __init__(self) -> None:
        self.pending: list[bytes] = []
        self.ended = False

    def poll_raw(self, timeout: float | None = None) -> list[bytes]:
        out, self.pending = self.pending, []
        return out


class FakeMap:
    def __init__(self, name: str, show: str, unit: str, key_label: str, entries: Any) -> None:
        self.name, self.show, self.unit, self.key_label = name, show, unit, key_label
        self.entries = entries
        self.description = ""
        self.per_cpu = False
        self.desc = SimpleNamespace(value_size=0)
        self.is_events = show == "events"

    def read(self) -> list[tuple[Any, Any]]:
        if isinstance(self.entries, Exception):
            raise self.entries
        return list(self.entries)

    def decode_value(self, data: bytes) -> Any:
        return 0


class FakeBroker:
    """What Session uses of gfxbpf.client.Broker."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.closed = False

    def list_programs(self) -> list[pb.ProgramListing]:
        return [
            pb.ProgramListing(
                name="syscount", available=True, maps=[pb.MapDescription(name="counts")]
            ),
            pb.ProgramListing(
                name="execsnoop", available=True, maps=[pb.MapDescription(name="events")]
            ),
            pb.ProgramListing(name="vmabind", available=False, unavailable_reason="no i915 here"),
        ]

    def attach(self, name: str, **kw: Any) -> Any:
        self.world.attaches.append(name)
        maps = {
            "syscount": {"counts": self.world.counts},
            "execsnoop": {"events": self.world.events},
        }[name]
        return SimpleNamespace(maps=maps, open_events=lambda m: self.world.stream, program=name)

    def stats(self) -> None:
        if self.world.dead or self.closed:
            raise BrokerUnreachable("the broker closed the session (EOF)")

    def close(self) -> None:
        self.closed = True


class World:
    def __init__(self) -> None:
        self.now = 0.0
        self.reachable = True
        self.dead = False
        self.connects = 0
        self.attaches: list[str] = []
        self.counts = FakeMap("counts", "counter", "count", "syscall", [(110, 5)])
        self.events = FakeMap("events", "events", "", "exec", [])
        self.stream = FakeStream()

    def connect(self) -> FakeBroker:
        self.connects += 1
        if not self.reachable:
            raise BrokerUnreachable("cannot connect to /run/x.sock: No such file or directory")
        self.dead = False
        return FakeBroker(self)


def scrape(collector: GfxbpfCollector) -> dict[str, float]:
    reg = exporter_main.registry_for(collector)
    text = generate_latest(reg).decode()
    assert "Traceback" not in text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def make(world: World) -> GfxbpfCollector:
    cfg = parse_config(GOOD, "x.toml")
    return GfxbpfCollector(
        cfg, connector=world.connect, clock=lambda: world.now, log=lambda m: None
    )


def test_a_scrape_reads_the_maps_and_reports_availability() -> None:
    world = World()
    c = make(world)
    world.stream.pending = [b"a", b"b"]
    got = scrape(c)
    assert got["gfxbpf_up"] == 1
    assert got['gfxbpf_syscount_counts_total{syscall="getppid"}'] == 5
    assert got["gfxbpf_execsnoop_events_total"] == 2
    assert got['gfxbpf_program_available{program="vmabind"}'] == 0
    assert got['gfxbpf_program_error_info{error="no i915 here",program="vmabind"}'] == 1
    world.stream.pending = [b"c"]
    world.counts.entries = [(110, 9)]
    got = scrape(c)
    assert got["gfxbpf_execsnoop_events_total"] == 3  # events accumulate across scrapes
    assert got['gfxbpf_syscount_counts_total{syscall="getppid"}'] == 9
    # The unavailable program was never asked for, and is not asked for again.
    assert world.attaches == ["syscount", "execsnoop"]


def test_broker_down_then_back_with_backoff() -> None:
    world = World()
    world.reachable = False
    c = make(world)
    got = scrape(c)
    assert got["gfxbpf_up"] == 0
    errors = [k for k in got if k.startswith("gfxbpf_last_error_info")]
    assert len(errors) == 1 and "No such file" in errors[0]
    assert world.connects == 1
    scrape(c)  # within the backoff: no new attempt
    assert world.connects == 1
    world.now += 1.0
    scrape(c)
    assert world.connects == 2
    world.now += 1.5  # the delay doubled to 2 s
    scrape(c)
    assert world.connects == 2
    world.reachable = True
    world.now += 0.5
    got = scrape(c)
    assert got["gfxbpf_up"] == 1 and world.connects == 3
    assert not [k for k in got if k.startswith("gfxbpf_last_error_info")]


def test_a_lost_session_is_reported_then_reopened() -> None:
    world = World()
    c = make(world)
    assert scrape(c)["gfxbpf_up"] == 1
    world.dead = True
    world.reachable = False  # the broker restarts: the socket is gone for now
    got = scrape(c)
    assert got["gfxbpf_up"] == 0 and got["gfxbpf_reconnects_total"] == 1
    assert any("lost the broker session" in k for k in got if k.startswith("gfxbpf_last_error"))
    world.reachable = True
    world.now += 1.0
    got = scrape(c)
    assert got["gfxbpf_up"] == 1
    assert world.attaches == ["syscount", "execsnoop"] * 2  # re-attached


def test_a_map_that_cannot_be_read_is_that_programs_error() -> None:
    world = World()
    c = make(world)
    world.counts.entries = RuntimeError("decoder exploded")
    got = scrape(c)
    assert got["gfxbpf_up"] == 1  # the session stays; no reconnect loop
    (key,) = [k for k in got if k.startswith("gfxbpf_program_error_info") and "syscount" in k]
    assert "decoder exploded" in key
    assert world.connects == 1
    world.counts.entries = [(110, 1)]
    got = scrape(c)
    assert not [k for k in got if k.startswith("gfxbpf_program_error_info") and "syscount" in k]


def test_a_broker_error_while_reading_reconnects_with_backoff() -> None:
    world = World()
    c = make(world)
    world.counts.entries = BrokerError(pb.ERROR_NOT_FOUND, "no attachment 7 (lease expired)")
    got = scrape(c)
    assert got["gfxbpf_up"] == 0 and world.connects == 1  # not again within this scrape
    assert any("lease expired" in k for k in got if k.startswith("gfxbpf_last_error_info"))
    scrape(c)
    assert world.connects == 1  # backing off
    world.counts.entries = [(110, 1)]
    world.now += 1.0
    assert scrape(c)["gfxbpf_up"] == 1 and world.connects == 2


def test_an_attach_refusal_is_not_retried() -> None:
    world = World()
    c = make(world)
    calls: list[str] = []

    def refuse(name: str, **kw: Any) -> Any:
        calls.append(name)
        raise BrokerError(pb.ERROR_PERMISSION_DENIED, "no rule lets you", '[[program]] #1 "x"')

    real = FakeBroker.attach
    FakeBroker.attach = lambda self, name, **kw: refuse(name)  # type: ignore[method-assign]
    try:
        got = scrape(c)
        scrape(c)
        world.now += 100
        scrape(c)
    finally:
        FakeBroker.attach = real  # type: ignore[method-assign]
    assert calls == ["syscount", "execsnoop"]
    assert got['gfxbpf_program_available{program="syscount"}'] == 0
    assert got["gfxbpf_up"] == 1


def test_per_cpu_values_are_summed() -> None:
    world = World()
    world.counts.per_cpu = True  # e.g. syscount as a per-CPU array: one value per CPU
    world.counts.entries = [(39, [1, 2]), (110, [0, 0])]
    got = scrape(make(world))
    assert got['gfxbpf_syscount_counts_total{syscall="getpid"}'] == 3
    assert 'gfxbpf_syscount_counts_total{syscall="getppid"}' not in got


def test_the_help_example_is_a_valid_config() -> None:
    block = exporter_main.EPILOG.split("\n", 1)[1].split("examples:")[0]
    cfg = parse_config("\n".join(ln[2:] for ln in block.splitlines()), "--help")
    assert cfg.tls is not None and cfg.tls.client_ca == "/etc/gfxbpf-exporter/ca.crt"
    assert cfg.max_series_per_metric == 1000 and cfg.programs[0].name == "syscount"


def test_a_scrape_stuck_on_the_broker_does_not_pile_up_others() -> None:
    world = World()
    c = make(world)
    c.busy_wait = 0.2
    scrape(c)
    release = threading.Event()
    entered = threading.Event()

    class Stuck(FakeMap):
        def read(self) -> list[tuple[Any, Any]]:
            entered.set()
            release.wait(10)
            return [(110, 1)]

    world.counts.__class__ = Stuck
    first = threading.Thread(target=scrape, args=(c,))
    first.start()
    assert entered.wait(5)
    got = scrape(c)  # answers after busy_wait, without reading
    assert got["gfxbpf_up"] == 0
    assert any("still waits for the broker" in k for k in got)
    release.set()
    first.join(10)
    assert scrape(c)["gfxbpf_up"] == 1
