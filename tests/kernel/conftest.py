"""The kernel tests' shared broker: one per test module.

A module that uses the `broker` fixture says what its broker needs:
`broker_policy(request) -> str`, the policy text (it may ask other fixtures
through request.getfixturevalue), and optionally `BROKER_START` (keyword
arguments for BrokerProcess.start, e.g. {"grpc": False}) and
`BROKER_INSTALL` (files copied where the broker's users can run them).
`slow_broker` is the same broker with every program load 1 s slower.
The broker runs as the service user with only CAP_BPF+CAP_PERFMON
(tests/kernel/brokerenv.py) and must stop cleanly when the module ends.

`debian13_root` (session): the path of a Debian 13 (trixie) userland made
with debootstrap (minbase + python3, xz-utils, gzip) once per test session,
readable by the test users and deleted afterwards; run programs in it with
tests.kernel.chroots.popen_in (see that module).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gfxbpf.broker.instances import LOAD_DELAY_ENV
from tests.kernel.brokerenv import BrokerProcess
from tests.kernel.chroots import make_debian13_root, remove_root


def _module_broker(
    request: pytest.FixtureRequest, env_extra: dict[str, str] | None = None
) -> Iterator[BrokerProcess]:
    module = request.module
    policy = module.broker_policy(request)
    start = getattr(module, "BROKER_START", {})
    b = BrokerProcess.start(policy, env_extra=env_extra, **start)
    try:
        for path in getattr(module, "BROKER_INSTALL", ()):
            b.install(path)
        yield b
    finally:
        code = b.stop()
        assert code == 0, f"the broker exited {code}: {b.stderr()[-4000:]}"


@pytest.fixture(scope="module")
def broker(request: pytest.FixtureRequest) -> Iterator[BrokerProcess]:
    yield from _module_broker(request)


@pytest.fixture(scope="module")
def slow_broker(request: pytest.FixtureRequest) -> Iterator[BrokerProcess]:
    """The module's broker, but every program load takes 1 s longer, as the
    verifier can on a loaded machine: a test that passes with it does not
    race the attach."""
    yield from _module_broker(request, {LOAD_DELAY_ENV: "1.0"})


@pytest.fixture(scope="session")
def debian13_root() -> Iterator[Path]:
    """A Debian 13 userland (another glibc, gcc, python3.13): its root directory."""
    root = make_debian13_root()
    try:
        yield root
    finally:
        remove_root(root)
