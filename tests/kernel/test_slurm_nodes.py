"""`gfxclient profile --job ID --all-nodes` on a two-node job (issue 38):
tools/slurm_lab.sh --two-nodes runs a second slurmd, node gfxlab-n2, in
network, UTS and mount namespaces of its own on this machine, and a second
broker runs in that node's namespaces, as every node of a cluster runs its
own. gfxtest-alice's job spins in job_hot() on both nodes; the merged
profile has a [node NAME] frame per node, each answered by its node's broker
for its node's cgroup of the job.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kernel import profiling, slurmlab
from tests.kernel.brokerenv import ALICE, BrokerProcess, ensure_user, policy_for, shared_dir
from tests.kernel.test_profile import _cc
from tests.kernel.test_slurm_job import JOB_C, job_hot

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def brokers() -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    """One broker per node: this machine's, and gfxlab-n2's in its namespaces,
    whose control socket there has the path of this machine's (a bind mount),
    as every node's broker listens at the same path."""
    users = [ALICE]
    policy = policy_for(
        {
            "stackcopy": {"users": users, "scope": ["self", "job"], "max_frequency": 999},
            "profile": {"users": users, "scope": ["self", "job"], "max_frequency": 999},
        },
        limits={"map_bytes_per_user": 1 << 30},
    )
    with slurmlab.lab(two_nodes=True):
        enter = ["nsenter", "-t", str(slurmlab.node2_pid()), "-n", "-u", "-m", "--"]
        with BrokerProcess.start(policy, grpc=False) as here:
            with BrokerProcess.start(policy, grpc=False, wrapper=enter) as there:
                mine, its = os.path.dirname(here.socket), os.path.dirname(there.socket)
                subprocess.run([*enter, "mount", "--bind", its, mine], check=True)
                yield here, there


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    d = shared_dir(prefix="gfxbpf-slurm-nodes-")
    os.chown(d, *ensure_user(ALICE))
    _cc(JOB_C, d / "jobhot")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_all_nodes_on_a_two_node_job(
    brokers: tuple[BrokerProcess, BrokerProcess], workdir: Path
) -> None:
    here, there = brokers
    job = slurmlab.submit(ALICE, workdir, str(workdir / "jobhot"), "120", nodes=2)
    try:
        out = workdir / f"nodes-{job}.folded"
        args = ("--job", job, "--all-nodes", "--duration", "3", "--frequency", "199")
        doc = profiling.profile(here, out, *args)
        node = os.uname().nodename.split(".")[0]
        assert doc["nodes_answered"] == sorted([node, slurmlab.NODE2]), doc
        assert doc["nodes_failed"] == {}, doc
        stacks = profiling.stacks_of(out)
        for name in (node, slurmlab.NODE2):
            mine = [(s[1:], n) for s, n in stacks if s[0] == f"[node {name}]"]
            # The batch script's srun waits beside job_hot on the first node.
            assert profiling.share(mine, job_hot) >= 0.8, (name, mine)
        for b in (here, there):  # each node's broker, for its own cgroup of the job
            ok = [a for a in b.audit_records() if a.get("op") == "attach" and a.get("job") == job]
            assert ok and all(a["result"] == "ok" for a in ok), b.stderr()[-2000:]
    finally:
        slurmlab.cancel(job)
