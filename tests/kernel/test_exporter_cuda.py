"""gfxbpf-exporter with the `cuda` program, on the libcuda stand-in (CI has no GPU).

A per-user exporter: the exporter runs as an ordinary user (gfxtest-alice)
with a config naming only the pid of her CUDA job; it finds the job's
libcuda in /proc/PID/maps as `gfxclient watch cuda` does, and the broker
(gfxbpf, CAP_BPF + CAP_PERFMON only) attaches the stand-in built as
test_cuda.py builds it. After bench/cuda_standin.py's SCRIPT ran, /metrics
must show exactly the script's calls per function (and its copy bytes by
direction, live and peak device memory), for her job's pid only: another
process of hers and Bob's job on the same library run the script too.
Bob's exporter naming her pid gets nothing.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench import cuda_standin as cs
from tests.kernel.brokerenv import (
    ALICE,
    BASE_ENV,
    BOB,
    VENV,
    BrokerProcess,
    policy_for,
    run_as,
    setpriv_user_argv,
    shared_dir,
    wait_until,
)
from tests.kernel.promenv import free_port, http_get

pytestmark = pytest.mark.kernel
EXPORTER = f"{VENV}/bin/gfxbpf-exporter"
AVAILABLE = 'gfxbpf_program_available{program="cuda"} 1.0'
Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class Built:
    base: Path
    library: Path
    exe: Path


@pytest.fixture(scope="module")
def built() -> Iterator[Built]:
    base = shared_dir(prefix="gfxbpf-exporter-cuda-")
    out = Built(base, cs.build_library(base / "lib"), cs.build_workload(base / "bin"))
    subprocess.run(["chmod", "-R", "a+rX", str(base)], check=True)
    yield out


BROKER_START = {"grpc": False}


def broker_policy(request: pytest.FixtureRequest) -> str:
    built: Built = request.getfixturevalue("built")
    libs = [f"{built.base}/lib/libcuda.so.1"]
    return policy_for({"cuda": [{"users": [ALICE, BOB], "scope": "self", "libraries": libs}]})


def workload(built: Built, user: str) -> cs.Workload:
    return cs.Workload(
        built.exe, built.library, prefix=setpriv_user_argv(user, []), env=BASE_ENV, cwd="/"
    )


def write_config(broker: BrokerProcess, name: str, port: int, program: str) -> Path:
    path = broker.directory / name
    path.write_text(
        f'listen = "127.0.0.1:{port}"\n[broker]\nsocket = "{broker.socket}"\nvia = "fd"\n'
        f'[[program]]\nname = "cuda"\n{program}'
    )
    os.chmod(path, 0o644)
    return path


def series(text: str, name: str) -> Series:
    """{(sample name, sorted labels): value} of one family in a scrape."""
    out: Series = {}
    for family in text_string_to_metric_families(text):
        if family.name == name:
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def by(got: Series, sample: str, label: str) -> dict[str, float]:
    """Sum the samples named so, by one label's value."""
    out: dict[str, float] = {}
    for (name, labels), value in got.items():
        if name == sample:
            key = dict(labels)[label]
            out[key] = out.get(key, 0) + value
    return out


def pids(text: str) -> set[str]:
    return {
        s.labels["pid"]
        for f in text_string_to_metric_families(text)
        if f.name.startswith("gfxbpf_cuda_")
        for s in f.samples
        if "pid" in s.labels
    }


# long: one scenario: the exporter up, the script run in three processes, every figure.
def test_the_exporter_shows_exact_cuda_counts_for_its_users_pid(
    broker: BrokerProcess, built: Built
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    log = broker.directory / "exporter-cuda.log"
    with (
        workload(built, ALICE) as job,
        workload(built, ALICE) as other,
        workload(built, BOB) as bobs,
    ):
        config = write_config(broker, "exporter-cuda.toml", port, f"pid = {job.pid}\n")
        with open(log, "wb") as err:
            exporter = run_as(ALICE, [EXPORTER, "--config", str(config)], background=True,
                              stdout=subprocess.DEVNULL, stderr=err,
                              start_new_session=True)  # fmt: skip
        try:

            def scrape() -> str:
                try:
                    return http_get(url)
                except OSError:
                    return ""

            assert wait_until(lambda: AVAILABLE in scrape(), 30), log.read_text() + scrape()
            before = scrape()
            assert not series(before, "gfxbpf_cuda_calls")  # nothing called yet
            replies = job.run(cs.SCRIPT)
            other.run(cs.SCRIPT)  # hers, but not the configured pid
            bobs.run(cs.SCRIPT)  # the same library, another user
            text = scrape()
        finally:
            exporter.terminate()
            exporter.wait(10)
    assert "absent" not in replies and "Traceback" not in text
    truth = cs.truth(cs.SCRIPT)
    assert pids(text) == {str(job.pid)}
    calls = series(text, "gfxbpf_cuda_calls")
    assert by(calls, "gfxbpf_cuda_calls_total", "function") == truth.calls
    launches = {n: c for n, c in truth.calls.items() if "Launch" in n}
    launched = {k: v for k, v in calls.items() if ("role", "launch") in k[1]}
    assert by(launched, "gfxbpf_cuda_calls_total", "function") == launches
    copied = by(series(text, "gfxbpf_cuda_bytes"), "gfxbpf_cuda_bytes_total", "direction")
    assert copied == {d: n for d, n in truth.bytes_by_direction.items() if n}
    errors = series(text, "gfxbpf_cuda_errors")
    assert sum(errors.values()) == truth.errors
    latency = series(text, "gfxbpf_cuda_latency_seconds")
    assert by(latency, "gfxbpf_cuda_latency_seconds_count", "function") == truth.calls
    memory = {
        name: series(text, name)[(name, (("pid", str(job.pid)),))]
        for name in ("gfxbpf_cuda_memory_live", "gfxbpf_cuda_memory_peak")
    }
    assert memory == {"gfxbpf_cuda_memory_live": truth.live, "gfxbpf_cuda_memory_peak": truth.peak}
    r = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_an_exporter_naming_another_users_pid_gets_nothing(
    broker: BrokerProcess, built: Built
) -> None:
    """Bob's exporter names Alice's job: the finder cannot read her maps, and naming
    the library outright does not get past the broker's pid check."""
    with workload(built, ALICE) as hers:
        for name, extra, why in (
            ("bob-find.toml", "", f"process {hers.pid} is not yours"),  # the finder
            ("bob-library.toml", f'library = "{built.library}"\n', "not to you"),  # the broker
        ):
            config = write_config(broker, name, free_port(), f"pid = {hers.pid}\n{extra}")
            r = run_as(BOB, [EXPORTER, "--config", str(config), "--once"])
            assert r.returncode == 0 and "Traceback" not in r.stdout + r.stderr, r.stderr
            assert 'gfxbpf_program_available{program="cuda"} 0.0' in r.stdout
            (error,) = [ln for ln in r.stdout.splitlines() if ln.startswith("gfxbpf_program_error")]
            assert why in error, error
            assert "gfxbpf_cuda_" not in r.stdout
