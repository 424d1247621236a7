"""`gfxclient profile` in the kernel tests: run as alice against a test
broker, its folded output read back, and the share of samples a predicate
holds for. One copy for every test module that profiles."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.kernel.brokerenv import ALICE, VENV_PYTHON, BrokerProcess, run_as
from tests.kernel.rawclient import kernel_looking, kernel_looking_text

Stacks = list[tuple[list[str], int]]


def profile(
    broker: BrokerProcess,
    out: Path,
    *args: str,
    env: dict[str, str] | None = None,
    grpc: bool = False,
    fmt: str = "folded",
) -> dict[str, Any]:
    """gfxclient profile ARGS as alice, stacks into out (--format fmt); its
    JSON summary. It must succeed without a traceback or a kernel address."""
    argv = [VENV_PYTHON, "-m", "gfxbpf.client", "--socket", broker.socket, "--json"]
    if grpc:  # no map fds: maps are read through the broker
        argv += ["--grpc", broker.grpc or "", "--via", "grpc"]
    # ARGS' flags before the output ones: argparse hands what follows -o FILE to COMMAND.
    i = args.index("--") if "--" in args else len(args)
    argv += ["profile", *args[:i], "--format", fmt, "-o", str(out), *args[i:]]
    r = run_as(ALICE, argv, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    if fmt == "pprof":
        assert kernel_looking(gzip.decompress(out.read_bytes())) == []
        written = ""
    else:
        written = out.read_text()
    assert kernel_looking_text(r.stdout + r.stderr + written) == []
    return json.loads(r.stdout)


def stacks_of(path: Path) -> Stacks:
    """Folded stacks (`a;b;c COUNT`, root first) as (frames, count) pairs."""
    out = []
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        out.append((stack.split(";"), int(n)))
    return out


def share(stacks: Stacks, pred: Callable[[list[str]], bool]) -> float:
    """The share of samples whose frames pred holds for (enough to judge by)."""
    total = sum(n for _, n in stacks)
    assert total > 100, stacks  # enough samples to judge a share by
    return sum(n for s, n in stacks if pred(s)) / total
