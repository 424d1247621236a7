"""Scope job without a cluster: what the broker makes of Slurm's answers,
the cgroups it finds, the exporter's per-job labels and gfxclient's --job
flags (tests/kernel/test_slurm_job.py runs them on a real Slurm)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gfxbpf.broker.callers import Caller
from gfxbpf.broker.errors import BrokerError
from gfxbpf.broker.request import slurmjob
from gfxbpf.catalog import jobcgroups
from gfxbpf.client.cli.gfxclient import main
from gfxbpf.client.slurm import all_nodes
from gfxbpf.exporter import jobs
from gfxbpf.proto import gfxbpf_pb2 as pb

ALICE = Caller(uid=1001, gid=1001, gids=(1001,), pid=1, transport="unix")
SHOW_JOB = (
    "JobId={job} JobName=train UserId=alice({uid}) GroupId=alice(1001) JobState={state} Reason=None"
)


def fake_scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, rc: int = 0) -> None:
    """scontrol as a script that prints text (stdout, or stderr when rc != 0)."""
    script = tmp_path / "scontrol"
    stream = ">&2" if rc else ""
    script.write_text(f"#!/bin/sh\ncat <<'EOF' {stream}\n{text}\nEOF\nexit {rc}\n")
    script.chmod(0o755)
    monkeypatch.setattr(slurmjob.shutil, "which", lambda name: str(script))


def job_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: str) -> Path:
    d = tmp_path / "cg" / f"job_{job}"
    d.mkdir(parents=True)
    monkeypatch.setattr(jobcgroups, "job_dir", lambda j: str(d) if j == job else None)
    return d


def refusal(job: str) -> BrokerError:
    with pytest.raises(BrokerError) as e:
        slurmjob.check_job(ALICE, job)
    return e.value


def test_a_running_job_of_the_caller_on_this_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_scontrol(tmp_path, monkeypatch, SHOW_JOB.format(job=42, uid=1001, state="RUNNING"))
    d = job_here(tmp_path, monkeypatch, "42")
    got = slurmjob.check_job(ALICE, "42")
    assert (got.job, got.uid, got.path, got.cgroup_id) == ("42", 1001, str(d), d.stat().st_ino)
    assert got.alive()
    d.rmdir()
    assert not got.alive()  # the job left this node: its attachments are revoked


def test_another_users_job_is_refused_before_the_node_is_looked_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_scontrol(tmp_path, monkeypatch, SHOW_JOB.format(job=42, uid=1002, state="RUNNING"))
    job_here(tmp_path, monkeypatch, "42")
    e = refusal("42")
    assert e.code == pb.ERROR_PERMISSION_DENIED
    assert e.message == "Slurm job 42 is not yours: scope job profiles only your own jobs"


@pytest.mark.parametrize(
    ("state", "here", "code", "words"),
    [
        ("PENDING", True, pb.ERROR_NOT_FOUND, "Slurm job 42 is pending, not running"),
        ("RUNNING", False, pb.ERROR_NOT_FOUND, "has no processes on this node"),
    ],
)
def test_a_job_not_running_here_is_refused(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    state: str,
    here: bool,
    code: int,
    words: str,
) -> None:
    fake_scontrol(tmp_path, monkeypatch, SHOW_JOB.format(job=42, uid=1001, state=state))
    if here:
        job_here(tmp_path, monkeypatch, "42")
    else:
        monkeypatch.setattr(jobcgroups, "job_dir", lambda j: None)
    e = refusal("42")
    assert e.code == code and words in e.message, e.message


def test_slurm_answers_it_cannot_be_read_are_refusals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_scontrol(tmp_path, monkeypatch, "slurm_load_jobs error: Invalid job id specified", 1)
    e = refusal("42")
    assert (e.code, e.message) == (pb.ERROR_NOT_FOUND, "Slurm knows no job 42")
    fake_scontrol(tmp_path, monkeypatch, "Unable to contact slurm controller", 1)
    e = refusal("42")
    assert e.code == pb.ERROR_UNAVAILABLE and "Unable to contact" in e.message
    monkeypatch.setattr(slurmjob.shutil, "which", lambda name: str(tmp_path / "none"))
    e = refusal("42")
    assert e.code == pb.ERROR_UNAVAILABLE and "cannot ask Slurm" in e.message


@pytest.mark.parametrize("job", ["", "0", "12a", "-1", "1;id", "1 2", "9" * 20])
def test_a_job_id_is_digits_only(job: str) -> None:
    assert refusal(job).code == pb.ERROR_INVALID_ARGUMENT


def test_job_cgroups_are_found_under_the_slurmstepd_scope(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scope = tmp_path / "system.slice" / "node1_slurmstepd.scope"
    task = scope / "job_7" / "step_batch" / "user" / "task_0"
    task.mkdir(parents=True)
    (scope / "job_8").mkdir()
    (tmp_path / "user.slice" / "job_9").mkdir(parents=True)  # not slurmstepd's
    monkeypatch.setattr(jobcgroups, "cgroup2_mounts", lambda: [str(tmp_path)])
    assert jobcgroups.job_dir("7") == str(scope / "job_7")
    assert jobcgroups.job_dir("9") is None
    assert set(jobcgroups.job_dirs()) == {"7", "8"}
    ids = jobcgroups.job_of_cgroups()
    assert ids[task.stat().st_ino] == "7" and ids[(scope / "job_8").stat().st_ino] == "8"
    assert (tmp_path / "user.slice").stat().st_ino not in ids


def test_several_nodes_on_one_machine_each_find_their_own_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for node in ("n1", "n2"):
        (tmp_path / "system.slice" / f"{node}_slurmstepd.scope" / "job_5").mkdir(parents=True)
    monkeypatch.setattr(jobcgroups, "cgroup2_mounts", lambda: [str(tmp_path)])
    monkeypatch.setattr(jobcgroups, "node_name", lambda: "n2")
    assert jobcgroups.job_dir("5") == str(tmp_path / "system.slice/n2_slurmstepd.scope/job_5")
    monkeypatch.setattr(jobcgroups, "node_name", lambda: "elsewhere")
    assert jobcgroups.job_dir("5") is None  # two other nodes' scopes: neither is ours


def test_exporter_sums_cgroups_per_job_and_leaves_the_rest_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(jobcgroups, "job_of_cgroups", lambda: {11: "7", 12: "7", 13: "8"})
    monkeypatch.setattr(jobs, "job_users", lambda ids: {"7": "alice"} if "7" in ids else {})
    got = jobs.relabel([(11, 5), (12, 3), (13, 1), (99, 1000)])
    assert got == [
        ({"slurm_job": "7", "user": "alice"}, 5),
        ({"slurm_job": "7", "user": "alice"}, 3),
        ({"slurm_job": "8", "user": ""}, 1),
    ]


def test_all_nodes_merges_under_node_frames() -> None:
    answers: dict[str, dict[str, Any]] = {
        "n2": {"ok": True, "folded": "a;hot 3\na;cold 1\n"},
        "n1": {"ok": True, "folded": "a;hot 2\n"},
        "n3": {"ok": False, "error": "broker not running"},
        "n4": {"ok": True, "folded": "no count here\n"},
    }
    assert all_nodes.merge(answers) == {
        ("[node n1]", "a", "hot"): 2,
        ("[node n2]", "a", "hot"): 3,
        ("[node n2]", "a", "cold"): 1,
    }
    assert not answers["n4"]["ok"] and "unreadable" in answers["n4"]["error"]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["profile", "--job", "12", "--pid", str(os.getpid())], "give no --pid nor COMMAND"),
        (["profile", "--job", "12", "--", "true"], "give no --pid nor COMMAND"),
        (["profile", "--job", "12", "--off-cpu"], "--off-cpu and --wall are for scope self"),
        (["profile", "--job", "12", "--all-nodes"], "--all-nodes needs --duration"),
        (["profile", "--all-nodes", "--duration", "1"], "need --job ID"),
        (["profile", "--job", "12", "--scope", "system"], "--job is scope job"),
        (["profile", "--job", "x1"], "not a Slurm job id"),
        (["watch", "syscount", "--job", "0"], "not a Slurm job id"),
    ],
)
def test_gfxclient_job_flags_are_checked_before_connecting(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--socket", "/nonexistent/gfxbpf.sock", *argv]) != 0
    assert words in capsys.readouterr().err


def test_an_error_in_the_every_second_job_check_is_logged_not_fatal() -> None:
    from gfxbpf.broker import main as broker_main

    class Failing:
        def revoke_ended_jobs(self) -> list[int]:
            raise OSError("boom")

    class Audit:
        def __init__(self) -> None:
            self.lines: list[tuple[str, dict[str, Any]]] = []

        def error(self, op: str, **fields: Any) -> str:
            self.lines.append((op, fields))
            return ""

    audit = Audit()
    broker_main._revoke_ended_jobs(Failing(), audit)  # type: ignore[arg-type]
    assert audit.lines == [("revoke", {"detail": "checking scope job attachments: OSError: boom"})]
