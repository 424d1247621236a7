"""`gfxclient profile --job ID --all-nodes`: one profile per node of the job,
merged into one file.

Slurm itself reaches the nodes: `srun --jobid ID --overlap` starts, as the
user and inside the job's allocation, one task per node of the job; each runs
this gfxclient's `profile --job ID --node-part`, which profiles the job on its
node through that node's broker (scope job: the broker there checks the job
with Slurm) and prints one JSON line, its folded stacks or why it could not.
srun writes each node's line to a file of its own here (--output with %N),
and the stacks are merged under one `[node NAME]` root frame per node. The
report says which nodes answered and why the others did not.

The profiler runs inside the job's cgroup on each node (an srun step): its own
process is left out of the samples as in every profile (engine.live.not_ours).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any, TextIO

from gfxbpf.client.errors import ClientError
from gfxbpf.client.profiles import writers
from gfxbpf.client.profiles.folded import FoldedError, parse_folded
from gfxbpf.client.profiles.model import Profile
from gfxbpf.client.profiles.top import format_top

# srun's own start and the nodes' attaches, beyond --duration.
SRUN_SLACK_S = 120.0
_QUERY_TIMEOUT_S = 30.0


def node_frame(node: str) -> str:
    return f"[node {node}]"


def job_nodes(job: str) -> list[str]:
    """The job's nodes, from Slurm (its compressed list expanded)."""
    listed = _slurm(["squeue", "--noheader", "--jobs", job, "--format", "%N"])
    if not listed:
        raise ClientError(f"Slurm job {job} has no nodes (is it running? squeue --me)")
    return _slurm(["scontrol", "show", "hostnames", listed[0]])


def _slurm(argv: list[str]) -> list[str]:
    if shutil.which(argv[0]) is None:
        raise ClientError(f"--all-nodes needs Slurm's {argv[0]} on this machine's PATH")
    try:
        r = subprocess.run(
            argv, capture_output=True, text=True, timeout=_QUERY_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise ClientError(f"{argv[0]} did not answer in {_QUERY_TIMEOUT_S:g} s") from None
    if r.returncode != 0:
        said = (r.stderr or r.stdout).strip()
        raise ClientError(f"{' '.join(argv)}: {said or f'exit {r.returncode}'}")
    return [line.strip() for line in r.stdout.splitlines() if line.strip()]


def _remote_argv(args: argparse.Namespace) -> list[str]:
    """This gfxclient's profile of the job on one node, as srun runs it there."""
    argv = [sys.executable, "-m", "gfxbpf.client"]
    for flag in ("socket", "grpc", "via"):
        if getattr(args, flag, None):
            argv += [f"--{flag}", str(getattr(args, flag))]
    argv += ["profile", "--job", args.job, "--node-part", "--duration", str(args.duration)]
    if args.frequency:
        argv += ["--frequency", str(args.frequency)]
    if args.stack_bytes:
        argv += ["--stack-bytes", str(args.stack_bytes)]
    return argv


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Profile every node of the job and write the merged file and report."""
    nodes = job_nodes(args.job)
    with tempfile.TemporaryDirectory(prefix="gfxclient-nodes-") as tmp:
        srun = [
            "srun", f"--jobid={args.job}", "--overlap", f"--nodes={len(nodes)}",
            f"--ntasks={len(nodes)}", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
            "--quiet", f"--output={tmp}/%N.json", f"--error={tmp}/%N.err",
            "--", *_remote_argv(args),
        ]  # fmt: skip
        if shutil.which("srun") is None:
            raise ClientError("--all-nodes needs Slurm's srun on this machine's PATH")
        try:
            subprocess.run(srun, timeout=args.duration + SRUN_SLACK_S, check=False)
        except subprocess.TimeoutExpired:
            pass  # the nodes that wrote their line still count
        answers = {node: _answer(tmp, node) for node in nodes}
    return _write(args, out, merge(answers), answers)


def _answer(tmp: str, node: str) -> dict[str, Any]:
    """One node's JSON line, or why there is none."""
    try:
        with open(os.path.join(tmp, f"{node}.json"), encoding="utf-8") as f:
            lines = [line for line in f if line.startswith("{")]
        return json.loads(lines[-1]) if lines else {"ok": False, "error": "no answer"}
    except (OSError, ValueError):
        return {"ok": False, "error": _last_error(tmp, node) or "no answer (srun did not reach it)"}


def _last_error(tmp: str, node: str) -> str:
    """The last line the node's task wrote to stderr ("" if none)."""
    try:
        with open(os.path.join(tmp, f"{node}.err"), encoding="utf-8", errors="replace") as f:
            said = f.read().strip().splitlines()
    except OSError:
        return ""
    return said[-1] if said else ""


def merge(answers: dict[str, dict[str, Any]]) -> dict[tuple[str, ...], int]:
    """The nodes' stacks under one [node NAME] root frame each."""
    stacks: dict[tuple[str, ...], int] = {}
    for node, doc in sorted(answers.items()):
        if not doc.get("ok"):
            continue
        try:
            part = parse_folded(str(doc.get("folded", "")).splitlines())
        except FoldedError as e:
            doc.update(ok=False, error=f"unreadable stacks: {e}")
            continue
        for frames, weight in part.items():
            key = (node_frame(node), *frames)
            stacks[key] = stacks.get(key, 0) + weight
    return stacks


def _write(
    args: argparse.Namespace,
    out: TextIO,
    stacks: dict[tuple[str, ...], int],
    answers: dict[str, dict[str, Any]],
) -> int:
    freq = args.frequency or 99
    prof = Profile(stacks, unit="samples", period_ns=10**9 // freq, duration_s=args.duration)
    output = args.output
    if output:
        fmt = args.format or writers.format_of(output)
        try:
            writers.write_profile(prof, fmt, output)
        except OSError as e:
            raise ClientError(f"cannot write {output}: {e.strerror or e}") from None
    answered = [n for n, d in sorted(answers.items()) if d.get("ok")]
    silent = {
        n: str(d.get("error", "no answer")) for n, d in sorted(answers.items()) if n not in answered
    }
    if args.json:
        doc = {
            "job": args.job,
            "nodes_answered": answered,
            "nodes_failed": silent,
            "samples": prof.total(),
            "output": output,
        }
        json.dump(doc, out, indent=2)
        out.write("\n")
    else:
        out.write(_report(args.job, prof, answered, silent, output))
    if not answered:
        raise ClientError(
            f"no node of job {args.job} answered: "
            + "; ".join(f"{n}: {why}" for n, why in silent.items())
        )
    return 0


def _report(
    job: str, prof: Profile, answered: list[str], silent: dict[str, str], output: str | None
) -> str:
    lines = [f"job {job}: {prof.total()} samples from {len(answered)} of "
             f"{len(answered) + len(silent)} nodes"]  # fmt: skip
    lines.append(f"  answered: {', '.join(answered) or 'none'}")
    for node, why in silent.items():
        lines.append(f"  no profile from {node}: {why}")
    if prof.total():
        lines.append(format_top(prof, 10).rstrip("\n"))
    if output:
        lines.append(f"wrote {output}")
    return "\n".join(lines) + "\n"


def node_part(
    args: argparse.Namespace, out: TextIO, profile: Callable[[argparse.Namespace, TextIO], int]
) -> int:
    """On one node (run by srun): profile(args, out) the job here (profile_job's,
    passed in: it imports this module), print one JSON line."""
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    with tempfile.TemporaryDirectory(prefix="gfxclient-node-") as tmp:
        args.output, args.format, args.json = os.path.join(tmp, "stacks.folded"), "folded", True
        summary = io.StringIO()
        try:
            profile(args, summary)
            with open(args.output, encoding="utf-8") as f:
                doc: dict[str, Any] = {"node": node, "ok": True, "folded": f.read()}
        except ClientError as e:
            doc = {"node": node, "ok": False, "error": str(e)}
    out.write(json.dumps(doc) + "\n")
    return 0
