"""Python frames of the CPython builds Debian 12's and 13's own do not cover
(issue 33): Debian unstable's CPython 3.15 in a chroot, and a free-threaded
3.13 ("3.13t", PEP 703) built from Debian 13's python3.13 source with
tools/python_freethreaded.sh. As in test_python_frames.py, gfxclient runs as
gfxtest-alice against the service-like broker, and the interpreter runs as
alice too: each test wants the whole outer -> middle -> inner chain with
inner's file and a line of its body in at least 95% of the samples.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import skip_or_fail
from tests.kernel.brokerenv import ALICE, ROOT, BrokerProcess, ensure_user, policy_for, shared_dir
from tests.kernel.chroots import make_debian13_root, popen_in, remove_root, user_dir_in
from tests.kernel.profiling import profile, share, stacks_of
from tests.kernel.test_python_frames import NESTED, THREADS, chain_at, functions

pytestmark = pytest.mark.kernel

SHARE = 0.95  # issue 33's acceptance
FT_SCRIPT = ROOT / "tools" / "python_freethreaded.sh"
FT_TIMEOUT_S = 1800  # a cold build on two CPUs, after apt-get source


def broker_policy(request: pytest.FixtureRequest) -> str:
    return policy_for(
        {"stackcopy": {"users": [ALICE], "scope": "self", "max_frequency": 999}},
        limits={"map_bytes_per_user": 1 << 30},
    )


def _check(out: Path, script: str, label: str) -> None:
    stacks = stacks_of(out)
    got = share(stacks, chain_at(script))
    print(f"{label}: {got:.3f} of {sum(n for _, n in stacks)} samples")
    worst = sorted(((n, s[-6:]) for s, n in stacks if not chain_at(script)(s)), reverse=True)
    assert got >= SHARE, (got, worst[:3])


@pytest.fixture(scope="module")
def sid_root() -> Iterator[Path]:
    """Debian unstable (minbase + python3.15), made with the cached tarball
    of tools/debian13_rootfs.sh."""
    root = make_debian13_root(suite="sid", include="python3.15")
    try:
        yield root
    finally:
        remove_root(root)


def test_python_3_15_in_a_chroot(broker: BrokerProcess, sid_root: Path) -> None:
    d = user_dir_in(sid_root, ALICE, "gfxbpf-py315")
    (d / "nested.py").write_text(NESTED)
    proc = popen_in(sid_root, ALICE, ["/usr/bin/python3.15", "/tmp/gfxbpf-py315/nested.py"])
    try:
        out = d / "py315.folded"
        summary = profile(broker, out, "--frequency", "499", "--pid", str(proc.pid))
    finally:
        proc.kill()
        proc.wait()
    assert summary["python"]["processes_walked"] == {str(proc.pid): "3.15"}, summary["python"]
    _check(out, "/tmp/gfxbpf-py315/nested.py", "3.15 in a chroot")


@pytest.fixture(scope="module")
def python_ft() -> str:
    """The free-threaded interpreter tools/python_freethreaded.sh built (or
    had in its cache)."""
    try:
        r = subprocess.run([str(FT_SCRIPT)], capture_output=True, text=True, timeout=FT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        skip_or_fail(f"building a free-threaded CPython took over {FT_TIMEOUT_S} s")
        raise
    if r.returncode != 0:
        skip_or_fail(f"cannot build a free-threaded CPython: {r.stderr[-2000:]}")
    return r.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def ft_dir() -> Iterator[Path]:
    d = shared_dir(prefix="gfxbpf-pyft-")
    os.chown(d, *ensure_user(ALICE))
    for name, text in (("nested.py", NESTED), ("threads.py", THREADS)):
        (d / name).write_text(text)
        (d / name).chmod(0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_free_threaded_python_3_13t(broker: BrokerProcess, python_ft: str, ft_dir: Path) -> None:
    out, script = ft_dir / "ft.folded", ft_dir / "nested.py"
    summary = profile(broker, out, "--frequency", "499", "--", python_ft, str(script))
    py = summary["python"]
    named = [i["version"] for i in py["interpreters"] if i["path"] == python_ft]
    assert len(named) == 1 and named[0].startswith("3.13.") and named[0].endswith("t"), py
    assert list(py["processes_walked"].values()) == ["3.13"], py
    _check(out, str(script), "3.13t")


def test_free_threaded_threads_run_at_once_each_with_its_chain(
    broker: BrokerProcess, python_ft: str, ft_dir: Path
) -> None:
    # Without a GIL the two spinning threads run in parallel: each thread
    # state is found from its own thread, and each sample holds its chain.
    out = ft_dir / "ft-threads.folded"
    profile(broker, out, "--frequency", "499", "--", python_ft, str(ft_dir / "threads.py"))
    stacks = stacks_of(out)
    alpha = share(stacks, lambda s: functions(s)[-3:] == ["alpha", "alpha_leaf", "spin"])
    beta = share(stacks, lambda s: functions(s)[-3:] == ["beta", "beta_leaf", "spin"])
    print(f"3.13t threads: alpha {alpha:.3f}, beta {beta:.3f} of {sum(n for _, n in stacks)}")
    assert alpha >= 0.3 and beta >= 0.3 and alpha + beta >= 0.9, (alpha, beta, stacks[:5])
