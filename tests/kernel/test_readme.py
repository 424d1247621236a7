"""The README works as written (issue 24): tools/readme_check.sh runs the
quick start as root, then "Using gfxclient" as the demo's ordinary user in a
login shell (gfxclient from PATH, a profile to SVG), and stops the broker."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_quick_start_then_using_gfxclient_as_written() -> None:
    env = dict(os.environ, GFXBPF_SKIP_INSTALL="1")  # tools/test.sh installed it already
    r = subprocess.run(
        [str(ROOT / "tools" / "readme_check.sh")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd="/",
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert r.stdout.rstrip().endswith("readme_check: OK"), out[-2000:]
    assert "wrote cpu.svg (svg)" in out  # the profile ran as gfxdemo
    assert "Traceback" not in out
    # The check left no broker behind.
    assert not Path("/run/gfxbpf-broker.pid").exists()
