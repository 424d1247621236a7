"""`gfxclient profile` in the kernel tests: run as alice against a test
broker, its folded output read back, and the share of samples a predicate
holds for. One copy for every test module that profiles."""

from __future__ import annotations

import gzip
import json
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.kernel.brokerenv import (
    ALICE,
    VENV_PYTHON,
    BrokerProcess,
    run_as,
    uid_of,
    wait_until,
)
from tests.kernel.rawclient import kernel_looking, kernel_looking_text

Stacks = list[tuple[list[str], int]]

# Waits for one line on stdin, then execs its arguments (same pid).
_HOLD = 'read -r _ && exec "$@"'


@contextmanager
def held(user: str, argv: Sequence[str]) -> Iterator[subprocess.Popen[bytes]]:
    """argv as user, held before its exec until a line arrives on its stdin
    (release_on_attach): its pid exists, owned by user, but argv has not begun.
    A test that must see argv from its start never relies on a head start:
    an attach may take a second or more on a loaded machine. Killed at the end."""
    proc = run_as(user, ["sh", "-c", _HOLD, "sh", *argv], background=True, stdin=subprocess.PIPE)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def attach_records(broker: BrokerProcess, program: str, user: str = ALICE) -> list[dict[str, Any]]:
    """The broker's audit lines of user's attaches of program that succeeded."""
    uid = uid_of(user)
    return [
        r
        for r in broker.audit_records()
        if r.get("op") == "attach"
        and r.get("result") == "ok"
        and r.get("program") == program
        and r.get("uid") == uid
    ]


def attaches(broker: BrokerProcess, program: str, user: str = ALICE) -> int:
    """How many attaches of program by user the broker has audited as done."""
    return len(attach_records(broker, program, user))


def last_attach_ms(broker: BrokerProcess, program: str, user: str = ALICE) -> float:
    """How long the broker took for user's last attach of program (audited)."""
    return float(attach_records(broker, program, user)[-1]["elapsed_ms"])


def release_on_attach(
    broker: BrokerProcess, program: str, proc: subprocess.Popen[bytes], user: str = ALICE
) -> threading.Thread:
    """Release a held() process once the broker has audited user's next attach
    of program: the attachment is live then (the line is written after it).
    Call before starting the profile; join() the thread after it."""
    before = attaches(broker, program, user)

    def go() -> None:
        if wait_until(lambda: attaches(broker, program, user) > before, 120, step=0.01):
            assert proc.stdin is not None
            proc.stdin.write(b"\n")
            proc.stdin.flush()

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def profile(
    broker: BrokerProcess,
    out: Path,
    *args: str,
    env: dict[str, str] | None = None,
    grpc: bool = False,
    fmt: str = "folded",
    stderr: list[str] | None = None,
) -> dict[str, Any]:
    """gfxclient profile ARGS as alice, stacks into out (--format fmt); its
    JSON summary (its stderr's lines, the command's among them, added to
    stderr). It must succeed without a traceback or a kernel address."""
    argv = [VENV_PYTHON, "-m", "gfxbpf.client", "--socket", broker.socket, "--json"]
    if grpc:  # no map fds: maps are read through the broker
        argv += ["--grpc", broker.grpc or "", "--via", "grpc"]
    # ARGS' flags before the output ones: argparse hands what follows -o FILE to COMMAND.
    i = args.index("--") if "--" in args else len(args)
    argv += ["profile", *args[:i], "--format", fmt, "-o", str(out), *args[i:]]
    r = run_as(ALICE, argv, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    if stderr is not None:
        stderr.extend(r.stderr.splitlines())
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


def build_o2(gcc: str, source: str, out: Path, *extra: str) -> Path:
    """Build out from C source with -O2 and no frame pointers (the unwinder's
    hard case: call-frame information only); extra: more gcc arguments."""
    c = out.with_suffix(".c")
    c.write_text(source)
    cmd = [gcc, "-O2", "-fomit-frame-pointer", str(c), "-o", str(out), *extra]
    subprocess.run(cmd, check=True, capture_output=True)
    out.chmod(0o755)
    return out
