"""`gfxclient watch cuda --by-python` on the libcuda stand-in (CI has no GPU).

Debian's /usr/bin/python3, run as an ordinary user, loads the stand-in
through ctypes and launches from two Python functions, N and M times; the
watch (program ustackcopy on the launch functions, broker with CAP_BPF +
CAP_PERFMON only) must show both functions with exactly those counts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import cuda_standin as cs
from tests.conftest import skip_or_fail
from tests.kernel.brokerenv import (
    ALICE,
    BOB,
    VENV_PYTHON,
    BrokerProcess,
    policy_for,
    run_as,
    shared_dir,
)

pytestmark = pytest.mark.kernel
PYTHON = "/usr/bin/python3"
N, M = 1000, 3000
# Launches from launch_a (line 6) and launch_b (line 9), after a go on stdin;
# the process stays until its stdin closes, so the watch reads a live target.
SCRIPT = """\
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
n, m = int(sys.argv[2]), int(sys.argv[3])
def launch_a(n):
    for _ in range(n):
        lib.cuLaunchKernel()
def launch_b(n):
    for _ in range(n):
        lib.cuLaunchKernelEx()
print("ready", flush=True)
sys.stdin.readline()
launch_a(n)
launch_b(m)
print("done", flush=True)
sys.stdin.readline()
"""


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    if not os.access(PYTHON, os.X_OK):
        skip_or_fail(f"{PYTHON} is not installed")
    d = shared_dir(prefix="gfxbpf-cudapy-")
    cs.build_library(d / "lib")
    (d / "launches.py").write_text(SCRIPT)
    subprocess.run(["chmod", "-R", "a+rX", str(d)], check=True)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def broker_policy(request: pytest.FixtureRequest) -> str:
    work: Path = request.getfixturevalue("work")
    lib = str(work / "lib" / cs.LIBNAME)
    return policy_for(
        {
            "cuda": {"users": [ALICE, BOB], "scope": "self", "libraries": [lib]},
            "ustackcopy": {"users": [ALICE], "scope": "self", "libraries": [lib]},
        },
        limits={"map_bytes_per_user": 1 << 30},
    )


def _target(work: Path, user: str) -> subprocess.Popen[str]:
    p: subprocess.Popen[str] = run_as(
        user,
        [PYTHON, str(work / "launches.py"), str(work / "lib" / cs.LIBNAME), str(N), str(M)],
        background=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    return p


def _watch(broker: BrokerProcess, user: str, *args: str, via: str = "fd") -> subprocess.Popen[str]:
    assert broker.grpc is not None
    argv = [VENV_PYTHON, "-m", "gfxbpf.client", "--socket", broker.socket, "--grpc", broker.grpc]
    argv += ["--via", via]  # grpc: no map fds, the code objects come through the broker
    return run_as(
        user,
        [*argv, "watch", "cuda", "--by-python", *args],
        background=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stop(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        p.kill()
        p.wait()


@pytest.mark.parametrize("via", ["fd", "grpc"])
def test_launches_are_counted_exactly_per_python_function(
    broker: BrokerProcess, work: Path, via: str
) -> None:
    target = _target(work, ALICE)
    watch = _watch(broker, ALICE, "--pid", str(target.pid), "--json", "--duration", "3", via=via)
    try:
        assert watch.stdout is not None and target.stdin is not None and target.stdout
        first = json.loads(watch.stdout.readline())  # right after attaching
        target.stdin.write("go\n")
        target.stdin.flush()
        assert target.stdout.readline() == "done\n"
        lines = [json.loads(ln) for ln in watch.stdout]
        assert watch.wait(30) == 0, watch.stderr.read() if watch.stderr else ""
    finally:
        _stop(watch)
        _stop(target)
    assert first["launches"] == 0 and first["library"] == str(work / "lib" / cs.LIBNAME)
    assert {"cuLaunchKernel", "cuLaunchKernelEx"} <= set(first["functions"])
    last = lines[-1]
    got = {g["function"]: g for g in last["python_functions"]}
    script = str(work / "launches.py")
    assert set(got) == {f"launch_a ({script}:6)", f"launch_b ({script}:9)"}, got
    a, b = got[f"launch_a ({script}:6)"], got[f"launch_b ({script}:9)"]
    assert (a["launches"], b["launches"], last["launches"]) == (N, M, N + M)
    assert last["lost"] == 0
    assert a["by_launch_function"] == {"cuLaunchKernel": N}
    assert b["by_launch_function"] == {"cuLaunchKernelEx": M}
    assert a["pid"] == b["pid"] == target.pid
    # the chain, root first: the module's call line, then the function
    assert a["chains"] == [
        {"chain": [f"<module> ({script}:12)", f"launch_a ({script}:6)"], "launches": N}
    ]
    assert [c["chain"][0] for c in b["chains"]] == [f"<module> ({script}:13)"]


def test_without_ustackcopy_the_error_says_what_to_ask_for(
    broker: BrokerProcess, work: Path
) -> None:
    target = _target(work, BOB)
    try:
        watch = _watch(broker, BOB, "--pid", str(target.pid), "--once")
        _, err = watch.communicate(timeout=60)
    finally:
        _stop(target)
    assert watch.returncode == 3, err  # denied by the policy
    assert "needs program ustackcopy" in err and "ask the administrator" in err, err
