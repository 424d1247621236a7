"""The README's first command works: tools/demo.sh shows live data to an unprivileged user."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_demo_shows_live_syscount_to_an_unprivileged_user() -> None:
    # Undo what the demo sets up, so it has to do it again: its policy, and
    # tracefs (unmounted on a fresh machine).
    Path("/etc/gfxbpf/demo-policy.toml").unlink(missing_ok=True)
    subprocess.run(["umount", "/sys/kernel/tracing"], capture_output=True)
    env = dict(os.environ, GFXBPF_SKIP_INSTALL="1")  # tools/test.sh installed it already
    r = subprocess.run(
        [str(ROOT / "tools" / "demo.sh"), "3"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd="/",
    )
    out = r.stdout
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # The broker held exactly CAP_BPF + CAP_PERFMON.
    for key in ("CapEff", "CapPrm", "CapBnd"):
        assert re.search(rf"^{key}:\s+000000c000000000$", out, re.M), key
    assert re.search(r"^NoNewPrivs:\s+1$", out, re.M)
    # gfxclient watch syscount (run as gfxdemo) showed counts that grew.
    counts = [int(n.replace(",", "")) for n in re.findall(r"^  read\s+([\d,]+)\s", out, re.M)]
    assert len(counts) >= 2 and counts[-1] > counts[0] > 0, counts
    assert "tracepoint i915:i915_vma_bind does not exist on this kernel" in out
    assert "Traceback" not in out + r.stderr
    assert '"op":"stop"' in out  # the broker stopped cleanly and said so
