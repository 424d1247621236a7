"""Shared test fixtures.

Kernel tests need root and the real kernel. Outside CI they skip when those
are missing; in CI (CI=true) a missing prerequisite is a failure, because the
machines CI runs on have every kernel feature these tests need.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
TRACEFS = "/sys/kernel/tracing"


def skip_or_fail(reason: str) -> None:
    """Skip outside CI; fail in CI, where a skipped kernel test hides a broken run."""
    if IN_CI:
        pytest.fail(f"CI=true but kernel test prerequisite missing: {reason}")
    pytest.skip(reason)


def compile_bpf(source: str, directory: Path, name: str = "t") -> Path:
    """Compile BPF C source with clang as the catalog build does; the object's path.

    clang missing: a skip outside CI, a failure in CI (tools/setup.sh installs it).
    """
    clang = shutil.which("clang")
    if clang is None:
        skip_or_fail("clang is not installed (apt-get install clang)")
    src = directory / f"{name}.bpf.c"
    out = directory / f"{name}.bpf.o"
    src.write_text(source)
    r = subprocess.run(
        [clang, "-O2", "-g", "-target", "bpf", "-I/usr/include/x86_64-linux-gnu"]
        + ["-c", src.name, "-o", out.name],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return out


def _ensure_tracefs() -> None:
    if os.path.exists(os.path.join(TRACEFS, "events")):
        return
    # tracefs is not mounted on a fresh machine: tests mount it.
    r = subprocess.run(["mount", "-t", "tracefs", "nodev", TRACEFS], capture_output=True, text=True)
    if r.returncode != 0 or not os.path.exists(os.path.join(TRACEFS, "events")):
        skip_or_fail(f"cannot mount tracefs at {TRACEFS}: {r.stderr.strip()}")


@pytest.fixture(scope="session")
def kernel() -> None:
    """Root on a kernel with bpf(2); tracefs mounted. Use in every kernel test."""
    if os.geteuid() != 0:
        skip_or_fail("kernel tests need root")
    if not os.path.exists("/sys/kernel/btf/vmlinux"):
        skip_or_fail("no /sys/kernel/btf/vmlinux")
    _ensure_tracefs()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Every test under tests/kernel gets the marker and the fixture.
    for item in items:
        if "/tests/kernel/" in str(item.fspath):
            item.add_marker(pytest.mark.kernel)
            if "kernel" not in getattr(item, "fixturenames", []):
                item.fixturenames.insert(0, "kernel")  # type: ignore[attr-defined]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """In CI, a kernel test that skipped (for any reason) is reported as failed:
    the CI machines have every prerequisite, so a skip there hides a broken run."""
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and item.get_closest_marker("kernel") is not None:
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"kernel test skipped in CI (CI=true): {reason}"
