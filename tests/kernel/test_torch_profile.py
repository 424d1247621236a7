"""A real PyTorch CPU training loop profiled as a new user would (issue 33).

The broker's policy is what `gfxbpf-admin approve profile` and `approve
stackcopy` write with no options but --users, and gfxclient runs with no
options but its output: the loop (bench/torch_cnn.py: a small CNN fed by a
DataLoader with 2 worker processes, PyTorch 2.13's CPU wheel, which
tools/setup.sh installs into the tests' venv) must come out with whole native
chains under the training step, each with its Python frames, and the step as
one tower of the flame graph.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import skip_or_fail
from tests.kernel.brokerenv import (
    ALICE,
    VENV,
    VENV_PYTHON,
    BrokerProcess,
    ensure_user,
    shared_dir,
)
from tests.kernel.profiling import Stacks, profile, share, stacks_of

pytestmark = pytest.mark.kernel

REPO = Path(__file__).resolve().parents[2]
SECONDS = "12"
STEP = "train_step"
MARKERS = ("[unwind stopped:", "[user stack lost]")


def _function(frame: str) -> str:
    """A Python frame's function, without the '(file:line)' its name carries."""
    return re.sub(r" \(.*:\d+\)$", "", frame)


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    r = subprocess.run([VENV_PYTHON, "-c", "import torch"], capture_output=True, text=True)
    if r.returncode != 0:
        skip_or_fail(f"torch is not installed in {VENV} (tools/test_deps.sh): {r.stderr[-300:]}")
    d = shared_dir(prefix="gfxbpf-torch-")
    os.chown(d, *ensure_user(ALICE))  # alice writes the profile here
    shutil.copy(REPO / "bench" / "torch_cnn.py", d / "train.py")
    (d / "train.py").chmod(0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _default_policy() -> str:
    admin = str(Path(VENV_PYTHON).parent / "gfxbpf-admin")
    entries = [
        subprocess.run(
            [admin, "approve", name, "--users", ALICE], check=True, capture_output=True, text=True
        ).stdout
        for name in ("profile", "stackcopy")
    ]
    return "\n".join(entries)


def _under_step(stacks: Stacks) -> Stacks:
    return [(s, n) for s, n in stacks if any(_function(f) == STEP for f in s)]


def _whole(frames: list[str]) -> bool:
    """The native chain reaches Py_BytesMain with no frame missing."""
    return "Py_BytesMain" in frames and not any(f.startswith(MARKERS) for f in frames)


def test_a_training_loop_has_whole_native_chains_under_its_step(work: Path) -> None:
    out = work / "train.folded"
    with BrokerProcess.start(_default_policy()) as broker:
        summary = profile(broker, out, "--", VENV_PYTHON, str(work / "train.py"), SECONDS)
    assert summary["program"] == "stackcopy" and summary["exit_status"] == 0, summary
    step = _under_step(stacks_of(out))
    # Python frames with file and line in each: the loop's own and the module's.
    assert share(step, lambda s: any(f.startswith("SmallCNN.forward (") for f in s)) > 0.2, step
    whole = share(step, _whole)
    stopped = sorted(((n, s) for s, n in step if not _whole(s)), reverse=True)[:5]
    assert whole >= 0.95, (whole, summary["notes"], stopped)
    # One tower: the samples of the step sit under one path of frames to it
    # (one flame-graph node per function on the way, Py_BytesMain among them),
    # but for the few whose chain was cut (at most the 5% above), which stand
    # apart as slivers under their [unwind stopped: ...] marker.
    paths: dict[tuple[str, ...], int] = {}
    for frames, n in step:
        i = next(i for i, f in enumerate(frames) if _function(f) == STEP)
        key = tuple(_function(f) for f in frames[: i + 1])
        paths[key] = paths.get(key, 0) + n
    tower, weight = max(paths.items(), key=lambda kv: kv[1])
    assert "Py_BytesMain" in tower and all(not f.startswith(MARKERS) for f in tower), tower
    assert weight / sum(paths.values()) >= 0.95, paths
    print(f"{whole:.1%} of {sum(paths.values())} samples under the step whole; its tower "
          f"{weight / sum(paths.values()):.1%}; {len(paths)} paths")  # fmt: skip
