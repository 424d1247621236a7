"""tools/apt_wait.sh: setup.sh waits for another apt or dpkg run's lock, then
goes on; past its timeout it stops with a message that says what to do."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# apt-get that finds the lock held for its first `busy` runs.
FAKE_APT = """#!/bin/sh
n=$(cat "$STATE" 2>/dev/null || echo 0); echo $((n + 1)) > "$STATE"
if [ "$n" -lt "$BUSY" ]; then
    echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 1 (apt-get)" >&2
    exit 100
fi
[ "$1" = -o ] && shift 2
echo "installed $*"
"""


def _run(tmp_path: Path, busy: int, timeout: int) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    apt = bin_dir / "apt-get"
    apt.write_text(FAKE_APT)
    apt.chmod(0o755)
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        STATE=str(tmp_path / "state"),
        BUSY=str(busy),
        GFXBPF_APT_RETRY_SECONDS="0",
        GFXBPF_APT_LOCK_TIMEOUT=str(timeout),
    )
    (tmp_path / "state").unlink(missing_ok=True)
    script = "set -euo pipefail; . tools/apt_wait.sh; apt_get_waiting install -y gcc"
    return subprocess.run(
        ["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_waits_for_the_lock_then_installs(tmp_path: Path) -> None:
    r = _run(tmp_path, busy=2, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "waiting up to 60 s" in r.stdout and "installed install -y gcc" in r.stdout
    assert (tmp_path / "state").read_text().strip() == "3"


def test_gives_up_after_the_timeout_and_says_what_to_do(tmp_path: Path) -> None:
    r = _run(tmp_path, busy=1000, timeout=0)
    assert r.returncode != 0
    assert "held the package lock for 0 s" in r.stderr
    assert "GFXBPF_APT_LOCK_TIMEOUT" in r.stderr


def test_another_failure_is_not_waited_for(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text(
        "#!/bin/sh\necho 'E: Unable to locate package x' >&2\nexit 100\n"
    )
    (bin_dir / "apt-get").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    r = subprocess.run(
        ["bash", "-c", "set -euo pipefail; . tools/apt_wait.sh; apt_get_waiting install x"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode != 0 and "waiting" not in r.stdout
