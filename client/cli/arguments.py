"""Argument types and flags that several gfxclient commands share."""

from __future__ import annotations

import argparse

from gfxbpf.bpf.consts import SCOPES
from gfxbpf.client.errors import UsageError
from gfxbpf.client.printable import printable

PROG = "gfxclient"


def positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text!r}")
    return value


def nonnegative_number(text: str) -> float:
    if text.strip() in ("0", "0.0"):
        return 0.0
    return positive_number(text)


def process_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a process id: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"not a process id: {text!r}")
    return value


def count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def job_id(text: str) -> str:
    """A Slurm job id (digits), as squeue prints it."""
    if not text.isdigit() or text.startswith("0") or len(text) > 19:
        raise argparse.ArgumentTypeError(f"not a Slurm job id: {text!r}")
    return text


def add_job_argument(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--job",
        type=job_id,
        metavar="ID",
        help=f"{what} in your Slurm job ID on this node only (scope job; filtered in the kernel "
        "by the job's cgroup)",
    )


def add_attach_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help="program name (see `gfxclient list`)")
    p.add_argument("--scope", choices=SCOPES, help="default: the policy's scope")
    add_job_argument(p, "your processes")
    p.add_argument(
        "--pid",
        type=process_id,
        help="target process (per-process programs), with the processes it starts",
    )
    p.add_argument(
        "--no-children",
        action="store_true",
        help="with --pid: that process only, not its child processes",
    )
    p.add_argument(
        "--library", metavar="PATH", help="uprobe target (ucalls); a file you can read yourself"
    )
    p.add_argument(
        "--function",
        dest="functions",
        metavar="F",
        action="append",
        default=[],
        help="function in --library to trace; repeat or comma-separate",
    )


def function_names(args: argparse.Namespace) -> list[str]:
    out: list[str] = []
    for item in getattr(args, "functions", []) or []:
        out.extend(f.strip() for f in item.split(",") if f.strip())
    return out


def format_of_output(output: str | None) -> str | None:
    """-o FILE's format, from its name; UsageError where the name names none."""
    from gfxbpf.client.profiles.writers import FORMATS, format_of

    try:
        return format_of(output) if output else None
    except ValueError as e:
        raise UsageError(f"-o: {e}, or give --format {'|'.join(FORMATS)}") from None


def check_output(path: str) -> None:
    """-o FILE can be written: found out before the profile, not after it."""
    from gfxbpf.client.profiles.writers import check_writable

    try:
        check_writable(path)
    except OSError as e:
        raise UsageError(
            f"-o: cannot write {printable(path)}: {e.strerror or e} (checked before "
            "profiling, so that nothing is lost)"
        ) from None
