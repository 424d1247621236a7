"""What the broker imports at start stays lean (issue 25: every module is idle
RSS for as long as it runs): pyelftools and importlib.metadata (email, zipfile,
csv...) cost ~2.7 MiB together and idle never needs them."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

# What broker.main's run() imports before it serves: the service, both
# listeners and the live-maps iterator's loader.
_START = (
    "import sys, gfxbpf.broker.main, gfxbpf.broker.service, gfxbpf.broker.unix.server, "
    "gfxbpf.broker.grpc.server, gfxbpf.bpf.mapids; "
    "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
    "('elftools', 'email', 'zipfile', 'csv') or m == 'importlib.metadata')))"
)


def test_broker_start_imports_neither_pyelftools_nor_importlib_metadata() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _START], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == []


def test_broker_version_is_the_installed_one() -> None:
    from gfxbpf.broker.service import BROKER_VERSION

    assert BROKER_VERSION == metadata.version("gfxbpf")
