"""Complete stacks of a process in a chroot (issue 22's acceptance: the container case).

Programs of a Debian 13 userland (tests/kernel/chroots.py: another glibc,
compiler and Python than the host's) run in it as gfxtest-alice, chrooted or
in a container of their own (mount namespace, pivot_root); alice profiles
them from the host with `gfxclient profile --pid`. The container's files are
found only through /proc/PID/root (the host has other files at the same
paths); the stacks must be as complete as the host programs' in
test_unwind_profile.py. Bob runs the same program at the same time: his
process never appears, and --pid on it gives nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kernel.brokerenv import (
    ALICE,
    BOB,
    VENV_PYTHON,
    BrokerProcess,
    ensure_user,
    policy_for,
    run_as,
    shared_dir,
)
from tests.kernel.chroots import CONTAINER, ISOLATIONS, popen_in, user_dir_in
from tests.kernel.profiling import share, stacks_of
from tests.kernel.rawclient import kernel_looking_text

pytestmark = pytest.mark.kernel

MAX_HZ = 999
INSIDE = "/tmp/gfxbpf-unwind"  # the workloads' directory, as the chrooted programs see it

PY_LOOP = (
    "import sys, time\n"
    "def inner(n):\n"
    "    s = 0\n"
    "    for i in range(n):\n"
    "        s += i * i\n"
    "    return s\n"
    "def outer(seconds):\n"
    "    end = time.process_time() + seconds\n"
    "    while time.process_time() < end:\n"
    "        inner(20000)\n"
    "outer(float(sys.argv[1]))\n"
)


def broker_policy(request: pytest.FixtureRequest) -> str:
    return policy_for(
        {
            "profile": {"users": [ALICE, BOB], "scope": "self", "max_frequency": MAX_HZ},
            "stackcopy": {"users": [ALICE, BOB], "scope": "self", "max_frequency": MAX_HZ},
        },
        limits={"map_bytes_per_user": 1 << 30},
    )


@pytest.fixture(scope="module")
def inside(debian13_root: Path) -> Path:
    """The workloads' directory inside the Debian 13 root, alice's."""
    d = user_dir_in(debian13_root, ALICE, os.path.basename(INSIDE))
    (d / "random.bin").write_bytes(os.urandom(64 << 20))  # xz -9 runs far longer than a profile
    os.chown(d / "random.bin", *ensure_user(ALICE))
    (d / "loop.py").write_text(PY_LOOP)
    (d / "loop.py").chmod(0o644)
    return d


@pytest.fixture(scope="module")
def out_dir() -> Iterator[Path]:
    d = shared_dir(prefix="gfxbpf-unwind-chroot-")
    os.chown(d, *ensure_user(ALICE))
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=False)


def profile_pid(broker: BrokerProcess, pid: int, out: Path) -> subprocess.CompletedProcess[str]:
    argv = [VENV_PYTHON, "-m", "gfxbpf.client", "--socket", broker.socket, "--json", "profile"]
    argv += ["--pid", str(pid), "--duration", "3", "--frequency", "499"]
    argv += ["--format", "folded", "-o", str(out)]
    return run_as(ALICE, argv, timeout=300)


def profiled_in_chroot(
    broker: BrokerProcess, root: Path, argv: list[str], isolation: str, out: Path
) -> list[tuple[list[str], int]]:
    """alice's argv in root profiled for 3 s by --pid while bob runs the same; the stacks."""
    alice = popen_in(root, ALICE, argv, isolation)
    bob = popen_in(root, BOB, argv, isolation)
    try:
        time.sleep(0.5)  # both have exec'd their program
        assert alice.poll() is None and bob.poll() is None
        assert Path(f"/proc/{alice.pid}/root/etc/debian_version").read_text().startswith("13")
        r = profile_pid(broker, alice.pid, out)
        assert r.returncode == 0, r.stderr
        summary = json.loads(r.stdout)
        assert summary["processes"] == [alice.pid], summary
        assert bob.pid not in [p["pid"] for p in summary["processes_seen"]], summary
        assert kernel_looking_text(r.stdout + r.stderr + out.read_text()) == []
        _bobs_pid_gives_nothing(broker, bob.pid, out.with_suffix(".bob"))
    finally:
        for p in (alice, bob):
            p.kill()
            p.wait()
    return stacks_of(out)


def _bobs_pid_gives_nothing(broker: BrokerProcess, pid: int, out: Path) -> None:
    r = profile_pid(broker, pid, out)
    assert r.returncode != 0, r.stdout
    assert not out.exists() or out.read_text() == "", out.read_text()
    assert kernel_looking_text(r.stdout + r.stderr) == []


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_debian13_xz_in_a_chroot_reaches_libc_start_main(
    broker: BrokerProcess, debian13_root: Path, inside: Path, out_dir: Path, isolation: str
) -> None:
    argv = ["/usr/bin/xz", "-9", "-k", "-f", "-T1", "-c", f"{INSIDE}/random.bin"]
    out = out_dir / f"xz-{isolation}.folded"
    stacks = profiled_in_chroot(broker, debian13_root, argv, isolation, out)
    user = [(s, n) for s, n in stacks if s[-1] != "[kernel]" or len(s) > 2]
    reached = share(user, lambda s: any(f.startswith("__libc_start_main") for f in s))
    assert reached >= 0.95, stacks


def test_debian13_python_in_a_container_reaches_py_bytes_main(
    broker: BrokerProcess, debian13_root: Path, inside: Path, out_dir: Path
) -> None:
    argv = ["/usr/bin/python3", f"{INSIDE}/loop.py", "30"]
    stacks = profiled_in_chroot(broker, debian13_root, argv, CONTAINER, out_dir / "py.folded")
    assert share(stacks, lambda s: "Py_BytesMain" in s) >= 0.95, stacks

    def tower(frames: list[str]) -> bool:
        return any(len(set(frames[i : i + 8])) == 1 for i in range(len(frames) - 7))

    assert share(stacks, tower) < 0.01, [s for s, _ in stacks if tower(s)][:5]
