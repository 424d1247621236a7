"""Scope job on a real Slurm cluster (issue 38): tools/slurm_lab.sh's
slurmctld and slurmd on this machine, cgroup v2 containment.

gfxtest-alice's batch job spins in job_hot(); alice also runs a process of
her own outside the job, spinning in outside_hot(). `gfxclient profile --job
ID` as alice must see the job (>= 90% of the samples in job_hot) and nothing
of the process outside it; gfxtest-bob asking for alice's job is refused; a
job that ends has its attachments revoked within 5 s; `--all-nodes` gives
the same profile under a [node NAME] frame. The broker runs as the unit runs
it (user gfxbpf, CAP_BPF + CAP_PERFMON only) and asks Slurm itself.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kernel import profiling, slurmlab
from tests.kernel.brokerenv import (
    ALICE,
    BOB,
    VENV_PYTHON,
    BrokerProcess,
    ensure_user,
    policy_for,
    run_as,
    shared_dir,
    wait_until,
)
from tests.kernel.promenv import PrometheusServer, free_port
from tests.kernel.test_exporter import EXPORTER_USER, start_exporter
from tests.kernel.test_profile import _cc, gfxclient

pytestmark = pytest.mark.kernel

SAMPLES = "gfxbpf_cgroupcpu_samples_total"

JOB_C = r"""
#include <stdlib.h>
#include <time.h>
volatile unsigned long sink;
__attribute__((noinline)) void job_hot(double seconds)
{
    time_t end = time(0) + (time_t)seconds;
    while (time(0) < end)
        for (int i = 0; i < 100000; i++) sink += i;
}
int main(int argc, char **argv) { job_hot(argc > 1 ? atof(argv[1]) : 60); return 0; }
"""
OUTSIDE_C = JOB_C.replace("job_hot", "outside_hot")
REVOKE_WITHIN_S = 5.0


@pytest.fixture(scope="module")
def progs() -> Iterator[dict[str, Path]]:
    d = shared_dir(prefix="gfxbpf-slurm-")
    os.chown(d, *ensure_user(ALICE))  # alice's jobs and profiles write here
    out = {"dir": d, "job": _cc(JOB_C, d / "jobhot"), "outside": _cc(OUTSIDE_C, d / "outsidehot")}
    yield out
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def cluster() -> Iterator[None]:
    with slurmlab.lab():
        yield


def broker_policy(request: pytest.FixtureRequest) -> str:
    users = [ALICE, BOB]
    return policy_for(
        {
            "stackcopy": {"users": users, "scope": ["self", "job"], "max_frequency": 999},
            "profile": {"users": users, "scope": ["self", "job"], "max_frequency": 999},
            "syscount": {"users": users, "scope": ["self", "job"]},
            "cgroupcpu": {"users": [EXPORTER_USER], "scope": "system"},
        },
        limits={"map_bytes_per_user": 1 << 30},
    )


def refused(broker: BrokerProcess, *args: str, user: str = ALICE) -> str:
    """gfxclient ARGS, which must fail with a message (no traceback): its stderr."""
    r = gfxclient(broker, "fd", *args, user=user)
    assert r.returncode != 0, r.stdout
    return str(r.stderr)


def job_hot(frames: list[str]) -> bool:
    return "job_hot" in frames


@pytest.fixture
def alice_job(progs: dict[str, Path]) -> Iterator[str]:
    job = slurmlab.submit(ALICE, progs["dir"], str(progs["job"]), "120")
    yield job
    slurmlab.cancel(job)


@pytest.fixture
def alice_outside(progs: dict[str, Path]) -> Iterator[int]:
    """Alice's busy process outside any job: the same user, never in the profile."""
    p = run_as(ALICE, [str(progs["outside"]), "120"], background=True)
    yield p.pid
    p.kill()
    p.wait()


def test_profile_job_sees_the_job_and_nothing_else(
    broker: BrokerProcess, progs: dict[str, Path], alice_job: str, alice_outside: int
) -> None:
    out = progs["dir"] / f"job-{alice_job}.folded"
    job = ("--job", alice_job, "--duration", "3", "--frequency", "199")
    summary = profiling.profile(broker, out, *job)
    stacks = profiling.stacks_of(out)
    assert profiling.share(stacks, job_hot) >= 0.90, stacks
    assert not any("outside_hot" in f or "outsidehot" in f for s, _ in stacks for f in s), stacks
    seen = set(summary["processes"])
    assert alice_outside not in seen, summary["processes"]
    cgroup = slurmlab.job_cgroup(alice_job)
    assert cgroup is not None
    in_job = _pids_under(cgroup)
    assert seen and seen <= in_job, (seen, in_job)
    # The control: alice's scope self (all her processes) does see the outside one.
    mine = progs["dir"] / f"self-{alice_job}.folded"
    profiling.profile(broker, mine, "--scope", "self", "--duration", "3", "--frequency", "199")
    assert profiling.share(profiling.stacks_of(mine), lambda s: "outside_hot" in s) > 0
    attach = [
        a for a in broker.audit_records() if a.get("op") == "attach" and a.get("scope") == "job"
    ]
    assert attach and attach[-1]["result"] == "ok", attach[-1:]


def _pids_under(cgroup: str) -> set[int]:
    pids: set[int] = set()
    for d, _, files in os.walk(cgroup):
        if "cgroup.procs" in files:
            with open(os.path.join(d, "cgroup.procs")) as f:
                pids.update(int(x) for x in f.read().split())
    return pids


def test_bob_is_refused_alices_job(broker: BrokerProcess, alice_job: str) -> None:
    err = refused(broker, "profile", "--job", alice_job, "--duration", "1", user=BOB)
    assert f"Slurm job {alice_job} is not yours" in err, err
    err = refused(broker, "watch", "syscount", "--job", alice_job, "--once", user=BOB)
    assert "is not yours" in err, err


def test_watch_job_counts_the_job(broker: BrokerProcess, alice_job: str) -> None:
    r = gfxclient(broker, "fd", "--json", "watch", "syscount", "--job", alice_job, "--once")
    assert r.returncode == 0, r.stderr
    view = json.loads(r.stdout.splitlines()[-1])
    assert view["scope"] == "job", view


def test_a_job_not_on_this_node_or_unknown_is_refused(broker: BrokerProcess) -> None:
    err = refused(broker, "profile", "--job", "999999", "--duration", "1")
    assert "Slurm knows no job 999999" in err, err
    err = refused(broker, "profile", "--scope", "job", "--duration", "1")
    assert "--job ID" in err, err


def test_a_job_that_ends_is_revoked_within_five_seconds(
    broker: BrokerProcess, progs: dict[str, Path]
) -> None:
    """From scancel to the broker's revoke: at most 5 s. A gRPC watch, which
    reads through the broker, is then told why; a profile ends by itself."""
    job = slurmlab.submit(ALICE, progs["dir"], str(progs["job"]), "120")
    assert broker.grpc is not None
    base = [VENV_PYTHON, "-m", "gfxbpf.client", "--socket", broker.socket]
    watch = [*base, "--grpc", broker.grpc, "--via", "grpc", "--json", "watch", "syscount"]
    watch += ["--job", job, "--interval", "0.5", "--duration", "60"]
    profile = [*base, "profile", "--job", job, "--duration", "60", "--format", "folded"]
    profile += ["-o", str(progs["dir"] / f"revoked-{job}.folded")]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    clients = [run_as(ALICE, argv, background=True, **pipes) for argv in (watch, profile)]
    try:
        attached = wait_until(lambda: len(_records(broker, "attach", job)) == 2, 30, 0.1)
        assert attached, broker.stderr()[-2000:]
        slurmlab.cancel(job)
        cancelled = time.monotonic()
        revoked = wait_until(lambda: _records(broker, "revoke", job), REVOKE_WITHIN_S, 0.05)
        assert revoked, broker.stderr()[-3000:]
        assert time.monotonic() - cancelled <= REVOKE_WITHIN_S
        rec = _records(broker, "revoke", job)[-1]
        assert f"Slurm job {job} ended" in rec["detail"], rec
        _, err = clients[0].communicate(timeout=30)
        assert clients[0].returncode != 0 and f"Slurm job {job} ended" in err.decode(), err
        # The profile ends with the job, well before its --duration, and keeps what it took.
        _, err = clients[1].communicate(timeout=30)
        assert clients[1].returncode == 0, err
        assert f"Slurm job {job} ended: the profile stopped with it" in err.decode(), err
    finally:
        for c in clients:
            c.kill()
            c.wait()


def _records(broker: BrokerProcess, op: str, job: str) -> list[dict[str, Any]]:
    """The audit lines of op for scope job whose detail or attach names job."""
    out = []
    for a in broker.audit_records():
        if a.get("op") != op or a.get("scope") != "job":
            continue
        if f"job {job}" not in str(a.get("detail", "")) and a.get("job") != job:
            continue
        out.append(a)
    return out


def test_all_nodes_on_a_one_node_job(
    broker: BrokerProcess, progs: dict[str, Path], alice_job: str
) -> None:
    out = progs["dir"] / f"nodes-{alice_job}.folded"
    job = ("--job", alice_job, "--all-nodes", "--duration", "3", "--frequency", "199")
    doc = profiling.profile(broker, out, *job)
    node = os.uname().nodename.split(".")[0]
    assert doc["nodes_answered"] == [node] and doc["nodes_failed"] == {}, doc
    stacks = profiling.stacks_of(out)
    assert sum(n for _, n in stacks) == doc["samples"], doc
    assert all(s[0] == f"[node {node}]" for s, _ in stacks), stacks[:5]
    assert profiling.share(stacks, job_hot) >= 0.90, stacks


def test_exporter_job_series_are_scraped_by_prometheus(
    broker: BrokerProcess, progs: dict[str, Path], alice_job: str, alice_outside: int
) -> None:
    """cgroupcpu's samples per cgroup, summed per job: alice's job has a series
    labelled with its id and her name that grows while it spins; her process
    outside the job and the rest of the host have none."""
    ensure_user(EXPORTER_USER)
    port = free_port()
    config = broker.directory / "exporter-jobs.toml"
    config.write_text(
        f'listen = "127.0.0.1:{port}"\n[broker]\nsocket = "{broker.socket}"\n'
        '[[program]]\nname = "cgroupcpu"\nscope = "system"\n'
    )
    os.chmod(config, 0o644)
    exporter = start_exporter(config, broker.directory / "exporter-jobs.log")
    try:
        with PrometheusServer.start([f"127.0.0.1:{port}"]) as prom:
            expr = f'{SAMPLES}{{slurm_job="{alice_job}",user="{ALICE}"}}'
            first = prom.wait_value(expr, lambda v: v is not None and v > 0, timeout=60)
            assert first is not None, (prom.log(), broker.stderr()[-2000:])
            time.sleep(4)
            later = prom.value(expr)
            # At most one CPU's worth (99 Hz, the job spins on one thread): no
            # other cgroup is counted with it. At least some: the job runs.
            assert later is not None and 0 < later - first <= 99 * 1.1 * (4 + 2), (first, later)
            series = prom.query(SAMPLES)
            jobs = {s["metric"]["slurm_job"] for s in series}
            assert jobs <= set(slurmlab.running_jobs()), series
            assert all(s["metric"]["job"] == "gfxbpf" for s in series), series
    finally:
        exporter.terminate()
        exporter.wait(timeout=20)
