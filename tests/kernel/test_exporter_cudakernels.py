"""gfxbpf-exporter with program `cudakernels` in scope system, on the CUPTI
stand-in: an administrator's exporter shows GPU seconds per user, process and
kernel of every user's processes that loaded the injection library, exactly
the stand-in's device times (test_cudakernels.py builds it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench import cupti_standin as cs
from tests.kernel.brokerenv import (
    ALICE,
    BASE_ENV,
    BOB,
    MALLORY,
    BrokerProcess,
    policy_for,
    run_as,
    setpriv_user_argv,
    uid_of,
    wait_until,
)
from tests.kernel.promenv import free_port, http_get
from tests.kernel.test_cudakernels import PYTHON, _collecting, built  # noqa: F401 - the fixture
from tests.kernel.test_exporter_cuda import EXPORTER, by, series

pytestmark = pytest.mark.kernel
AVAILABLE = 'gfxbpf_program_available{program="cudakernels"} 1.0'
BROKER_START = {"grpc": False}
N, M = 30, 20


def broker_policy(request: pytest.FixtureRequest) -> str:
    b: cs.Built = request.getfixturevalue("built")
    entry = {"users": [MALLORY], "scope": "system", "libraries": [str(b.inject)]}
    return policy_for({"cudakernels": [entry]})


def _config(broker: BrokerProcess, port: int, library: Path) -> Path:
    path = broker.directory / "exporter-cudakernels.toml"
    path.write_text(
        f'listen = "127.0.0.1:{port}"\n[broker]\nsocket = "{broker.socket}"\nvia = "fd"\n'
        f'[[program]]\nname = "cudakernels"\nscope = "system"\nlibrary = "{library}"\n'
    )
    path.chmod(0o644)
    return path


def test_gpu_seconds_per_user_process_and_kernel(broker: BrokerProcess, built: cs.Built) -> None:  # noqa: F811
    port = free_port()
    log = broker.directory / "exporter-cudakernels.log"
    config = _config(broker, port, built.inject)
    prefix = {u: setpriv_user_argv(u, []) for u in (ALICE, BOB)}
    with (
        cs.Workload(built, PYTHON, prefix[ALICE], env=BASE_ENV, cwd="/") as alices,
        cs.Workload(built, PYTHON, prefix[BOB], env=BASE_ENV, cwd="/") as bobs,
        cs.Workload(built, PYTHON, prefix[ALICE], env=BASE_ENV, cwd="/") as profiled,
    ):
        profiled.command("hold")  # her torch.profiler holds CUPTI there
        with open(log, "wb") as err:
            exporter = run_as(MALLORY, [EXPORTER, "--config", str(config)], background=True,
                              stdout=subprocess.DEVNULL, stderr=err,
                              start_new_session=True)  # fmt: skip
        try:

            def scrape() -> str:
                try:
                    return http_get(f"http://127.0.0.1:{port}/metrics")
                except OSError:
                    return ""

            assert wait_until(lambda: AVAILABLE in scrape(), 30), log.read_text() + scrape()
            _collecting(alices, 1)
            _collecting(bobs, 1)
            alices.command(f"a {N}")
            alices.command("copy 3")
            bobs.command(f"b {M}")
            profiled.command(f"a {N}")  # not seen: the metrics say why
            refused = "gfxbpf_cudakernels_refused_polls_total{" + f'pid="{profiled.pid}"'
            assert wait_until(lambda: refused in scrape(), 30), scrape()
            text = scrape()
        finally:
            exporter.terminate()
            exporter.wait(10)
    name = "gfxbpf_cudakernels_kernels_device_seconds"
    got = series(text, name)
    per = {(dict(k)["pid"], dict(k)["uid"], dict(k)["kernel"]): v for (_, k), v in got.items()}
    assert per == {
        (str(alices.pid), str(uid_of(ALICE)), "gemm"): pytest.approx(N * cs.NS["gemm"] / 1e9),
        (str(bobs.pid), str(uid_of(BOB)), "gemm"): pytest.approx(M * cs.NS["gemm"] / 1e9),
        (str(bobs.pid), str(uid_of(BOB)), "relu"): pytest.approx(M * cs.NS["relu"] / 1e9),
    }
    kernels = by(series(text, "gfxbpf_cudakernels_kernels_kernels"),
                 "gfxbpf_cudakernels_kernels_kernels_total", "uid")  # fmt: skip
    assert kernels == {str(uid_of(ALICE)): N, str(uid_of(BOB)): 2 * M}
    labels = {tuple(sorted(dict(k))) for (_, k) in got}
    assert labels == {("kernel", "pid", "uid", "user")}  # no chain, flags or padding
    users = by(got, name + "_total", "user")
    assert users == pytest.approx({ALICE: N * cs.NS["gemm"] / 1e9,
                                   BOB: M * (cs.NS["gemm"] + cs.NS["relu"]) / 1e9})  # fmt: skip
    _check_the_rest(text, alices.pid, profiled.pid)


def _check_the_rest(text: str, alices: int, profiled: int) -> None:
    """The blocked process's polls, Alice's copies, and no meaningless family."""
    polls = by(series(text, "gfxbpf_cudakernels_refused_polls"),
               "gfxbpf_cudakernels_refused_polls_total", "pid")  # fmt: skip
    assert list(polls) == [str(profiled)] and polls[str(profiled)] >= 1, polls
    copied = series(text, "gfxbpf_cudakernels_copies_bytes")
    assert {tuple(sorted(k)): v for (_, k), v in copied.items()} == {
        (("kind", "htod"), ("pid", str(alices)), ("uid", str(uid_of(ALICE))),
         ("user", ALICE)): 3 * cs.COPY_BYTES
    }  # fmt: skip
    # The catalog lists the tables' metrics (the broker's reply carries them):
    # refused only its polls, and the lookup table of code objects none.
    families = {
        line.split()[2].removesuffix("_total")
        for line in text.splitlines()
        if line.startswith("# TYPE ")
    }
    assert {f for f in families if "_refused_" in f} == {"gfxbpf_cudakernels_refused_polls"}
    assert not [f for f in families if "py_codes" in f], families
