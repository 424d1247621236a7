"""gfxbpf-exporter and the `cuda` program: keys named from the function table as
the client names them, the process as `pid`, a config that needs a pid of the
exporter's own user, and libcuda found as `gfxclient watch cuda` finds it."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gfxbpf.catalog import cuda_api
from gfxbpf.client import libcuda
from gfxbpf.client.cli import cuda_view
from gfxbpf.client.errors import UsageError
from gfxbpf.exporter import main as exporter_main
from gfxbpf.exporter import mapping, tables
from gfxbpf.exporter.attached import Session
from gfxbpf.exporter.config import ConfigError, parse_config
from gfxbpf.exporter.mapping import MapShape
from gfxbpf.proto import gfxbpf_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = cuda_api.index_of("cuLaunchKernel")
HTOD = cuda_api.index_of("cuMemcpyHtoD_v2")
CALLS = MapShape("cuda", "calls", "counter", "count", "process, function")


def samples(families: list[Any]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def test_the_table_labels_are_the_clients_names() -> None:
    assert len(tables.CUDA.names) == len(cuda_api.FUNCTIONS)
    for i in range(len(cuda_api.FUNCTIONS)):
        assert tables.CUDA.names[i] == cuda_view.function_name({"function": i})
    assert tables.CUDA.labels(HTOD) == [
        ("function", "cuMemcpyHtoD_v2"),
        ("role", "copy"),
        ("direction", "htod"),
    ]
    # Every series has the same label names; an index the table lacks stays a number.
    assert tables.CUDA.labels(LAUNCH)[1:] == [("role", "launch"), ("direction", "")]
    assert tables.CUDA.labels(63) == [("function", "63"), ("role", ""), ("direction", "")]


def test_cuda_counters_label_pid_function_role_and_direction() -> None:
    entries = [
        ({"tgid": 4242, "function": LAUNCH}, 1000),
        ({"tgid": 4242, "function": HTOD}, 7),
        ({"tgid": 4243, "function": LAUNCH}, 0),  # never counted: no series yet
    ]
    built = mapping.build(CALLS, entries, 100, tables.CUDA)
    launch = (("direction", ""), ("function", "cuLaunchKernel"), ("pid", "4242"))
    copy = (("direction", "htod"), ("function", "cuMemcpyHtoD_v2"), ("pid", "4242"))
    assert samples(built.families) == {
        ("gfxbpf_cuda_calls_total", (*launch, ("role", "launch"))): 1000.0,
        ("gfxbpf_cuda_calls_total", (*copy, ("role", "copy"))): 7.0,
    }


def test_cuda_names_carry_their_unit_once() -> None:
    names = {
        m: [s.name for s in mapping.metric_specs(MapShape("cuda", m, "counter", unit, "x"))]
        for m, unit in (("time_ns", "ns"), ("bytes", "bytes"), ("calls", "count"))
    }
    assert names == {
        "time_ns": ["gfxbpf_cuda_time_seconds"],
        "bytes": ["gfxbpf_cuda_bytes"],
        "calls": ["gfxbpf_cuda_calls"],
    }


def test_cuda_latency_and_memory() -> None:
    latency = MapShape("cuda", "latency", "log2_histogram", "ns", "function")
    built = mapping.build(latency, [({"function": LAUNCH, "slot": 10}, 3)], 10, tables.CUDA)
    got = samples(built.families)
    labels = (("direction", ""), ("function", "cuLaunchKernel"), ("role", "launch"))
    assert got[("gfxbpf_cuda_latency_seconds_count", labels)] == 3
    memory = MapShape("cuda", "memory", "table", "", "process", ("live", "peak", "allocs"))
    value = {"live": 3 << 20, "peak": 5 << 20, "allocs": 4}
    built = mapping.build(memory, [(4242, value)], 10, tables.CUDA)
    kinds = {f.name: f.type for f in built.families}
    assert kinds == {
        "gfxbpf_cuda_memory_live": "gauge",
        "gfxbpf_cuda_memory_peak": "gauge",
        "gfxbpf_cuda_memory_allocs": "counter",
    }
    got = samples(built.families)
    assert got[("gfxbpf_cuda_memory_live", (("pid", "4242"),))] == 3 << 20


# ------------------------------------------------------------------ configuration

CUDA_OK = '[[program]]\nname = "cuda"\npid = 4242\n'


def test_a_cuda_config_needs_only_a_pid() -> None:
    (p,) = parse_config(CUDA_OK, "x.toml").programs
    assert (p.name, p.pid, p.library, p.scope) == ("cuda", 4242, None, None)
    assert tables.functions_for(p) is tables.CUDA


@pytest.mark.parametrize(
    ("extra", "where", "what"),
    [
        ("", "field 'pid'", "exporter's own user"),
        ("pid = 1\nscope = 'system'", "field 'scope'", 'scope "self" only'),
        ("pid = 1\nfunctions = ['cuLaunchKernel']", "field 'functions'", "its own table"),
    ],
)
def test_bad_cuda_configs_say_what_to_do(extra: str, where: str, what: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(f'[[program]]\nname = "cuda"\n{extra}\n', "exp.toml")
    msg = str(e.value)
    assert msg.startswith('exp.toml: [[program]] #1 "cuda"') and where in msg and what in msg


# ------------------------------------------------------------------ finding libcuda


class Broker:
    """What Session uses of gfxbpf.client.Broker, for one cuda program."""

    def __init__(self) -> None:
        self.attached: list[dict[str, Any]] = []

    def list_programs(self) -> list[pb.ProgramListing]:
        return [pb.ProgramListing(name="cuda", available=True)]

    def attach(self, name: str, **kw: Any) -> Any:
        self.attached.append(kw)
        return SimpleNamespace(maps={}, program=name)


def session_for(pid: int) -> tuple[Session, Broker, list[float]]:
    now = [0.0]
    broker = Broker()
    cfg = parse_config(f'[[program]]\nname = "cuda"\npid = {pid}\n', "x.toml")
    return Session(broker, cfg, clock=lambda: now[0]), broker, now  # type: ignore[arg-type]


def test_libcuda_is_found_like_gfxclient_finds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []

    def find(pid: int) -> str:
        asked.append(pid)
        return "/usr/lib/x86_64-linux-gnu/libcuda.so.580.1"

    monkeypatch.setattr(libcuda, "find_libcuda", find)
    session, broker, _ = session_for(4242)
    session.attach_all()
    assert asked == [4242]
    assert broker.attached == [
        {"scope": None, "pid": 4242, "library": "/usr/lib/x86_64-linux-gnu/libcuda.so.580.1",
         "functions": ()}
    ]  # fmt: skip
    assert session.programs[0].available


def test_a_process_without_libcuda_yet_is_asked_again_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loaded: list[str] = []

    def find(pid: int) -> str:
        if not loaded:
            raise libcuda.NoLibcudaYet(f"process {pid} has no libcuda mapped")
        return loaded[0]

    monkeypatch.setattr(libcuda, "find_libcuda", find)
    session, broker, now = session_for(4242)
    session.attach_all()
    state = session.programs[0]
    assert not state.available and "has no libcuda mapped" in state.error
    loaded.append("/x/libcuda.so.1")
    session.retry_transient()  # within the backoff: not yet
    assert broker.attached == []
    now[0] += 1.0
    session.retry_transient()
    assert state.available and broker.attached[0]["library"] == "/x/libcuda.so.1"


def test_another_users_process_is_reported_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    def find(pid: int) -> str:
        raise UsageError(f"cannot read /proc/{pid}/maps: process {pid} is not yours")

    monkeypatch.setattr(libcuda, "find_libcuda", find)
    session, broker, now = session_for(4242)
    session.attach_all()
    state = session.programs[0]
    assert "is not yours" in state.error and state.retry is None
    now[0] += 1000
    session.retry_transient()
    assert broker.attached == [] and not state.available


def test_the_per_user_cuda_example_is_a_valid_config() -> None:
    text = (ROOT / "deploy" / "exporter.example.toml").read_text()
    block = text.split('# listen = "127.0.0.1:9439"', 1)[1].split("#\n", 1)[0]
    lines = ['# listen = "127.0.0.1:9439"', *block.splitlines()]
    cfg = parse_config("\n".join(ln.removeprefix("# ") for ln in lines), "example")
    (p,) = cfg.programs
    assert (p.name, p.pid, p.library, cfg.port) == ("cuda", 12345, None, 9439)


def test_check_config_names_the_pid(tmp_path: Path) -> None:
    path = tmp_path / "cuda.toml"
    path.write_text(CUDA_OK)
    out = io.StringIO()
    assert exporter_main.main(["--check-config", str(path)], out) == 0
    assert "cuda (scope from the policy, pid 4242): every map" in out.getvalue()
